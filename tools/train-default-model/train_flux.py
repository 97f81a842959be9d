"""Stage 2: trains CLIP + T5 + FluxTransformer2DModel from scratch with the flow-matching objective
of FLUX.1 / FlowMatchEulerDiscreteScheduler, on latents of the stage-1 VAE.

usage: /usr/bin/python3 train_flux.py --vae runs/vae.pt --minutes 40 --out runs/flux.pt
         [--export models/shapes-flux-tiny]

Exactly the inference semantics of FluxPipeline: CLIP ids padded to 77 (causal, pooled at the
first eos), T5 ids padded to max_sequence_length (32) and run without an attention mask, latents
= (vae mean - shift_factor) * scaling_factor packed 2x2, x_sigma = (1 - sigma) x0 + sigma noise,
target velocity noise - x0, timestep input sigma (the transformer multiplies it by 1000), text ids
zero, image ids (0, row, col). 10% of captions are dropped to "" (usable with --true-cfg-scale).
"""
import argparse
import copy
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as ex  # noqa: E402
import models as M  # noqa: E402
import shapes as S  # noqa: E402


def build_dataset(vae, tok, n, seed):
    """n training pictures -> latent means [n,16,8,8], clip ids [n,77], t5 ids [n,L]."""
    rng = np.random.default_rng(seed)
    lat, cids, tids, caps = [], [], [], []
    with torch.no_grad():
        for i in range(0, n, 256):
            attrs = [S.sample_attrs(rng) for _ in range(min(256, n - i))]
            x = torch.from_numpy(np.stack([S.render(a, rng) for a in attrs])).permute(0, 3, 1, 2).float() / 127.5 - 1
            lat.append(vae.encode(x)[0])
            for a in attrs:
                c = S.caption(a)
                ci, ti = tok.ids(c)
                cids.append(ci)
                tids.append(ti)
                caps.append(c)
    return torch.cat(lat), torch.tensor(cids), torch.tensor(tids), caps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vae", default=os.path.join(ex.HERE, "runs", "vae.pt"))
    ap.add_argument("--cli", default=os.path.join(ex.REPO, "build", "cdiffusers"))
    ap.add_argument("--minutes", type=float, default=40)
    ap.add_argument("--max-steps", type=int, default=1000000)
    ap.add_argument("--n-data", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--p-drop", type=float, default=0.1)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--out", default=os.path.join(ex.HERE, "runs", "flux.pt"))
    ap.add_argument("--export", default=None, help="write the pipeline folder (EMA weights, bf16) at the end")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    rundir = os.path.dirname(args.out)
    os.makedirs(rundir, exist_ok=True)

    vae = M.AutoencoderKL(ex.VAE_CFG)
    vae.load_state_dict(torch.load(args.vae)["model"])
    ex.round_bf16(vae)  # the shipped VAE is bf16: encode with exactly those weights
    vae.eval()
    tok = S.Tokenizer(args.cli, os.path.join(ex.REPO, "tests", "data", "pipelines", "flux1_schnell_tiny"),
                      os.path.join(rundir, "tokens.json"), ex.T5_LEN)
    rng = np.random.default_rng(1)
    tok.check([S.caption(S.sample_attrs(rng)) for _ in range(10)] + [""])
    empty_c, empty_t = (torch.tensor(v) for v in tok.ids(""))

    data_path = os.path.join(rundir, "latents.pt")
    if os.path.exists(data_path) and os.path.getmtime(data_path) > os.path.getmtime(args.vae):
        d = torch.load(data_path)
    else:
        t0 = time.time()
        lat, cids, tids, caps = build_dataset(vae, tok, args.n_data, seed=2)
        shift = lat.mean().item()
        scale = 1.0 / (lat - shift).std().item()
        d = {"latents": lat, "clip": cids, "t5": tids, "captions": caps, "shift": shift, "scale": scale}
        torch.save(d, data_path)
        print(f"dataset {len(caps)} in {time.time() - t0:.0f}s; shift_factor {shift:.4f} scaling_factor {scale:.4f}",
              flush=True)
    shift, scale = d["shift"], d["scale"]
    x0_all = M.pack((d["latents"] - shift) * scale)
    clip_all, t5_all = d["clip"], d["t5"]
    n = x0_all.shape[0]
    # CLIP is causal and only its output at the first eos is used: positions after the longest
    # caption's eos cannot change it, so training runs the first `clen` positions (same numbers).
    clen = int((clip_all == 49407).float().argmax(1).max().item()) + 1

    clip, t5, flux = M.CLIPTextModel(ex.CLIP_CFG), M.T5EncoderModel(ex.T5_CFG), M.FluxTransformer2DModel(ex.FLUX_CFG)
    with torch.no_grad():  # adaLN-zero style start: every block starts as the identity
        for mod in flux.modules():
            if isinstance(mod, M.AdaNorm):
                mod.linear.weight.zero_()
                mod.linear.bias.zero_()
        flux.proj_out.weight.mul_(0.1)
        for e in (clip.text_model.embeddings.token_embedding, t5.shared):
            e.weight.mul_(0.5)
    params = list(clip.parameters()) + list(t5.parameters()) + list(flux.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    ema = [copy.deepcopy(m) for m in (clip, t5, flux)]
    img_ids, txt_ids = M.image_ids(*d["latents"].shape[2:]), torch.zeros(ex.T5_LEN, 3)

    log = open(os.path.join(rundir, "flux_loss.tsv"), "w")
    log.write("step\tseconds\tloss\n")
    t0, step, avg = time.time(), 0, None
    budget = args.minutes * 60
    g = torch.Generator().manual_seed(3)
    while step < args.max_steps and time.time() - t0 < budget:
        frac = min(1.0, (time.time() - t0) / budget)
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n, (args.batch,), generator=g)
        x0, cid, tid = x0_all[idx], clip_all[idx].clone(), t5_all[idx].clone()
        drop = torch.rand(args.batch, generator=g) < args.p_drop
        cid[drop], tid[drop] = empty_c, empty_t
        _, pooled = clip(cid[:, :clen])
        emb = t5(tid)
        sigma = torch.rand(args.batch, generator=g)
        noise = torch.randn(x0.shape, generator=g)
        xt = (1 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        v = flux(xt, emb, pooled, sigma, img_ids, txt_ids)
        loss = ((v - (noise - x0)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            dec = min(args.ema, (1 + step) / (10 + step))
            for m, e in zip((clip, t5, flux), ema):
                for p, q in zip(m.parameters(), e.parameters()):
                    q.mul_(dec).add_(p, alpha=1 - dec)
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        log.write(f"{step}\t{time.time() - t0:.1f}\t{loss.item():.6f}\n")
        if step % 25 == 0:
            log.flush()
            print(f"step {step} t={time.time() - t0:.0f}s loss(avg) {avg:.4f} lr {lr:.2e}", flush=True)
        if step % 250 == 0:
            torch.save({"ema": [e.state_dict() for e in ema], "model": [m.state_dict() for m in (clip, t5, flux)],
                        "step": step, "shift": shift, "scale": scale}, args.out)
    torch.save({"ema": [e.state_dict() for e in ema], "model": [m.state_dict() for m in (clip, t5, flux)],
                "step": step, "shift": shift, "scale": scale}, args.out)
    print("done", step, "steps", flush=True)
    if args.export:
        export_from_checkpoint(args.vae, args.out, args.export)


def export_from_checkpoint(vae_path, flux_path, out_dir, use_ema=True):
    ck = torch.load(flux_path)
    vae = M.AutoencoderKL(ex.VAE_CFG)
    vae.load_state_dict(torch.load(vae_path)["model"])
    mods = [M.CLIPTextModel(ex.CLIP_CFG), M.T5EncoderModel(ex.T5_CFG), M.FluxTransformer2DModel(ex.FLUX_CFG)]
    for m, sd in zip(mods, ck["ema" if use_ema else "model"]):
        m.load_state_dict(sd)
    vcfg = dict(ex.VAE_CFG, scaling_factor=round(ck["scale"], 4), shift_factor=round(ck["shift"], 4))
    ex.export_pipeline(out_dir, vae, *mods, vcfg)
    print("exported", out_dir, "step", ck["step"], flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "export":
        # export VAE.pt FLUX.pt OUT_DIR [raw]
        export_from_checkpoint(sys.argv[2], sys.argv[3], sys.argv[4], use_ema=len(sys.argv) < 6)
    else:
        main()
