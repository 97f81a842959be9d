"""Proves that cdiffusers runs our torch model code exactly (architecture + parameter names).

usage: /usr/bin/python3 check_parity.py [--cli build/cdiffusers] [--model DIR]
Without --model: randomly initialises every component (all parameters perturbed, so that a swapped
or ignored weight shows), exports it, and compares each component's forward through
`cdiffusers run-model` with the torch forward, then a whole `cdiffusers generate` (true CFG 3 with an empty negative prompt) against the
torch sampling loop (same initial latents from --latents-out). With --model: the same checks on
a trained folder. Exits non-zero on any mismatch.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as ex  # noqa: E402
import models as M  # noqa: E402
from shapes import Tokenizer  # noqa: E402

torch.set_num_threads(2)


def load_folder(d):
    vcfg = json.load(open(os.path.join(d, "vae", "config.json")))
    vae = M.AutoencoderKL(vcfg)
    vae.load_state_dict(ex.load_safetensors(os.path.join(d, "vae", "diffusion_pytorch_model.safetensors")))
    clip = M.CLIPTextModel(json.load(open(os.path.join(d, "text_encoder", "config.json"))))
    clip.load_state_dict(ex.load_safetensors(os.path.join(d, "text_encoder", "model.safetensors")))
    t5 = M.T5EncoderModel(json.load(open(os.path.join(d, "text_encoder_2", "config.json"))))
    t5.load_state_dict(ex.load_safetensors(os.path.join(d, "text_encoder_2", "model.safetensors")))
    flux = M.FluxTransformer2DModel(json.load(open(os.path.join(d, "transformer", "config.json"))))
    flux.load_state_dict(ex.load_safetensors(os.path.join(d, "transformer", "diffusion_pytorch_model.safetensors")))
    for m in (vae, clip, t5, flux):
        m.eval()
    return vae, clip, t5, flux, vcfg


@torch.no_grad()
def sample(vae, clip, t5, flux, vcfg, clip_ids, t5_ids, latents, steps, neg=None, cfg_scale=1.0):
    """The FluxPipeline denoising loop + decode, from packed initial latents. -> (latents_final, image [-1,1])"""
    _, pooled = clip(clip_ids)
    emb = t5(t5_ids)
    if neg is not None:
        _, npooled = clip(neg[0])
        nemb = t5(neg[1])
    h = w = int(round((latents.shape[1]) ** 0.5)) * 2
    img_ids = M.image_ids(h, w)
    txt_ids = torch.zeros(emb.shape[1], 3)
    sig = M.default_sigmas(steps)
    x = latents.clone()
    for i in range(steps):
        t = torch.tensor([np.float32(sig[i] * 1000.0) / np.float32(1000.0)], dtype=torch.float32)
        v = flux(x, emb, pooled, t, img_ids, txt_ids)
        if neg is not None and cfg_scale > 1.0:
            vn = flux(x, nemb, npooled, t, img_ids, txt_ids)
            v = vn + cfg_scale * (v - vn)
        x = x + (float(sig[i + 1]) - float(sig[i])) * v
    z = M.unpack(x, 16, h, w) / vcfg["scaling_factor"] + vcfg["shift_factor"]
    return x, vae.decode(z)


def run_model(cli, comp_dir, inputs, method="forward"):
    with tempfile.TemporaryDirectory() as td:
        ip, op = os.path.join(td, "in.safetensors"), os.path.join(td, "out.safetensors")
        ex.save_inputs(ip, inputs)
        subprocess.run([cli, "run-model", "--model", comp_dir, "--inputs", ip, "--output", op, "--method", method, "--dtype", "f32",
                        "--force"], check=True)
        return ex.load_safetensors(op)


def report(name, a, b, tol):
    d = (a.float() - b.float()).abs().max().item()
    scale = b.float().abs().max().item()
    ok = d <= tol * max(1.0, scale)
    print(f"{'OK  ' if ok else 'FAIL'} {name}: max|diff| {d:.3g} (max|ref| {scale:.3g}, tol {tol})")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ex.REPO, "build", "cdiffusers"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt", default="a large yellow triangle on a purple background")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="parity_")
    if args.model is None:
        vcfg = dict(ex.VAE_CFG, scaling_factor=0.7, shift_factor=0.1)
        vae, clip, t5, flux = M.AutoencoderKL(vcfg), M.CLIPTextModel(ex.CLIP_CFG), M.T5EncoderModel(ex.T5_CFG), \
            M.FluxTransformer2DModel(ex.FLUX_CFG)
        with torch.no_grad():  # every parameter random, so a swapped/ignored weight shows
            for m in (vae, clip, t5, flux):
                for n, p in m.named_parameters():
                    if p.dim() == 1:
                        p.add_(0.2 * torch.randn_like(p))
                    else:
                        p.mul_(1.5)
        for m in (vae, clip, t5, flux):
            ex.round_bf16(m)
            m.eval()
        model_dir = os.path.join(work, "model")
        ex.export_pipeline(model_dir, vae, clip, t5, flux, vcfg)
    else:
        model_dir = args.model
        vae, clip, t5, flux, vcfg = load_folder(model_dir)
    print("folder:", model_dir)
    tok = Tokenizer(args.cli, model_dir, os.path.join(work, "tok.json"), ex.T5_LEN)
    c_ids, t_ids = tok.ids(args.prompt)
    clip_ids, t5_ids = torch.tensor([c_ids]), torch.tensor([t_ids])
    ok = True
    with torch.no_grad():
        # text encoders
        out = run_model(args.cli, os.path.join(model_dir, "text_encoder"), {"input_ids": clip_ids})
        last, pooled = clip(clip_ids)
        ok &= report("CLIP last_hidden_state", out["out.last_hidden_state"], last, 1e-4)
        ok &= report("CLIP pooler_output", out["out.pooler_output"], pooled, 1e-4)
        out = run_model(args.cli, os.path.join(model_dir, "text_encoder_2"), {"input_ids": t5_ids})
        ok &= report("T5 last_hidden_state", out["out.last_hidden_state"], t5(t5_ids), 1e-4)
        # transformer
        g = torch.Generator().manual_seed(1)
        hs = torch.randn(1, 16, 64, generator=g)
        ehs = torch.randn(1, ex.T5_LEN, ex.FLUX_CFG["joint_attention_dim"], generator=g)
        pp = torch.randn(1, ex.FLUX_CFG["pooled_projection_dim"], generator=g)
        ts = torch.tensor([0.625])
        iid, tid = M.image_ids(8, 8), torch.zeros(ex.T5_LEN, 3)
        out = run_model(args.cli, os.path.join(model_dir, "transformer"),
                        {"hidden_states": hs, "encoder_hidden_states": ehs, "pooled_projections": pp,
                         "timestep": ts, "img_ids": iid, "txt_ids": tid})
        ok &= report("transformer sample", out["out.sample"], flux(hs, ehs, pp, ts, iid, tid), 1e-4)
        # VAE
        x = torch.rand(1, 3, 64, 64, generator=g) * 2 - 1
        out = run_model(args.cli, os.path.join(model_dir, "vae"), {"x": x}, "encode")
        mean, logvar = vae.encode(x)
        ok &= report("VAE encode mean", out["out.encode_mean"], mean, 1e-4)
        ok &= report("VAE encode logvar", out["out.encode_logvar"], logvar, 1e-4)
        z = torch.randn(1, 16, 8, 8, generator=g)
        out = run_model(args.cli, os.path.join(model_dir, "vae"), {"z": z}, "decode")
        ok &= report("VAE decode", out["out.decode_sample"], vae.decode(z), 1e-4)
        # whole pipeline
        png, lat = os.path.join(work, "gen.png"), os.path.join(work, "lat.safetensors")
        subprocess.run([args.cli, "generate", "--model", model_dir, "--prompt", args.prompt, "--height", "64",
                        "--width", "64", "--steps", str(args.steps), "--seed", "3", "--max-sequence-length",
                        str(ex.T5_LEN), "--output", png, "--latents-out", lat, "--force", "--quiet", "--dtype", "f32",
                        "--guidance", "0", "--true-cfg-scale", "3", "--negative-prompt", ""], check=True)
        L = ex.load_safetensors(lat)
        neg = tuple(torch.tensor([v]) for v in tok.ids(""))
        xf, img = sample(vae, clip, t5, flux, vcfg, clip_ids, t5_ids, L["latents_initial"], args.steps, neg, 3.0)
        ok &= report("generate latents_final", L["latents_final"], xf, 1e-4)
        from PIL import Image  # noqa: E402  (python3-pil comes with matplotlib)
        got = torch.from_numpy(np.asarray(Image.open(png).convert("RGB")).astype(np.float32))
        want = ((img[0].permute(1, 2, 0) / 2 + 0.5).clamp(0, 1) * 255).round()
        d = (got - want).abs().max().item()
        print(f"{'OK  ' if d <= 1 else 'FAIL'} generate image: max level diff {d:.0f} (tol 1)")
        ok &= d <= 1
    print("PARITY", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
