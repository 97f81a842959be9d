#!/usr/bin/env python3
"""Golden components and pipelines on a device, for scripts/device-check.sh (never run by CI).

Runs `cdiffusers run-model` on the golden components (tests/data/golden, the cases and
tolerances of tests/test_run_model.c) and `cdiffusers generate --latents-out` on the golden tiny
pipelines (tests/data/pipelines, latents_final at test_pipeline.c's 5e-4), each with --device
DEVICE in every execution mode, the pipelines also with every offload mode, and compares with
diffusers' outputs stored in the golden files. A GGUF transformer (Q8_0/Q4_0/Q5_1/Q4_K/Q6_K layers,
decoded in the device's quantized matmul) must give the latents its gguf-py dequantization gives as a
plain f32 file on the same device (test_formats_single_file.c checks this bit for bit on the CPU).
Prints one line per run and a summary; exit code 1 if any run failed or exceeded its tolerance.
Uses torch + safetensors where they are (the GPU machine has both), else a small reader of its
own (F32 / BF16 / F16 tensors; scripts/device-check.sh --dry-run on a machine without torch).
"""
import argparse
import json
import os
import subprocess
import sys
import time

try:
    import torch
    from safetensors.torch import load_file
except ImportError:  # no torch here (a --dry-run): the tensors as flat lists of floats
    torch = None

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

