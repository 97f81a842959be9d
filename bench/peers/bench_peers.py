#!/usr/bin/env python3
"""cdiffusers against its peers on the CPU, the same work side by side in one run.

Cases (random weights, real widths, batch as a pipeline would run it):
  sd35m  SD3.5-Medium transformer (24 blocks, 13 with dual attention), 512x512 with CFG:
         batch 2, 1024 image + 333 text tokens (77 CLIP + 256 T5, diffusers' default)
  flux   FLUX.1 transformer at its real width (3072, 24 heads) with REDUCED depth:
         2 double-stream + 4 single-stream blocks (FLUX.1-dev has 19 + 38), 512x512,
         1024 image + 512 text tokens, batch 1, guidance embedder on
  vae    AutoencoderKL decode (FLUX.1 / SD3 VAE config: 16 latent channels, 128-256-512-512),
         latent 64x64 -> 512x512 image, batch 1

Sides (--sides; each case runs every side once per round, the order rotating from round to
round so drift in the machine's load does not always favour the same side):
  cdf-bf16, cdf-f32   `cdiffusers run-model --mode compile --dtype bf16|f32 --repeat N+1`: the
                      first forward includes compile, the figure is the median of the other N
  torch-eager         current diffusers on current PyTorch (torch_side.py, run by --python),
                      eager, attention through scaled_dot_product_attention (diffusers' default)
  torch-compile       the same under torch.compile (inductor, freezing on); the first pass
                      (compile) is reported apart
  sdcpp               stable-diffusion.cpp's sd-cli (the shared harness's bench_sdcpp.py) on
                      random-weight single-file checkpoints (make_sdcpp_random_ckpt.py): seconds
                      per sampling step with --cfg-scale 1 = one transformer forward. sd.cpp
                      always feeds SD3 154 text tokens and FLUX 256, and runs SD3 CFG as two
                      batch-1 forwards, so its ratio is taken per FLOP (its own token count's
                      analytic FLOPs); its VAE figure is sd-cli's decode (same VAE
                      architecture, latent of the same size) in the latest sd35m or flux run.
PyTorch runs in its best dtype on this CPU: bf16 where the CPU has native bf16 (avx512_bf16 or
amx_bf16 in /proc/cpuinfo), else f32 (--torch-dtype overrides). Both PyTorch sides load the SAME
random weights and inputs as cdiffusers (the folders tools/make-random-pipeline writes).

Printed: CPU model and flags that matter, cdiffusers' ISA level (`cdiffusers devices`), the
measured instruction peaks of this CPU (peak_main.c: f32 FMA, bf16 dot, AMX where present), and
per case and round every side's seconds, peak RSS, TFLOP/s, % of the peak of the arithmetic it
runs (bf16 products or f32 FMA), the CPU time other processes used meanwhile ("foreign cores")
and every ratio peer s / cdiffusers s.

Nothing is downloaded. --work receives the models (about 7.5 GB, plus 9 GB of sd.cpp files);
delete it when done.

    /work/venv/bin/python bench/peers/bench_peers.py --harness /work/shared/tools/peers --build build \
        --work /work/peers --python /work/venv/bin/python --sd-cli /work/peers/sdcpp/build/bin/sd-cli \
        --cases flux,vae,sd35m --rounds 1 --repeat 1
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))

# make-random-pipeline specs; text encoders are cut to one layer (or left out) since only the
# transformer and VAE folders are used
MODEL_SPECS = {
    "sd35m": ["--preset", "sd35-medium", "--set", "t5.enabled=0", "--set", "clip_l.layers=1", "--set", "clip_g.layers=1"],
    "flux_2d4s": ["--preset", "flux1", "--set", "flux.layers=2", "--set", "flux.single_layers=4", "--set", "t5.layers=1",
                  "--set", "clip_l.layers=1"],
}
FLUX_DOUBLE, FLUX_SINGLE = 2, 4


# ---- analytic FLOPs -----------------------------------------------------------------------------
def vae_decode_flops(lat, channels=(128, 256, 512, 512), layers_per_block=2, latent_ch=16, out_ch=3):
    """Convs (2*H*W*Cout*Cin*k*k), mid-block attention linears and QK^T/PV matmuls of
    AutoencoderKL's decoder; norms, activations and upsampling copies are not counted."""
    def conv(hw, cin, cout, k=3):
        return 2 * hw * hw * cout * cin * k * k

    def resnet(hw, cin, cout):
        return conv(hw, cin, cout) + conv(hw, cout, cout) + (conv(hw, cin, cout, 1) if cin != cout else 0)

    top = channels[-1]
    f = conv(lat, latent_ch, top)                                  # conv_in
    n = lat * lat
    f += 2 * resnet(lat, top, top) + 4 * 2 * n * top * top + 4 * n * n * top  # mid: 2 resnets + attention
    hw, prev = lat, top
    rev = list(reversed(channels))
    for i, c in enumerate(rev):
        for j in range(layers_per_block + 1):
            f += resnet(hw, prev if j == 0 else c, c)
        prev = c
        if i < len(rev) - 1:
            hw *= 2
            f += conv(hw, c, c)                                    # upsampler conv after nearest x2
    f += conv(hw, channels[0], out_ch)                             # conv_out
    return f


