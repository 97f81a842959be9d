#!/usr/bin/env python3
"""Reference data for cdiffusers' fp8 safetensors loading (F8_E4M3, F8_E5M2, "fp8_scaled").

Ground truth is torch: `tensor.to(torch.float32)` for every one of the 256 byte values of each
format, and for a ComfyUI-style scaled fp8 checkpoint `weight.to(torch.float32) * scale_weight`
(what comfy's scaled fp8 ops compute when they dequantize a weight for a float matmul). Writes:

  tests/data/formats/fp8_refs.safetensors     e4m3 / e5m2 (the 256 values, as F8 tensors written by
                                              safetensors.torch) and e4m3.f32 / e5m2.f32
  tests/data/formats/fp8_scaled/model.safetensors   a tiny fp8_scaled checkpoint: "scaled_fp8"
                                              marker, lin.weight (F8_E4M3 [8, 16]) with
                                              lin.scale_weight (F32 scalar), lin.bias (BF16),
                                              other.weight (F8_E5M2 [4, 4], no scale)
  tests/data/formats/fp8_scaled.expect.safetensors  the weights as torch dequantizes them (f32)

Usage: /work/venv/bin/python tools/make-format-refs/make_fp8_refs.py [OUT_DIR]
"""
import os
import sys

import torch
from safetensors.torch import save_file


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/data/formats")
    os.makedirs(os.path.join(out, "fp8_scaled"), exist_ok=True)
    allb = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    e4 = allb.clone().view(torch.float8_e4m3fn)
    e5 = allb.clone().view(torch.float8_e5m2)
    save_file({"e4m3": e4, "e5m2": e5, "e4m3.f32": e4.to(torch.float32), "e5m2.f32": e5.to(torch.float32)},
              os.path.join(out, "fp8_refs.safetensors"))

    g = torch.Generator().manual_seed(19)
    w = (torch.randn(8, 16, generator=g) * 3).to(torch.float8_e4m3fn)
    scale = torch.tensor(0.0173, dtype=torch.float32)
    b = torch.randn(8, generator=g).to(torch.bfloat16)
    o = (torch.randn(4, 4, generator=g) * 100).to(torch.float8_e5m2)
    save_file({"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn), "lin.weight": w, "lin.scale_weight": scale,
               "lin.bias": b, "other.weight": o},
              os.path.join(out, "fp8_scaled", "model.safetensors"))
    save_file({"lin.weight": w.to(torch.float32) * scale, "lin.bias": b.to(torch.float32),
               "other.weight": o.to(torch.float32)},
              os.path.join(out, "fp8_scaled.expect.safetensors"))
    print("wrote", out)


if __name__ == "__main__":
    main()
