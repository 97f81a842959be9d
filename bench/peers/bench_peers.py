#!/usr/bin/env python3
"""cdiffusers against diffusers on PyTorch (CPU), the same work side by side in one run.

Cases (random weights, real widths, bf16, batch as a pipeline would run it):
  sd35m  SD3.5-Medium transformer (24 blocks, 13 with dual attention), 512x512 with CFG:
         batch 2, 1024 image + 333 text tokens (77 CLIP + 256 T5, diffusers' default)
  flux   FLUX.1 transformer at its real width (3072, 24 heads) with REDUCED depth:
         2 double-stream + 4 single-stream blocks (FLUX.1-dev has 19 + 38), 512x512,
         1024 image + 512 text tokens, batch 1, guidance embedder on
  vae    AutoencoderKL decode (FLUX.1 / SD3 VAE config: 16 latent channels, 128-256-512-512),
         latent 64x64 -> 512x512 image, batch 1

The two sides are interleaved (cdiffusers, then PyTorch, per case, per round) on the same
machine, so each round gives a same-run ratio even when other processes load the machine; the
CPU time other processes used during each measurement is printed ("foreign cores").

cdiffusers side: `cdiffusers run-model --mode compile --dtype bf16 --repeat N`; the first
forward_ms line includes compile, the steady state is the median of the others.
PyTorch side: the shared harness (`bench_diffusers_dit.py` from --harness, median of its timed
passes after one warmup) for the transformers, `diffusers_vae.py` (next to this file) for the VAE.
Both sides are charged the same FLOP count (dit_flops.py from the harness; the VAE count is
analytic here and checked against the hook count of the PyTorch run).

Nothing is downloaded. The random-weight component folders are written by
tools/make-random-pipeline into --work (about 7.5 GB; delete them when done).

    /usr/bin/python3 bench/peers/bench_peers.py --diffusers-src /work/peers/diffusers/src \
        --harness /work/shared/tools/peers --build build-peers --work /work/peers --rounds 2
"""
import argparse
import json
import os
import re
import resource
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


def make_inputs(case, path, seed=0):
    rng = np.random.default_rng(seed)
    if case == "sd35m":
        B, lat, txt = 2, 64, 333
        t = dict(hidden_states=rng.standard_normal((B, 16, lat, lat)),
                 encoder_hidden_states=rng.standard_normal((B, txt, 4096)),
                 pooled_projections=rng.standard_normal((B, 2048)),
                 timestep=np.full((B,), 500.0))
    elif case == "flux":
        B, h, txt = 1, 32, 512
        ids = np.zeros((h, h, 3))
        ids[..., 1] = np.arange(h)[:, None]
        ids[..., 2] = np.arange(h)[None, :]
        t = dict(hidden_states=rng.standard_normal((B, h * h, 64)),
                 encoder_hidden_states=rng.standard_normal((B, txt, 4096)),
                 pooled_projections=rng.standard_normal((B, 768)),
                 timestep=np.full((B,), 0.5), guidance=np.full((B,), 3.5),
                 img_ids=ids.reshape(-1, 3), txt_ids=np.zeros((txt, 3)))
    else:
        t = dict(z=rng.standard_normal((1, 16, 64, 64)))
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


