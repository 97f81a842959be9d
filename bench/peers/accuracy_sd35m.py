#!/usr/bin/env python3
"""Which side is off? cdiffusers bf16 / f32 and PyTorch bf16 against an f32 forward of diffusers.

One SD3.5-Medium-width transformer forward (--layers blocks, 512x512 with CFG: batch 2, 1024
image + 333 text tokens, as bench_peers.py's sd35m case) on random weights written by
tools/make-random-pipeline (bf16 values, so every side holds exactly the same weights), the same
inputs for every side. The reference is diffusers 0.42 on PyTorch in f32 (torch_side.py --dtype
f32). Compared against it (relative L2 = ||x - ref|| / ||ref||, and max |x - ref| / max |ref|):

  cdf-bf16      cdiffusers run-model --dtype bf16 (bf16 weights, matmul inputs rounded to bf16,
                f32 accumulation, f32 elsewhere)
  cdf-f32       cdiffusers run-model --dtype f32
  torch-bf16mm  PyTorch f32 with every Linear/Conv input and attention's q, k, v rounded to bf16:
                the rounding cdiffusers' bf16 applies, done by PyTorch: what bf16 rounding alone
                explains
  torch-bf16    PyTorch in bf16 throughout (what diffusers users run with torch_dtype=bfloat16;
                norms, softmax and residual adds in bf16 too; very slow on CPUs without native
                bf16, --no-torch-bf16 skips it)

    python3 bench/peers/accuracy_sd35m.py --build build --work /work/peers/acc --layers 6
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_peers import make_inputs  # noqa: E402


def load_out(py, path):
    """The single output tensor of a safetensors file, as float64 numpy (read by the venv's
    safetensors through a child, so this script needs only numpy)."""
    npy = path + ".npy"
    subprocess.run([py, "-c", "import sys, numpy as np; from safetensors.numpy import load_file; d = load_file(sys.argv[1]); "
                    "assert len(d) == 1, list(d); np.save(sys.argv[2], next(iter(d.values())).astype(np.float32))",
                    path, npy], check=True)
    return np.load(npy).astype(np.float64)


def compare(x, ref):
    d = x - ref
    return dict(rel_l2=float(np.linalg.norm(d) / np.linalg.norm(ref)),
                rel_max=float(np.abs(d).max() / np.abs(ref).max()),
                cos=float((x * ref).sum() / np.linalg.norm(x) / np.linalg.norm(ref)))


def run(cmd, log, env=None):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{open(log).read()[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/cdf-acc")
    ap.add_argument("--python", default="/work/venv/bin/python", help="python with torch + diffusers + safetensors")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="compile", help="cdiffusers execution mode")
    ap.add_argument("--no-torch-bf16", action="store_true")
    ap.add_argument("--sides", default="cdf-bf16,cdf-f32,torch-bf16mm,torch-bf16")
    ap.add_argument("--seed", type=int, default=0, help="make-random-pipeline seed")
    args = ap.parse_args()
    build = args.build if os.path.isabs(args.build) else os.path.join(ROOT, args.build)
    os.makedirs(args.work, exist_ok=True)
    model = f"{args.work}/sd35m_{args.layers}l"
    if not os.path.isfile(f"{model}/transformer/config.json"):
        mrp = f"{build}/make-random-pipeline"
        if not os.access(mrp, os.X_OK):
            subprocess.run(["gcc", "-std=gnu17", "-O2", "-o", mrp, f"{ROOT}/tools/make-random-pipeline/make_random_pipeline.c",
                            "-lm"], check=True)
        shutil.rmtree(model, ignore_errors=True)
        subprocess.run([mrp, "--preset", "sd35-medium", "--set", f"sd3.layers={args.layers}",
                        "--set", f"sd3.dual_layers={min(13, args.layers)}", "--set", f"seed={args.seed}",
                        "--set", "t5.enabled=0", "--set", "clip_l.layers=1", "--set", "clip_g.layers=1",
                        "--out", model, "--tokenizers", f"{ROOT}/tests/data/tokenizers"], check=True, stdout=subprocess.DEVNULL)
    inp = f"{args.work}/in_sd35m.safetensors"
    if not os.path.isfile(inp):
        make_inputs("sd35m", inp)
    tdir = f"{model}/transformer"
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    outs = {}

    def torch_side(dtype):
        o = f"{args.work}/out_torch_{dtype}.safetensors"
        if not os.path.isfile(o):
            run([args.python, f"{HERE}/torch_side.py", "--case", "sd35m", "--model-dir", tdir, "--inputs", inp,
                 "--dtype", dtype, "--mode", "eager", "--threads", str(args.threads), "--warmup", "0", "--repeats", "1",
                 "--save", o], f"{args.work}/log_torch_{dtype}.txt", env)
        return o

    def cdf_side(dtype):
        o = f"{args.work}/out_cdf_{dtype}.safetensors"
        if not os.path.isfile(o):
            run([f"{build}/cdiffusers", "run-model", "--model", tdir, "--inputs", inp, "--output", o, "--force",
                 "--dtype", dtype, "--mode", args.mode, "--threads", str(args.threads)], f"{args.work}/log_cdf_{dtype}.txt", env)
        return o

    ref = load_out(args.python, torch_side("f32"))
    print(f"reference: diffusers f32, output {ref.shape}, rms {np.sqrt((ref ** 2).mean()):.4g}, max |x| {np.abs(ref).max():.4g}")
    res = {}
    for side in args.sides.split(","):
        if side == "torch-bf16" and args.no_torch_bf16:
            continue
        kind, dtype = side.split("-", 1)
        path = cdf_side(dtype) if kind == "cdf" else torch_side(dtype)
        outs[side] = load_out(args.python, path)
        res[side] = compare(outs[side], ref)
        print(f"{side:13s} vs torch-f32: rel L2 {res[side]['rel_l2']:.5f}, rel max {res[side]['rel_max']:.5f}, "
              f"cos {res[side]['cos']:.6f}", flush=True)
    if "cdf-bf16" in outs and "torch-bf16" in outs:
        c = compare(outs["cdf-bf16"], outs["torch-bf16"])
        print(f"cdf-bf16 vs torch-bf16: rel L2 {c['rel_l2']:.5f} (the issue's comparison)")
        res["cdf-bf16_vs_torch-bf16"] = c
    print("RESULT " + json.dumps(dict(layers=args.layers, mode=args.mode, results=res)))


if __name__ == "__main__":
    main()