# (component, io file, method, key, tolerance, extra args): tests/test_run_model.c
COMPONENTS = [
    ("golden/flux1_schnell/transformer", "golden/flux1_schnell/io.safetensors", "forward", "out.sample", 5e-5, ["--dtype", "f32"]),
    ("golden/flux1_dev/transformer_bf16", "golden/flux1_dev/io_bf16.safetensors", "forward", "out.sample", 3e-4, ["--dtype", "f32"]),
    ("golden/flux1_dev/transformer_bf16", "golden/flux1_dev/io_bf16.safetensors", "forward", "out.sample", 0.11, []),
    ("golden/sd35m/transformer", "golden/sd35m/io.safetensors", "forward", "out.sample", 3e-4, ["--dtype", "f32"]),
    ("golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "decode", "out.decode_sample", 2e-5, ["--dtype", "f32"]),
    ("golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "encode", "out.encode_mean", 2e-5, ["--dtype", "f32"]),
]

# golden pipelines (f32 in diffusers): latents_final within test_pipeline.c's 5e-4
PIPELINES = [
    ("flux1_schnell_tiny", "64x64"),
    ("flux1_dev_tiny", "64x64_true_cfg"),
    ("sd35m_tiny", "64x64_neg"),
]

# (pipeline, case, quantized transformer, its dequantization as a plain file, tolerance): both
# decoded weights go through the same cuBLASLt products, so the latents should agree to the bit;
# the tolerance only allows another algorithm choice for another pointer alignment
GGUF_PAIRS = [
    ("flux1_dev_tiny", "64x64_true_cfg", "formats/flux_single/flux_bfl_q8.gguf",
     "formats/flux_single/q8_dequant/transformer/diffusion_pytorch_model.safetensors", 1e-5),
]
GGUF_RUNS = [("eager", "none"), ("compile", "none"), ("eager", "sequential")]

MODES = {
    "eager": ["--mode", "eager"],
    "fuse": ["--mode", "fuse"],
    "compile": ["--mode", "compile"],
    "blocks": ["--mode", "compile", "--compile-repeated-blocks"],
}


def _flat_floats(path, key):
    """Tensor `key` of a safetensors file as a list of floats (F32, BF16, F16), without torch."""
    import array
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        t = head[key]
        s, e = t["data_offsets"]
        f.seek(8 + n + s)
        raw = f.read(e - s)
    if t["dtype"] == "F32":
        a = array.array("f")
        a.frombytes(raw)
        return list(a)
    if t["dtype"] == "BF16":
        h = array.array("H")
        h.frombytes(raw)
        return [struct.unpack("<f", struct.pack("<I", x << 16))[0] for x in h]
    if t["dtype"] == "F16":
        return [x[0] for x in struct.iter_unpack("<e", raw)]
    raise ValueError(f"{path}: {key} is {t['dtype']}")


def max_diff(ours_path, golden_path, key, gkey=None):
    if torch is None:
        a, b = _flat_floats(ours_path, key), _flat_floats(golden_path, gkey or key)
        if len(a) != len(b):
            return float("inf"), f"{len(a)} elements vs golden {len(b)}"
        return max((abs(x - y) for x, y in zip(a, b)), default=0.0), ""
    a = load_file(ours_path)[key].float()
    b = load_file(golden_path)[gkey or key].float()
    if a.numel() != b.numel():
        return float("inf"), f"{a.numel()} elements vs golden {b.numel()}"
    d = (a.reshape(-1) - b.reshape(-1)).abs()
    return (float(d.max()) if d.numel() else 0.0), ""


def run_cli(cmd, timeout):
    """Runs cmd; returns (exit code, the end of its stderr, seconds); a timeout is exit -1."""
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, err = p.returncode, (p.stderr or "")[-600:]
    except subprocess.TimeoutExpired:
        rc, err = -1, "timed out"
    return rc, err, time.time() - t


def check(label, cmd, timeout, ours, golden, key, tol):
    """Runs cmd, compares tensor `key` of ours with golden; prints one line; returns success."""
    rc, err, dt = run_cli(cmd, timeout)
    if rc != 0:
        print(f"FAIL  {label}: exit {rc} ({dt:.1f} s): {err.strip()}")
        return False
    d, why = max_diff(ours, golden, key)
    ok = d <= tol
    print(f"{'PASS' if ok else 'FAIL'}  {label}: {key} max|diff| {d:.3g} (tol {tol:g}) {why} [{dt:.1f} s]")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True, help="scratch folder")
    ap.add_argument("--modes", default="eager,fuse,compile,blocks")
    ap.add_argument("--offloads", default="none,model,sequential")
    ap.add_argument("--budget", type=float, default=240, help="seconds; later runs are skipped past it")
    ap.add_argument("--sections", default="components,gguf,pipelines", help="which parts to run")
    ap.add_argument("--skip", default="", help="pipeline runs already done, as mode:offload,... (e.g. eager:none)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    fails, n = 0, 0
    modes = args.modes.split(",")

    def over_budget():
        return time.time() - t0 > args.budget

    sections = args.sections.split(",")
    for comp, io, method, key, tol, extra in COMPONENTS if "components" in sections else []:
        for mode in modes:
            if over_budget():
                print(f"SKIP  run-model {comp} {method} {mode}: time budget spent")
                continue
            out = os.path.join(args.out, f"rm_{n}.safetensors")
            n += 1
            cmd = [args.cli, "run-model", "--model", os.path.join(DATA, comp), "--inputs", os.path.join(DATA, io),
                   "--output", out, "--method", method, "--force", "--device", args.device] + MODES[mode] + extra
            label = f"run-model {comp} {method} {' '.join(extra) or '--dtype bf16'} mode={mode}"
            fails += not check(label, cmd, 120, out, os.path.join(DATA, io), key, tol)

    def generate_base(pipe, case):
        folder = os.path.join(DATA, "pipelines", pipe)
        call = json.load(open(os.path.join(folder, "cases", case, "expected.json")))["call"]
        base = [args.cli, "generate", "--model", folder, "--prompt", call["prompt"], "--height", str(call["height"]),
                "--width", str(call["width"]), "--steps", str(call["num_inference_steps"]), "--seed", str(call["seed"]),
                "--dtype", "f32", "--quiet", "--force", "--device", args.device]
        if "guidance_scale" in call:
            base += ["--guidance", str(call["guidance_scale"])]
        if "max_sequence_length" in call:
            base += ["--max-sequence-length", str(call["max_sequence_length"])]
        if "negative_prompt" in call:
            base += ["--negative-prompt", call["negative_prompt"]]
        if "true_cfg_scale" in call:
            base += ["--true-cfg-scale", str(call["true_cfg_scale"])]
        return folder, base

    for pipe, case, gguf, dequant, tol in GGUF_PAIRS if "gguf" in sections else []:
        _, base = generate_base(pipe, case)
        for mode, offload in GGUF_RUNS:
            if over_budget():
                print(f"SKIP  gguf {pipe}/{case} {mode} offload={offload}: time budget spent")
                continue
            lat_q = os.path.join(args.out, f"gguf_{n}_q.safetensors")
            lat_d = os.path.join(args.out, f"gguf_{n}_d.safetensors")
            n += 1
            run = base + ["--offload", offload] + MODES[mode]
            label = f"generate {pipe}/{case} --transformer {os.path.basename(gguf)} mode={mode} offload={offload} vs dequantized"
            rc, err, _ = run_cli(run + ["--transformer", os.path.join(DATA, dequant), "--output", lat_d + ".png",
                                        "--latents-out", lat_d], 180)
            if rc != 0:
                print(f"FAIL  {label}: the dequantized run exited {rc}: {err.strip()}")
                fails += 1
                continue
            fails += not check(label, run + ["--transformer", os.path.join(DATA, gguf), "--output", lat_q + ".png",
                                             "--latents-out", lat_q], 180, lat_q, lat_d, "latents_final", tol)

    for pipe, case in PIPELINES if "pipelines" in sections else []:
        folder, base = generate_base(pipe, case)
        golden = os.path.join(folder, "cases", case, "expected.safetensors")
        for offload in args.offloads.split(","):
            for mode in modes:
                if f"{mode}:{offload}" in args.skip.split(","):
                    continue
                if over_budget():
                    print(f"SKIP  generate {pipe}/{case} {mode} offload={offload}: time budget spent")
                    continue
                img = os.path.join(args.out, f"gen_{n}.png")
                lat = os.path.join(args.out, f"gen_{n}.safetensors")
                n += 1
                cmd = base + ["--output", img, "--latents-out", lat, "--offload", offload] + MODES[mode]
                label = f"generate {pipe}/{case} mode={mode} offload={offload}"
                fails += not check(label, cmd, 180, lat, golden, "latents_final", 5e-4)
    print(f"golden on {args.device}: {n} runs, {fails} failed, {time.time() - t0:.0f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
