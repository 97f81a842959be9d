#!/usr/bin/env python3
"""Groups a flat `perf report` of a cdiffusers run into kernel classes.

    perf report -i perf.data --no-children --sort dso,sym --stdio | python3 profile_summary.py

Prints the top symbols and a table of shares per class: matmul (oneDNN JIT brgemm/gemm and
its reorders), attention (cdf_k_attention*), elementwise / activations, norms, libm
calls (tanhf/expm1f of GELU-tanh, expf of SiLU / the reference attention's softmax),
OpenMP runtime (barrier spin / wake-up: idle threads, inflated when the machine is loaded),
bf16 rounding / copies / conversion, kernel. `load_block` and `run_block` are counted as
elementwise: in a steady forward they are the fused elementwise kernel's (static functions of
the same names load SD3 weights and walk FLUX's blocks on the host, negligible there).
"""
import re
import sys

CLASSES = [
    # the own GEMMs (gemm_vdpbf16.c: vdpbf16ps / AMX micro-kernels, the slab fills; gemm_bf16w.c:
    # the AVX2 level's micro-kernel and its driver); before oneDNN's class, whose "gemm" would take
    # cdf_k_gemm_*, and before the OpenMP class: their parallel regions' outlined bodies are named
    # *._omp_fn.N
    ("matmul (own GEMM)", re.compile(r"^amx_(run|slab|pack_a)|^qg_|^fill_bf16|^cdf_k_vdp_run|^q8_fill"
                                     r"|^ukernel_avx2|^cdf_k_gemm_(bf16w|vdp)")),
    ("matmul (oneDNN JIT)", re.compile(r"jit_brgemm|brgemm|gemm|jit_uni_reorder|jit_avx512.*(conv|gemm)|dnnl")),
    ("attention", re.compile(r"attention|flash|online_softmax|^(block|chunk|tile|pack_span|softmax)_(avx512bf16|avx512|avx2|amx)")),
    ("libm tanhf/expm1f (GELU-tanh; glibc's tanhf calls expm1f)", re.compile(r"^__(expm1f|tanhf)|tanhf@plt|expm1f@plt")),
    ("libm expf", re.compile(r"^__expf|expf@plt")),
    # norm_fast.c's lane transposes and row body
    ("norms", re.compile(r"norm|^(load|store)_lanes|^lane_(sum|cascade)")),
    ("elementwise / activations", re.compile(r"elementwise|unary|binary|gelu|silu|modulat|rope|softmax|^(load|run)_block")),
    ("bf16 rounding / copies / conversion", re.compile(r"round|copy|memmove|memcpy|convert|bf16|contiguous|permute|transpose|memset")),
    ("OpenMP runtime (spin/wake)", re.compile(r"libgomp|gomp|omp_")),
]


def classify(dso, sym):
    if dso.startswith("[kernel"):
        return "kernel (page faults, scheduling)"
    if dso.startswith("[JIT]") or "dnnl" in dso:
        return "matmul (oneDNN JIT)"
    key = sym if "libgomp" not in dso else "libgomp " + sym
    for name, rx in CLASSES:
        if rx.search(key):
            return name
    return "other"


def main():
    rows = []
    for line in sys.stdin:
        m = re.match(r"\s*([0-9.]+)%\s+(\S+(?: tid \d+)?)\s+\[[.k]\]\s+(.*)$", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3).strip()))
    if not rows:
        raise SystemExit("no samples parsed (expected `perf report --no-children --sort dso,sym --stdio`)")
    print("top symbols:")
    for pct, dso, sym in rows[:15]:
        print(f"  {pct:6.2f}%  {dso:24s} {sym}")
    share = {}
    for pct, dso, sym in rows:
        c = classify(dso, sym)
        share[c] = share.get(c, 0.0) + pct
    print("\n| class | share of samples |\n|---|---|")
    for c, p in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"| {c} | {p:.1f}% |")


if __name__ == "__main__":
    main()