def cdf_case(args, case, models, inputs):
    model_dir = {"sd35m": f"{models}/sd35m/transformer", "flux": f"{models}/flux_2d4s/transformer",
                 "vae": f"{models}/sd35m/vae"}[case]
    cmd = [args.cdiffusers, "run-model", "--model", model_dir, "--inputs", inputs,
           "--output", f"{args.work}/out_{case}.safetensors", "--force", "--repeat", str(args.repeat + 1),
           "--mode", args.mode, "--dtype", "bf16", "--threads", str(args.threads)]
    if case == "vae":
        cmd += ["--method", "decode"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for kv in args.cdf_env:
        k, _, v = kv.partition("=")
        env[k] = v
    text, rc, wall, rss, foreign, util = run_child(cmd, env, f"{args.work}/log_cdf_{case}.txt")
    if rc != 0:
        raise SystemExit(f"cdiffusers failed on {case} (exit {rc}); log: {args.work}/log_cdf_{case}.txt\n{text[-2000:]}")
    ms = [float(x) for x in re.findall(r"forward_ms=([0-9.]+)", text)]
    return dict(sec=statistics.median(ms[1:]) / 1e3, first_sec=ms[0] / 1e3, all_sec=[m / 1e3 for m in ms[1:]],
                rss_gib=rss, wall=wall, foreign=foreign, util=util)


def torch_case(args, case, shim):
    env = dict(os.environ, PYTHONPATH=shim + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
               # the harness's "tuned" malloc setting (faster for PyTorch: no mmap/munmap per tensor)
               MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="100000000000")
    common = ["--diffusers-src", args.diffusers_src, "--threads", str(args.threads), "--repeats", str(args.torch_repeats)]
    if case == "vae":
        cmd = [args.python, f"{HERE}/diffusers_vae.py", "--harness", args.harness, "--res", "512"] + common
    else:
        cmd = [args.python, f"{args.harness}/bench_diffusers_dit.py", "--model", case, "--dtype", "bf16", "--res", "512"]
        cmd += ["--batch", "2", "--text-len", "333"] if case == "sd35m" else \
               ["--batch", "1", "--text-len", "512", "--flux-double", str(FLUX_DOUBLE), "--flux-single", str(FLUX_SINGLE)]
        cmd += common
    text, rc, wall, rss, foreign, util = run_child(cmd, env, f"{args.work}/log_torch_{case}.txt")
    m = re.search(r"^RESULT (.*)$", text, re.M)
    if rc != 0 or not m:
        raise SystemExit(f"PyTorch side failed on {case} (exit {rc}); log: {args.work}/log_torch_{case}.txt\n{text[-2000:]}")
    rec = json.loads(m.group(1))
    return dict(sec=rec["sec_median"], all_sec=rec.get("sec_all"), rss_gib=rss, wall=wall, foreign=foreign, util=util,
                rec=rec)


def case_flops(case, harness):
    sys.path.insert(0, harness)
    import dit_flops
    if case == "sd35m":
        return sum(dit_flops.sd35m_flops(1024, 333, 2))
    if case == "flux":
        return sum(dit_flops.flux_flops(1024, 512, 1, n_double=FLUX_DOUBLE, n_single=FLUX_SINGLE))
    return vae_decode_flops(64)


LABELS = {"sd35m": "SD3.5-M transformer, 512², CFG (B=2, 1024+333 tokens)",
          "flux": "FLUX.1 width, 2 double + 4 single blocks, 512² (1024+512 tokens)",
          "vae": "AutoencoderKL decode 64² latent -> 512²"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers-src", required=True, help="a diffusers checkout's src/ directory (never downloaded)")
    ap.add_argument("--harness", required=True, help="the shared peer harness folder (bench_diffusers_dit.py, dit_flops.py)")
    ap.add_argument("--build", default="build", help="cdiffusers build dir (cdiffusers; make-random-pipeline is built there)")
    ap.add_argument("--work", default="/tmp/cdf-peers", help="random-weight models, inputs, logs (~7.5 GB)")
    ap.add_argument("--cases", default="sd35m,flux,vae")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (cdiffusers, PyTorch) per case")
    ap.add_argument("--repeat", type=int, default=3, help="cdiffusers steady-state forwards (after the compile one)")
    ap.add_argument("--torch-repeats", type=int, default=3, help="PyTorch timed passes (after one warmup)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="compile", help="cdiffusers execution mode (compile, fuse, eager)")
    ap.add_argument("--cdf-env", action="append", default=[], metavar="K=V",
                    help="environment for the cdiffusers runs, e.g. CDIFFUSERS_KERNELS=fast (repeatable)")
    ap.add_argument("--python", default="/usr/bin/python3", help="python with torch (Debian's python3-torch 1.13)")
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
    args.diffusers_src = os.path.abspath(args.diffusers_src)
    for f in (f"{args.harness}/bench_diffusers_dit.py", f"{args.harness}/torch113_compat.py", f"{args.harness}/dit_flops.py",
              f"{args.diffusers_src}/diffusers/models/transformers/transformer_sd3.py"):
        if not os.path.isfile(f):
            raise SystemExit(f"missing {f} (check --harness / --diffusers-src)")
    os.makedirs(args.work, exist_ok=True)
    models = f"{args.work}/models"
    cases = args.cases.split(",")

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
        print(f"[setup] writing random {name} into {d}", flush=True)
        subprocess.run([mrp] + MODEL_SPECS[name] + ["--out", d, "--tokenizers", f"{ROOT}/tests/data/tokenizers"], check=True,
                       stdout=subprocess.DEVNULL)
        for te in ("text_encoder", "text_encoder_2", "text_encoder_3"):  # not used here
            shutil.rmtree(f"{d}/{te}", ignore_errors=True)
        open(f"{d}/.spec", "w").write(spec)

    # diffusers checks that 'filelock' is installed (package metadata only; it is never imported
    # by the model code); Debian's python has no filelock, so give the child a metadata stub
    shim = f"{args.work}/pyshim"
    os.makedirs(f"{shim}/filelock-0.0.0.dist-info", exist_ok=True)
    with open(f"{shim}/filelock-0.0.0.dist-info/METADATA", "w") as f:
        f.write("Metadata-Version: 2.1\nName: filelock\nVersion: 0.0.0\n")

    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"machine: {cpu}, {os.cpu_count()} CPUs; threads per side: {args.threads}; date: "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load before: {os.getloadavg()}", flush=True)
    print(f"cdiffusers: {args.cdiffusers} --mode {args.mode} --dtype bf16; env {args.cdf_env or 'default'}", flush=True)

    results = {c: [] for c in cases}
    out_f = open(args.out, "a") if args.out else None
    for r in range(args.rounds):
        for case in cases:
            inp = f"{args.work}/in_{case}.safetensors"
            if not os.path.isfile(inp):
                make_inputs(case, inp)
            flops = case_flops(case, args.harness)
            c = measured(args, f"{case} cdiffusers", lambda: cdf_case(args, case, models, inp))
            print(f"[round {r + 1}] {case} cdiffusers: {c['sec']:.3f} s steady (first incl. compile {c['first_sec']:.2f} s; "
                  f"all {[round(x, 3) for x in c['all_sec']]}), peak RSS {c['rss_gib']:.2f} GiB, "
                  f"{flops / c['sec'] / 1e12:.3f} TFLOP/s, foreign cores {c['foreign']:.2f} (try {c['tries']})", flush=True)
            t = measured(args, f"{case} PyTorch", lambda: torch_case(args, case, shim))
            extra = ""
            if case == "vae":
                hooked = t["rec"]["flops_hooked"]
                extra = f", hooked FLOPs {hooked / 1e9:.1f} G vs analytic {flops / 1e9:.1f} G"
            print(f"[round {r + 1}] {case} PyTorch:    {t['sec']:.3f} s (all {[round(x, 3) for x in t['all_sec'] or []]}), "
                  f"peak RSS {t['rss_gib']:.2f} GiB, {flops / t['sec'] / 1e12:.3f} TFLOP/s, foreign cores "
                  f"{t['foreign']:.2f} (try {t['tries']}){extra}; ratio PyTorch/cdiffusers {t['sec'] / c['sec']:.2f}x", flush=True)
            rec = dict(round=r + 1, case=case, flops=flops, loadavg=os.getloadavg(), cdiffusers=c,
                       torch={k: v for k, v in t.items() if k != "rec"}, torch_record=t["rec"])
            results[case].append(rec)
            if out_f:
                out_f.write(json.dumps(rec) + "\n")
                out_f.flush()

    print()
    print("| case | GFLOP | cdiffusers s | PyTorch s | speed-up (PyTorch s / cdiffusers s) per round | "
          "cdiffusers TFLOP/s | PyTorch TFLOP/s | peak RSS GiB cdf / torch | foreign cores cdf / torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        rs = results[case]
        if not rs:
            continue
        cs = statistics.median(x["cdiffusers"]["sec"] for x in rs)
        ts = statistics.median(x["torch"]["sec"] for x in rs)
        ratios = ", ".join(f"{x['torch']['sec'] / x['cdiffusers']['sec']:.2f}x" for x in rs)
        fl = rs[0]["flops"]
        fc = "/".join("%.1f" % x["cdiffusers"]["foreign"] for x in rs)
        ft = "/".join("%.1f" % x["torch"]["foreign"] for x in rs)
        print(f"| {LABELS[case]} | {fl / 1e9:.0f} | {cs:.2f} | {ts:.2f} | {ratios} | {fl / cs / 1e12:.3f} | {fl / ts / 1e12:.3f} | "
              f"{max(x['cdiffusers']['rss_gib'] for x in rs):.2f} / {max(x['torch']['rss_gib'] for x in rs):.2f} | "
              f"{fc} / {ft} |")
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
