"""Reference data for tiled VAE decode / encode, computed by diffusers' own AutoencoderKL and
AutoencoderKLFlux2 with enable_tiling() (tiled_decode, _tiled_encode), unmodified, CPU, float32,
1 thread. Nothing of cdiffusers is used.

The models are the tiny golden VAEs already in the repository (tests/data/golden/vae_kl16/vae:
AutoencoderKL without quant convs, FLUX.1/SD3 style; tests/data/golden/vae_flux2/vae:
AutoencoderKLFlux2 with quant_conv / post_quant_conv), both with sample_size 32 and three blocks
(downscaling 4), so enable_tiling() gives tile_sample_min_size 32 and tile_latent_min_size 8.
Inputs are a few times larger than a tile and not square, so several tiles overlap in both
directions and the last row / column of tiles is cut short by the edge (blend extents then come
from the smaller tile).

Cases (keys "<case>.<name>" in io.safetensors):
  <case>.z / <case>.x               the input of vae.decode / vae.encode
  <case>.tile_sample_min_size (i64), .tile_latent_min_size (i64), .tile_overlap_factor (f64):
                                    the tiling attributes set on the model before the call
  decode cases: <case>.tiled = vae.decode(z).sample with tiling, <case>.untiled = the same with
                tiling disabled (to show that a test comparing with .tiled tells them apart)
  encode cases: <case>.tiled_mean / .tiled_logvar = vae.encode(x).latent_dist.mean / .logvar with
                tiling; <case>.untiled_mean without

usage: /work/venv/bin/python tools/make-vae-tiling-golden/make_golden.py [OUT_DIR]
       (default OUT_DIR: tests/data/vae_tiling)
"""
import json
import os
import sys

import torch
import diffusers
from diffusers import AutoencoderKL, AutoencoderKLFlux2
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "vae_tiling")
torch.set_num_threads(1)

MODELS = {
    "kl16": (AutoencoderKL, os.path.join(GOLDEN, "vae_kl16", "vae")),
    "flux2": (AutoencoderKLFlux2, os.path.join(GOLDEN, "vae_flux2", "vae")),
}

# (case, model, method, input shape, tile_sample_min_size override or None, tile_latent_min_size override, overlap)
CASES = [
    # enable_tiling() defaults: tiles of 8 latents / 32 pixels, a step of 6 latents, blends over 8 pixels
    ("kl16_decode_default", "kl16", "decode", (1, 16, 14, 18), None, None, None),
    # other sizes: blend weights y/12 (not exact in binary), a step of 9 latents, 3x4 tiles
    # (sizes whose step in pixels equals the cropped tile, or diffusers' output has another size)
    ("kl16_decode_48", "kl16", "decode", (1, 16, 20, 30), 48, 12, None),
    # another overlap factor and a batch of two
    ("kl16_decode_b2_overlap", "kl16", "decode", (2, 16, 11, 10), 32, 8, 0.5),
    ("kl16_encode_default", "kl16", "encode", (1, 3, 56, 72), None, None, None),
    ("flux2_decode_default", "flux2", "decode", (1, 8, 14, 18), None, None, None),
    ("flux2_encode_default", "flux2", "encode", (1, 3, 56, 72), None, None, None),
]


# The pipelines' decode with tiling: diffusers' own decode input of a golden pipeline case (what
# FluxPipeline / StableDiffusion3Pipeline hand vae.decode, tests/data/pipelines/
# <pipeline>/cases/<case>/expected.safetensors "vae_decode_input") decoded by that pipeline's VAE
# with enable_tiling() and tiles of 32 pixels (4 latents, the VAEs downscale by 8): what the
# pipeline returns after pipe.vae.enable_tiling(); pipe.vae.tile_sample_min_size = 32;
# pipe.vae.tile_latent_min_size = 4. Keys "pipe_<pipeline>_<case>.{z,tiled,tile_*}".
PIPE_CASES = [
    ("flux1_schnell_tiny", "64x64", AutoencoderKL),
    ("sd35m_tiny", "64x64_neg", AutoencoderKL),
]
PIPES = os.path.join(ROOT, "tests", "data", "pipelines")