# ---- inputs -------------------------------------------------------------------------------------
def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32 only): 8-byte header length, JSON header, raw data."""
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make_inputs(case, path, seed=0, res=512):
    rng = np.random.default_rng(seed)
    if case == "sd35m":
        B, lat, txt = 2, res // 8, 333
        t = dict(hidden_states=rng.standard_normal((B, 16, lat, lat)),
                 encoder_hidden_states=rng.standard_normal((B, txt, 4096)),
                 pooled_projections=rng.standard_normal((B, 2048)),
                 timestep=np.full((B,), 500.0))
    elif case == "flux":
        B, h, txt = 1, res // 16, 512
        ids = np.zeros((h, h, 3))
        ids[..., 1] = np.arange(h)[:, None]
        ids[..., 2] = np.arange(h)[None, :]
        t = dict(hidden_states=rng.standard_normal((B, h * h, 64)),
                 encoder_hidden_states=rng.standard_normal((B, txt, 4096)),
                 pooled_projections=rng.standard_normal((B, 768)),
                 timestep=np.full((B,), 0.5), guidance=np.full((B,), 3.5),
                 img_ids=ids.reshape(-1, 3), txt_ids=np.zeros((txt, 3)))
    else:
        t = dict(z=rng.standard_normal((1, 16, res // 8, res // 8)))
    write_safetensors(path, t)


# ---- running a child and what it cost ---------------------------------------------------------
def busy_seconds():
    """CPU-seconds all processes spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def run_child(cmd, env, log_path):
    """Runs cmd; returns (stdout+stderr text, rc, wall s, peak RSS GiB, foreign cores)."""
    b0, t0 = busy_seconds(), time.perf_counter()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    busy = busy_seconds() - b0
    own = ru.ru_utime + ru.ru_stime
    text = open(log_path).read()
    rc = os.waitstatus_to_exitcode(status)
    return text, rc, wall, ru.ru_maxrss / 1048576, max(0.0, busy - own) / wall, own / wall


def wait_quiet(args, what):
    """Waits (up to --idle-wait s) until other processes use at most --max-foreign cores, judged
    over 3 s windows; returns the last window's figure. The machine is shared: without this a
    side can be measured while a build or a training run takes most of the CPU."""
    t_end = time.time() + args.idle_wait
    while True:
        b0 = busy_seconds()
        time.sleep(3)
        foreign = (busy_seconds() - b0) / 3
        if foreign <= args.max_foreign or time.time() >= t_end:
            if foreign > args.max_foreign:
                print(f"  [{what}] still {foreign:.2f} cores busy after waiting {args.idle_wait} s; measuring anyway", flush=True)
            return foreign
        time.sleep(7)


