#!/usr/bin/env python3
"""diffusers on PyTorch on the same GPU, for bench/cuda/run.sh: one random-weight pipeline folder
(tools/make-random-pipeline), bf16, at SIZE x SIZE: seconds per image and per step in eager mode
and with torch.compile of the transformer, and peak device memory. Prints one line per mode."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--guidance", type=float, default=3.5)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--modes", default="eager,compile")
    a = ap.parse_args()
    try:
        from diffusers import DiffusionPipeline
    except ImportError as e:
        print(f"diffusers {a.model}: SKIP (diffusers not importable: {e}; set DIFFUSERS_SRC)")
        return
    pipe = DiffusionPipeline.from_pretrained(a.model, torch_dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    kw = dict(prompt="a photo of a red fox in the snow", height=a.size, width=a.size, num_inference_steps=a.steps,
              guidance_scale=a.guidance)
    for mode in a.modes.split(","):
        if mode == "compile":
            pipe.transformer = torch.compile(pipe.transformer, fullgraph=True)
        # warm-up (and compilation) outside the timed run
        pipe(**kw, generator=torch.Generator("cpu").manual_seed(0))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        pipe(**kw, generator=torch.Generator("cpu").manual_seed(1))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"diffusers {a.model.rstrip('/').split('/')[-1]} {a.size}x{a.size} {a.steps} steps mode={mode}: "
              f"{dt:.3f} s/image ({dt / a.steps:.4f} s/step incl. text+VAE), peak {peak:.2f} GiB, torch {torch.__version__}")


if __name__ == "__main__":
    main()