def pipe_cases(tensors, meta):
    from safetensors.torch import load_file
    for pipeline, case, cls in PIPE_CASES:
        key = f"pipe_{pipeline}_{case}"
        vae = cls.from_pretrained(os.path.join(PIPES, pipeline, "vae")).eval()
        z = load_file(os.path.join(PIPES, pipeline, "cases", case, "expected.safetensors"))["vae_decode_input"]
        vae.enable_tiling()
        vae.tile_sample_min_size, vae.tile_latent_min_size = 32, 4
        with torch.no_grad():
            tiled = vae.decode(z).sample
            vae.disable_tiling()
            untiled = vae.decode(z).sample
        # the untiled decode is the case's own "vae_decode_output" (not stored twice)
        tensors[f"{key}.z"], tensors[f"{key}.tiled"] = z, tiled
        for name, v, dt in (("tile_sample_min_size", 32, torch.int64), ("tile_latent_min_size", 4, torch.int64),
                            ("tile_overlap_factor", vae.tile_overlap_factor, torch.float64)):
            tensors[f"{key}.{name}"] = torch.tensor([v], dtype=dt)
        info = {"model": os.path.relpath(os.path.join(PIPES, pipeline, "vae"), ROOT), "class": cls.__name__,
                "method": "decode", "input": f"tests/data/pipelines/{pipeline}/cases/{case}/expected.safetensors vae_decode_input",
                "input_shape": list(z.shape), "tile_sample_min_size": 32, "tile_latent_min_size": 4,
                "tile_overlap_factor": vae.tile_overlap_factor,
                "max_abs_tiled_vs_untiled": float((tiled - untiled).abs().max()), "output_shape": list(tiled.shape)}
        meta["cases"][key] = info
        print(key, json.dumps(info))


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors, meta = {}, {"diffusers": diffusers.__version__, "torch": torch.__version__, "threads": 1, "cases": {}}
    models = {k: cls.from_pretrained(d).eval() for k, (cls, d) in MODELS.items()}
    defaults = {k: (m.tile_sample_min_size, m.tile_latent_min_size, m.tile_overlap_factor) for k, m in models.items()}
    for seed, (case, mk, method, shape, ts, tl, ov) in enumerate(CASES):
        vae = models[mk]
        vae.enable_tiling()
        # enable_tiling() keeps attributes an earlier case changed: back to __init__'s values
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = defaults[mk]
        if ts is not None:
            vae.tile_sample_min_size = ts
        if tl is not None:
            vae.tile_latent_min_size = tl
        if ov is not None:
            vae.tile_overlap_factor = ov
        g = torch.Generator("cpu").manual_seed(1000 + seed)
        if method == "decode":
            inp = torch.randn(shape, generator=g, dtype=torch.float32)
        else:
            inp = torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1
        info = {"model": os.path.relpath(MODELS[mk][1], ROOT), "class": type(vae).__name__, "method": method,
                "input_shape": list(shape), "tile_sample_min_size": vae.tile_sample_min_size,
                "tile_latent_min_size": vae.tile_latent_min_size, "tile_overlap_factor": vae.tile_overlap_factor}
        with torch.no_grad():
            if method == "decode":
                tiled = vae.decode(inp).sample
                vae.disable_tiling()
                untiled = vae.decode(inp).sample
                tensors[f"{case}.z"] = inp
                tensors[f"{case}.tiled"] = tiled
                tensors[f"{case}.untiled"] = untiled
                info["max_abs_tiled_vs_untiled"] = float((tiled - untiled).abs().max())
                info["output_shape"] = list(tiled.shape)
            else:
                dist = vae.encode(inp).latent_dist
                tiled_mean, tiled_logvar = dist.mean, dist.logvar
                vae.disable_tiling()
                untiled_mean = vae.encode(inp).latent_dist.mean
                tensors[f"{case}.x"] = inp
                tensors[f"{case}.tiled_mean"] = tiled_mean
                tensors[f"{case}.tiled_logvar"] = tiled_logvar
                tensors[f"{case}.untiled_mean"] = untiled_mean
                info["max_abs_tiled_vs_untiled"] = float((tiled_mean - untiled_mean).abs().max())
                info["output_shape"] = list(tiled_mean.shape)
        tensors[f"{case}.tile_sample_min_size"] = torch.tensor([info["tile_sample_min_size"]], dtype=torch.int64)
        tensors[f"{case}.tile_latent_min_size"] = torch.tensor([info["tile_latent_min_size"]], dtype=torch.int64)
        tensors[f"{case}.tile_overlap_factor"] = torch.tensor([info["tile_overlap_factor"]], dtype=torch.float64)
        meta["cases"][case] = info
        print(case, json.dumps(info))
    pipe_cases(tensors, meta)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "io.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(OUT, "io.safetensors"), 0o644)
    with open(os.path.join(OUT, "io.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