def measured(args, what, fn):
    """Runs fn() after waiting for a quiet machine; repeats it (up to --retries more times) when
    other processes took more than --max-foreign cores during the run. Returns the quietest try."""
    tries = []
    for _ in range(args.retries + 1):
        wait_quiet(args, what)
        r = fn()
        tries.append(r)
        if r["foreign"] <= args.max_foreign:
            break
        print(f"  [{what}] other processes used {r['foreign']:.2f} cores during the run; "
              f"{'retrying' if len(tries) <= args.retries else 'keeping the quietest try'}", flush=True)
    best = min(tries, key=lambda x: x["foreign"])
    best["tries"] = len(tries)
    return best



def cdf_case(args, case, models, inputs, dtype):
    model_dir = {"sd35m": f"{models}/sd35m/transformer", "flux": f"{models}/flux_2d4s/transformer",
                 "vae": f"{models}/sd35m/vae"}[case]
    out = f"{args.work}/out_{case}_cdf_{dtype}.safetensors"
    cmd = [args.cdiffusers, "run-model", "--model", model_dir, "--inputs", inputs,
           "--output", out, "--force", "--repeat", str(args.repeat + 1),
           "--mode", args.mode, "--dtype", dtype, "--threads", str(args.threads)]
    if case == "vae":
        cmd += ["--method", "decode"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for kv in args.cdf_env:
        k, _, v = kv.partition("=")
        env[k] = v
    log = f"{args.work}/log_cdf_{dtype}_{case}.txt"
    text, rc, wall, rss, foreign, util = run_child(cmd, env, log)
    if rc != 0:
        raise SystemExit(f"cdiffusers failed on {case} (exit {rc}); log: {log}\n{text[-2000:]}")
    ms = [float(x) for x in re.findall(r"forward_ms=([0-9.]+)", text)]
    steady = ms[1:] or ms
    return dict(sec=statistics.median(steady) / 1e3, first_sec=ms[0] / 1e3, all_sec=[m / 1e3 for m in steady],
                rss_gib=rss, wall=wall, foreign=foreign, util=util)


def torch_case(args, case, models, inputs, mode):
    model_dir = {"sd35m": f"{models}/sd35m/transformer", "flux": f"{models}/flux_2d4s/transformer",
                 "vae": f"{models}/sd35m/vae"}[case]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               TORCHINDUCTOR_CACHE_DIR=f"{args.work}/inductor-cache")
    cmd = [args.python, f"{HERE}/torch_side.py", "--case", case, "--model-dir", model_dir, "--inputs", inputs,
           "--dtype", args.torch_dtype, "--mode", mode, "--threads", str(args.threads),
           "--repeats", str(args.torch_repeats), "--warmup", str(1 if mode == "compile" else args.torch_warmup),
           "--save", f"{args.work}/out_{case}_torch_{mode}_{args.torch_dtype}.safetensors"]
    log = f"{args.work}/log_torch_{mode}_{case}.txt"
    text, rc, wall, rss, foreign, util = run_child(cmd, env, log)
    m = re.search(r"^RESULT (.*)$", text, re.M)
    if rc != 0 or not m:
        raise SystemExit(f"PyTorch side failed on {case} (exit {rc}); log: {log}\n{text[-2000:]}")
    rec = json.loads(m.group(1))
    return dict(sec=rec["sec_median"], first_sec=rec["first_sec"], all_sec=rec["sec_all"], rss_gib=rss, wall=wall,
                foreign=foreign, util=util)


SDCPP_TXT = {"sd35m": 154, "flux": 256}


def sdcpp_ckpt(args):
    """Random-weight sd.cpp files (dit/clip_l[/clip_g]/vae), written once by the harness's writer
    from its lists of the tensors sd.cpp 97d2990 requests."""
    out = {}
    for arch, exp in (("sd35m", "expected_sd35m.tsv"), ("flux", "expected_flux_2d4s.tsv")):
        if arch not in args.cases.split(","):
            continue
        d = f"{args.work}/sdcpp_{arch}_{args.sdcpp_dtype}"
        if not os.path.isfile(f"{d}/.done"):
            print(f"[setup] writing random sd.cpp {arch} {args.sdcpp_dtype} files into {d}", flush=True)
            subprocess.run([args.python, f"{args.harness}/make_sdcpp_random_ckpt.py", "full", "--arch", arch,
                            "--dtype", args.sdcpp_dtype, "--expected", f"{args.harness}/expected/{exp}",
                            "--outdir", d], check=True, stdout=subprocess.DEVNULL)
            open(f"{d}/.done", "w").close()
        out[arch] = d
    return out


