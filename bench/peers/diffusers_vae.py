#!/usr/bin/env python3
"""Peer side of the VAE benchmark: one AutoencoderKL.decode of diffusers on CPU PyTorch.

Random weights at the FLUX.1 / SD3 VAE config (16 latent channels, 128-256-512-512, two ResNet
layers per block, mid-block attention, no quant convs). Imports diffusers' model code from a
local source checkout through the torch 1.13 shims of the shared peer harness
(`torch113_compat.py`, found in --harness); nothing is downloaded. Prints one `RESULT {json}`
line: seconds per decode (median of --repeats after --warmup), peak RSS of the process (VmHWM)
and the FLOP count measured with forward hooks (convs + linears + the attention matmuls), which
bench_peers.py compares with its analytic count.

    /usr/bin/python3 bench/peers/diffusers_vae.py --harness /work/shared/tools/peers \
        --diffusers-src DIFFUSERS/src --res 512 --threads 2 --repeats 3
"""
import argparse
import json
import os
import statistics
import sys
import time

VAE_CONFIG = dict(  # black-forest-labs/FLUX.1-dev vae/config.json (SD3/3.5: same shapes, other scale/shift)
    in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024,
    scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
    mid_block_add_attention=True, force_upcast=True,
)


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--harness", required=True, help="folder with torch113_compat.py (shared/tools/peers)")
    ap.add_argument("--diffusers-src", required=True, help="a diffusers checkout's src/ directory")
    ap.add_argument("--res", type=int, default=512, help="output image side in pixels")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    sys.path.insert(0, os.path.abspath(args.harness))
    import torch113_compat  # noqa: E402  (the shared harness; not copied here)

    src = os.path.abspath(args.diffusers_src)
    torch, _, _ = torch113_compat.install(src)
    # register the autoencoders package without its __init__ (which imports every VAE variant)
    torch113_compat.skip_package_init("diffusers.models.autoencoders", os.path.join(src, "diffusers", "models", "autoencoders"))
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    import torch.nn as nn

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(dtype)
    vae = AutoencoderKL(**VAE_CONFIG)
    torch.set_default_dtype(torch.float32)
    vae = vae.to(dtype).eval()
    lat = args.res // 8
    z = torch.randn(1, 16, lat, lat, dtype=dtype)

    flops = [0]

    def conv_hook(mod, inp, out):
        k = (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
        flops[0] += 2 * out.numel() * k

    def lin_hook(mod, inp, out):
        flops[0] += 2 * (inp[0].numel() // mod.in_features) * mod.in_features * mod.out_features

    sdpa = torch113_compat.SDPA_STATS
    rss_weights = rss_kib("VmRSS")
    times = []
    with torch.no_grad():
        for it in range(args.warmup + args.repeats):
            handles = []
            if it == 0:
                handles = [m.register_forward_hook(conv_hook) for m in vae.decoder.modules() if isinstance(m, nn.Conv2d)]
                handles += [m.register_forward_hook(lin_hook) for m in vae.decoder.modules() if isinstance(m, nn.Linear)]
                sdpa.update(calls=0, flops=0, count=True)
            t = time.perf_counter()
            img = vae.decode(z, return_dict=False)[0]
            dt = time.perf_counter() - t
            if it == 0:
                for h in handles:
                    h.remove()
                sdpa["count"] = False
                hooked = flops[0] + sdpa["flops"]
            if it >= args.warmup:
                times.append(dt)
            print(f"  [vae decode {args.dtype} {args.res}px] pass {it}{' (warmup)' if it < args.warmup else ''} {dt:.3f}s", flush=True)
    assert tuple(img.shape) == (1, 3, args.res, args.res) and torch.isfinite(img.float()).all()
    rec = dict(system="diffusers+torch" + torch.__version__.split("+")[0], model="vae_decode", dtype=args.dtype,
               res=args.res, threads=args.threads, sec_median=statistics.median(times), sec_all=times,
               flops_hooked=hooked, peak_rss_gib=rss_kib("VmHWM") / 1048576, weights_rss_gib=rss_weights / 1048576)
    print("RESULT " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