def sdcpp_case(args, case, ckpts):
    """One sd-cli run: --steps 1+repeat at --res, --cfg-scale 1 (one forward per step); the
    first step (graph allocation) is not counted. Returns per-forward seconds and the VAE
    decode seconds of the same run."""
    arch = "sd35m" if case in ("sd35m", "vae") else "flux"
    cmd = [args.python, f"{args.harness}/bench_sdcpp.py", "--sd-cli", args.sd_cli, "--ckpt-dir", ckpts[arch],
           "--arch", arch, "--res", str(args.res), "--threads", str(args.threads), "--steps", str(1 + max(1, args.repeat)),
           "--label", args.sdcpp_dtype, "--keep-logs", f"{args.work}/sdcpp-logs"]
    log = f"{args.work}/log_sdcpp_{arch}.txt"
    text, rc, wall, rss, foreign, util = run_child(cmd, dict(os.environ), log)
    m = re.search(r"^RESULT (.*)$", text, re.M)
    if not m:
        raise SystemExit(f"sd.cpp side failed on {case}; log: {log}\n{text[-2000:]}")
    rec = json.loads(m.group(1))
    if rec["rc"] != 0 or not rec.get("sec_per_forward"):
        raise SystemExit(f"sd-cli failed on {case} (exit {rec['rc']}); logs in {args.work}/sdcpp-logs\n{text[-2000:]}")
    steps = [v for k, v in sorted(rec["step_sec_all"].items(), key=lambda kv: int(kv[0])) if int(k) > 1]
    return dict(sec=rec["sec_per_forward"], all_sec=steps, decode_sec=rec.get("decode_sec"),
                flops=rec["flops_per_forward"], txt=rec["text_tokens"], rss_gib=rss, wall=wall,
                foreign=rec["foreign_cpu_cores_whole_run"], util=util)


def case_flops(case, harness, res=512):
    sys.path.insert(0, harness)
    import dit_flops
    img = (res // 16) ** 2
    if case == "sd35m":
        return sum(dit_flops.sd35m_flops(img, 333, 2))
    if case == "flux":
        return sum(dit_flops.flux_flops(img, 512, 1, n_double=FLUX_DOUBLE, n_single=FLUX_SINGLE))
    return vae_decode_flops(res // 8)


def label(case, res):
    img = (res // 16) ** 2
    return {"sd35m": f"SD3.5-M transformer, {res}², CFG (B=2, {img}+333 tokens)",
            "flux": f"FLUX.1 width, 2 double + 4 single blocks, {res}² ({img}+512 tokens)",
            "vae": f"AutoencoderKL decode {res // 8}² latent -> {res}²"}[case]


def cpu_info():
    model, flags = "?", set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    return model, flags


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harness", required=True,
                    help="the shared peer harness folder (dit_flops.py, bench_sdcpp.py, make_sdcpp_random_ckpt.py, expected/)")
    ap.add_argument("--build", default="build", help="cdiffusers build dir (cdiffusers; make-random-pipeline is built there)")
    ap.add_argument("--work", default="/tmp/cdf-peers", help="random-weight models, inputs, logs, outputs")
    ap.add_argument("--cases", default="sd35m,flux,vae")
    ap.add_argument("--sides", default="cdf-bf16,cdf-f32,torch-eager,torch-compile,sdcpp")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over all sides per case")
    ap.add_argument("--repeat", type=int, default=1,
                    help="steady-state forwards of cdiffusers (after the compile one) and sd.cpp steps (after the first)")
    ap.add_argument("--torch-repeats", type=int, default=1, help="PyTorch timed passes")
    ap.add_argument("--torch-warmup", type=int, default=1, help="PyTorch eager warmup passes (compile always has one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--res", type=int, default=512, help="image side (the issue's cases: 512)")
    ap.add_argument("--mode", default="compile", help="cdiffusers execution mode (compile, fuse, eager)")
    ap.add_argument("--cdf-env", action="append", default=[], metavar="K=V",
                    help="environment for the cdiffusers runs, e.g. CDIFFUSERS_ISA=avx2 (repeatable)")
    ap.add_argument("--python", default="/work/venv/bin/python", help="python with current torch + diffusers")
    ap.add_argument("--torch-dtype", choices=["auto", "f32", "bf16"], default="auto",
                    help="auto: bf16 where the CPU has avx512_bf16 or amx_bf16, else f32")
    ap.add_argument("--sd-cli", default=None, help="stable-diffusion.cpp's sd-cli (built from its public source)")
    ap.add_argument("--sdcpp-dtype", choices=["auto", "bf16", "f16"], default="auto",
                    help="auto: bf16 where the CPU has avx512_bf16, else f16 (F16C)")
    ap.add_argument("--out", default=None, help="append the per-round records as JSON lines")
    ap.add_argument("--max-foreign", type=float, default=0.4,
                    help="CPU cores other processes may use before/while a side is measured (default 0.4)")
    ap.add_argument("--idle-wait", type=int, default=300, help="longest wait (s) for a quiet machine before each side")
    ap.add_argument("--retries", type=int, default=1, help="re-runs of a side measured while others used > --max-foreign")
    args = ap.parse_args()

    build = args.build if os.path.isabs(args.build) else os.path.join(ROOT, args.build)
    args.cdiffusers = os.path.join(build, "cdiffusers")
    if not os.access(args.cdiffusers, os.X_OK):
        raise SystemExit(f"{args.cdiffusers} not built (cmake --build {build} --target cdiffusers_cli)")
    args.harness = os.path.abspath(args.harness)
    for f in (f"{args.harness}/dit_flops.py", f"{args.harness}/bench_sdcpp.py", f"{args.harness}/make_sdcpp_random_ckpt.py"):
        if not os.path.isfile(f):
            raise SystemExit(f"missing {f} (check --harness)")
    sides = args.sides.split(",")
    for s in sides:
        if s not in ("cdf-bf16", "cdf-f32", "torch-eager", "torch-compile", "sdcpp"):
            raise SystemExit(f"unknown side {s}")
    if "sdcpp" in sides and not (args.sd_cli and os.access(args.sd_cli, os.X_OK)):
        raise SystemExit("--sd-cli (an executable sd-cli) is needed for the sdcpp side")
    os.makedirs(args.work, exist_ok=True)
    models = f"{args.work}/models"
    cases = args.cases.split(",")

    cpu, flags = cpu_info()
    native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    if args.torch_dtype == "auto":
        args.torch_dtype = "bf16" if native_bf16 else "f32"
    if args.sdcpp_dtype == "auto":
        args.sdcpp_dtype = "bf16" if "avx512_bf16" in flags else "f16"

    # random-weight models (regenerated only when the spec changes)
    mrp = os.path.join(build, "make-random-pipeline")
    need = {"sd35m"} if ("sd35m" in cases or "vae" in cases) else set()
    if "flux" in cases:
        need.add("flux_2d4s")
    for name in sorted(need):
        d, spec = f"{models}/{name}", " ".join(MODEL_SPECS[name])
        if os.path.isfile(f"{d}/model_index.json") and open(f"{d}/.spec").read() == spec:
            continue
        if not os.access(mrp, os.X_OK):
            subprocess.run(["gcc", "-std=gnu17", "-O2", "-o", mrp, f"{ROOT}/tools/make-random-pipeline/make_random_pipeline.c",
                            "-lm"], check=True)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(models, exist_ok=True)  # make-random-pipeline makes only the last level
        print(f"[setup] writing random {name} into {d}", flush=True)
        subprocess.run([mrp] + MODEL_SPECS[name] + ["--out", d, "--tokenizers", f"{ROOT}/tests/data/tokenizers"], check=True,
                       stdout=subprocess.DEVNULL)
        for te in ("text_encoder", "text_encoder_2", "text_encoder_3"):  # not used here
            shutil.rmtree(f"{d}/{te}", ignore_errors=True)
        open(f"{d}/.spec", "w").write(spec)
    ckpts = sdcpp_ckpt(args) if "sdcpp" in sides else {}

    # what the machine is and what cdiffusers makes of it
    dev = subprocess.run([args.cdiffusers, "devices"], capture_output=True, text=True).stdout
    m = re.search(r"isa=(\S+)", dev)
    isa = m.group(1) if m else "?"
    for kv in args.cdf_env:
        if kv.startswith("CDIFFUSERS_ISA="):
            isa += f" (capped by {kv})"
    peak_bin = f"{args.work}/peak"
    subprocess.run(["gcc", "-O2", "-fopenmp", "-o", peak_bin, f"{HERE}/peak_main.c", f"{ROOT}/bench/kernels/peak.c"], check=True)
    wait_quiet(args, "peaks")
    peaks = json.loads(subprocess.run([peak_bin, str(args.threads)], capture_output=True, text=True, check=True).stdout)
    fma_key = "f32_fma_avx512" if "f32_fma_avx512" in peaks else "f32_fma_avx2"
    cdf_cap = next((kv.split("=", 1)[1] for kv in args.cdf_env if kv.startswith("CDIFFUSERS_ISA=")), None)
    torch_cap = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()

    def peak_key(side):
        """The measured peak of the arithmetic a side runs: bf16 products (AMX tiles, else
        vdpbf16ps) where it computes in bf16 and the CPU has them, else f32 FMA (AVX2 where the
        side is capped to it: CDIFFUSERS_ISA in --cdf-env, ATEN_CPU_CAPABILITY for PyTorch).
        A figure over 100% means the side used something faster."""
        if side.startswith("cdf-"):
            bf16, avx2_cap = side == "cdf-bf16" and cdf_cap in (None, "avx512_bf16"), cdf_cap in ("avx2", "generic")
        elif side.startswith("torch-"):
            bf16, avx2_cap = args.torch_dtype == "bf16", torch_cap == "avx2"
        else:
            bf16, avx2_cap = args.sdcpp_dtype == "bf16", False
        for k in (("amx_bf16", "bf16_dot_avx512bf16") if bf16 else ()):
            if k in peaks:
                return k
        return "f32_fma_avx2" if avx2_cap and "f32_fma_avx2" in peaks else fma_key

    def peak_flops(key):
        return peaks[key]["gflops_1thread"] * args.threads * 1e9  # per-thread best x threads
    print(f"machine: {cpu}, {os.cpu_count()} CPUs; native bf16: {'yes' if native_bf16 else 'no'} "
          f"(avx512_bf16 {'avx512_bf16' in flags}, amx_bf16 {'amx_bf16' in flags}); threads per side: {args.threads}; "
          f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load before: {os.getloadavg()}", flush=True)
    print(f"cdiffusers: ISA level {isa}; {args.cdiffusers} --mode {args.mode}; env {args.cdf_env or 'default'}", flush=True)
    print(f"PyTorch dtype: {args.torch_dtype}; python {args.python}; sd.cpp weights: {args.sdcpp_dtype}", flush=True)
    print(f"measured peaks (GFLOP/s, best single thread / {args.threads} threads at once, under the current load): "
          f"{json.dumps(peaks)}", flush=True)

    results = {c: [] for c in cases}
    out_f = open(args.out, "a") if args.out else None
    sdcpp_decode = None  # sd-cli's VAE decode in the latest transformer run (the vae case's sd.cpp figure)
    for r in range(args.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for case in cases:
            inp = f"{args.work}/in_{case}_{args.res}.safetensors"
            if not os.path.isfile(inp):
                make_inputs(case, inp, res=args.res)
            flops = case_flops(case, args.harness, args.res)
            row = {}
            for side in order:
                what = f"{case} {side}"
                if side.startswith("cdf-"):
                    x = measured(args, what, lambda: cdf_case(args, case, models, inp, side[4:]))
                elif side.startswith("torch-"):
                    x = measured(args, what, lambda: torch_case(args, case, models, inp, side[6:]))
                elif case == "vae":
                    if sdcpp_decode is None or not sdcpp_decode.get("decode_sec"):
                        print(f"  [{what}] no sd.cpp transformer run yet: its decode figure comes from such a run "
                              f"(list sd35m or flux before vae)", flush=True)
                        continue
                    x = dict(sdcpp_decode, sec=sdcpp_decode["decode_sec"], all_sec=[sdcpp_decode["decode_sec"]],
                             flops=flops, tries=sdcpp_decode["tries"])
                else:
                    x = measured(args, what, lambda: sdcpp_case(args, case, ckpts))
                    sdcpp_decode = x  # SD3 and FLUX.1 share the VAE architecture (16 latent channels)
                fl = x.get("flops", flops)
                x["tflops"] = fl / x["sec"] / 1e12
                x["peak_key"] = peak_key(side)
                x["pct_peak"] = 100 * fl / x["sec"] / peak_flops(x["peak_key"])
                row[side] = x
                first = f", first {x['first_sec']:.2f} s" if "first_sec" in x else ""
                tok = f", {x['txt']} text tokens, {fl / 1e9:.0f} GFLOP" if side == "sdcpp" and case != "vae" else ""
                print(f"[round {r + 1}] {case} {side}: {x['sec']:.3f} s{first} (all {[round(v, 3) for v in x['all_sec']]}"
                      f"{tok}), peak RSS {x['rss_gib']:.2f} GiB, {x['tflops']:.3f} TFLOP/s = {x['pct_peak']:.0f}% of the "
                      f"{x['peak_key']} peak, foreign cores {x['foreign']:.2f} (try {x['tries']})", flush=True)
            ratios = {}
            for base in ("cdf-bf16", "cdf-f32"):
                if base not in row:
                    continue
                for side, x in row.items():
                    if side.startswith("cdf-") and side <= base:
                        continue
                    # per FLOP: sd.cpp runs its own token count; for the others flops is the same
                    ratios[f"{side}/{base}"] = (x["sec"] * flops / x.get("flops", flops)) / row[base]["sec"]
            print(f"[round {r + 1}] {case} ratios (peer s / cdiffusers s; sd.cpp per FLOP): "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()), flush=True)
            rec = dict(round=r + 1, case=case, flops=flops, loadavg=os.getloadavg(), cpu=cpu, isa=isa, peaks=peaks,
                       torch_dtype=args.torch_dtype, sdcpp_dtype=args.sdcpp_dtype, sides=row, ratios=ratios)
            results[case].append(rec)
            if out_f:
                out_f.write(json.dumps(rec) + "\n")
                out_f.flush()

    print()
    cols = [s for s in sides]
    print("| case | GFLOP | " + " | ".join(f"{s} s" for s in cols) + " | ratios per round (peer s / cdiffusers s) | "
          + "TFLOP/s (% of the side's peak: " + ", ".join(sorted({peak_key(s) for s in cols})) + ") "
          + " / ".join(cols) + " | peak RSS GiB " + " / ".join(cols)
          + " | foreign cores " + " / ".join(cols) + " |")
    print("|---" * (6 + len(cols)) + "|")
    for case in cases:
        rs = results[case]
        if not rs:
            continue
        def med(side, key="sec"):
            v = [x["sides"][side][key] for x in rs if side in x["sides"]]
            return statistics.median(v) if v else None
        secs = " | ".join("%.2f" % med(s) if med(s) is not None else "-" for s in cols)
        ratios = "; ".join(", ".join(f"{k} {v:.2f}x" for k, v in x["ratios"].items()) for x in rs)
        tf = " / ".join("%.3f (%.0f%%)" % (med(s, "tflops"), med(s, "pct_peak")) if med(s) is not None else "-" for s in cols)
        rss = " / ".join("%.2f" % max(x["sides"][s]["rss_gib"] for x in rs if s in x["sides"]) if med(s) is not None else "-"
                         for s in cols)
        fc = " / ".join(",".join("%.1f" % x["sides"][s]["foreign"] for x in rs if s in x["sides"]) or "-" for s in cols)
        print(f"| {label(case, args.res)} | {rs[0]['flops'] / 1e9:.0f} | {secs} | {ratios} | {tf} | {rss} | {fc} |")
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
