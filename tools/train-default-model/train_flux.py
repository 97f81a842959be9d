"""Stage 2: trains CLIP + T5 + FluxTransformer2DModel from scratch with the flow-matching objective
of FLUX.1 / FlowMatchEulerDiscreteScheduler, on latents of the stage-1 VAE.

usage: /usr/bin/python3 train_flux.py --vae runs/vae.pt --minutes 40 --out runs/flux.pt
         [--export models/shapes-flux-tiny]
       /usr/bin/python3 train_flux.py --init models/shapes-flux-tiny --minutes 90 --out runs/r2/flux.pt ...
         (continues from an exported folder: its bf16 weights, VAE and scaling/shift factors)

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
import evaluate as E  # noqa: E402
import export as ex  # noqa: E402
import models as M  # noqa: E402
import shapes as S  # noqa: E402


def load_folder(d):
    """An exported pipeline folder -> (vae, clip, t5, flux, vae config), float32 torch modules (the
    parameter names are diffusers'/transformers', exactly what export.py writes)."""
    import json
    cfg = lambda sub: json.load(open(os.path.join(d, sub, "config.json")))
    st = lambda sub, f: ex.load_safetensors(os.path.join(d, sub, f))
    vcfg = cfg("vae")
    vae = M.AutoencoderKL(vcfg)
    clip, t5, flux = (M.CLIPTextModel(cfg("text_encoder")), M.T5EncoderModel(cfg("text_encoder_2")),
                      M.FluxTransformer2DModel(cfg("transformer")))
    for m, sd in ((vae, st("vae", "diffusion_pytorch_model.safetensors")),
                  (clip, st("text_encoder", "model.safetensors")), (t5, st("text_encoder_2", "model.safetensors")),
                  (flux, st("transformer", "diffusion_pytorch_model.safetensors"))):
        m.load_state_dict(sd, strict=True)
    return vae, clip, t5, flux, vcfg


def sample_sigmas(kind, b, g, m=0.0, s=1.0):
    """Training sigmas: uniform, or logit-normal (sigmoid of N(m, s)), which spends more samples on
    the middle noise levels where the layout and shape are decided."""
    if kind == "uniform":
        return torch.rand(b, generator=g)
    return torch.sigmoid(m + s * torch.randn(b, generator=g))


@torch.no_grad()
def sample_and_score(vae, vcfg, clip, t5, flux, tok, clen, n=48, seed=99, steps=20, cfg_scale=3.0, latents_only=False):
    """Torch sampler (FluxPipeline Euler loop, true CFG with the empty prompt, the CLI's defaults) on
    n held-out prompts (drawn with another seed than evaluate.py's), scored like evaluate.py.
    latents_only: -> (prompts, latents ready for vae.decode) instead."""
    prompts = E.eval_prompts(n, seed=seed)
    ids = [tok.ids(S.caption(a)) for a in prompts]
    cid, tid = torch.tensor([i[0] for i in ids]), torch.tensor([i[1] for i in ids])
    ec, et = (torch.tensor(v)[None].expand(n, -1) for v in tok.ids(""))
    _, pooled = clip(cid[:, :clen])
    emb = t5(tid)
    _, npooled = clip(ec[:, :clen])
    nemb = t5(et)
    g = torch.Generator().manual_seed(seed)
    x = M.pack(torch.randn(n, 16, 8, 8, generator=g))
    img_ids, txt_ids = M.image_ids(8, 8), torch.zeros(tid.shape[1], 3)
    sig = M.default_sigmas(steps)
    for i in range(steps):
        t = torch.full((n,), float(sig[i]))
        v = flux(x, emb, pooled, t, img_ids, txt_ids)
        vn = flux(x, nemb, npooled, t, img_ids, txt_ids)
        x = x + (float(sig[i + 1]) - float(sig[i])) * (vn + cfg_scale * (v - vn))
    z = M.unpack(x, 16, 8, 8) / vcfg["scaling_factor"] + vcfg["shift_factor"]
    if latents_only:
        return prompts, z
    return score_decoded(vae, z, prompts)


@torch.no_grad()
def score_decoded(vae, z, prompts):
    img = vae.decode(z)
    img = ((img.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    rows = [{"want": E.expected(a), "got": E.score_image(im, a["shape"])} for a, im in zip(prompts, img)]
    return E.summarise(rows)


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
    ap.add_argument("--init", default=None,
                    help="continue from this exported folder (its text encoders, transformer, VAE and factors)")
    ap.add_argument("--new-vae", default=None,
                    help="with --init: encode with this train_vae.py checkpoint instead of the folder's VAE and "
                         "measure new shift/scaling factors (the text encoders and transformer start from the folder)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--sigma", choices=["uniform", "logit-normal"], default="uniform")
    ap.add_argument("--sigma-m", type=float, default=0.0)
    ap.add_argument("--sigma-s", type=float, default=1.0)
    ap.add_argument("--data", default=None, help="latent cache (default RUNDIR/latents.pt)")
    ap.add_argument("--data-seed", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="torch seed; the batch generator uses seed + 3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-minutes", type=float, default=0,
                    help="every so many minutes sample/score held-out prompts with the EMA weights, keep the best")
    ap.add_argument("--eval-n", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rundir = os.path.dirname(args.out)
    os.makedirs(rundir, exist_ok=True)

    if args.init:
        vae, clip0, t50, flux0, vcfg0 = load_folder(args.init)  # bf16 values already
    if args.new_vae or not args.init:
        vae = M.AutoencoderKL(ex.VAE_CFG)
        vae.load_state_dict(torch.load(args.new_vae or args.vae)["model"])
        ex.round_bf16(vae)  # the shipped VAE is bf16: encode with exactly those weights
    vae.eval()
    vae_src = args.new_vae or args.init or args.vae
    tok = S.Tokenizer(args.cli, os.path.join(ex.REPO, "tests", "data", "pipelines", "flux1_schnell_tiny"),
                      os.path.join(rundir, "tokens.json"), ex.T5_LEN)
    rng = np.random.default_rng(1)
    tok.check([S.caption(S.sample_attrs(rng)) for _ in range(10)] + [""])
    empty_c, empty_t = (torch.tensor(v) for v in tok.ids(""))

    data_path = args.data or os.path.join(rundir, "latents.pt")
    if os.path.exists(data_path) and os.path.getmtime(data_path) > os.path.getmtime(vae_src):
        d = torch.load(data_path)
    else:
        t0 = time.time()
        lat, cids, tids, caps = build_dataset(vae, tok, args.n_data, seed=args.data_seed)
        if args.init and not args.new_vae:  # the transformer learnt these factors: keep them
            shift, scale = vcfg0["shift_factor"], vcfg0["scaling_factor"]
        else:
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
    if args.init:
        for m, m0 in ((clip, clip0), (t5, t50), (flux, flux0)):
            m.load_state_dict(m0.state_dict())
    else:
        with torch.no_grad():  # adaLN-zero style start: every block starts as the identity
            for mod in flux.modules():
                if isinstance(mod, M.AdaNorm):
                    mod.linear.weight.zero_()
                    mod.linear.bias.zero_()
            flux.proj_out.weight.mul_(0.1)
            for e in (clip.text_model.embeddings.token_embedding, t5.shared):
                e.weight.mul_(0.5)
    vcfg = dict(ex.VAE_CFG, scaling_factor=scale, shift_factor=shift)
    params = list(clip.parameters()) + list(t5.parameters()) + list(flux.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    ema = [copy.deepcopy(m) for m in (clip, t5, flux)]
    img_ids, txt_ids = M.image_ids(*d["latents"].shape[2:]), torch.zeros(ex.T5_LEN, 3)

    log = open(os.path.join(rundir, "flux_loss.tsv"), "w")
    log.write("step\tseconds\tloss\n")
    t0, step, avg = time.time(), 0, None
    budget = args.minutes * 60
    g = torch.Generator().manual_seed(args.seed + 3)
    best, t_eval, t_spent_eval = -1.0, time.time(), 0.0
    evlog = open(os.path.join(rundir, "flux_eval.tsv"), "w") if args.eval_minutes > 0 else None
    if evlog:
        evlog.write("step\tseconds\t" + "\t".join(E.ATTRS + ["all_five"]) + "\n")

    def evaluate_now():
        nonlocal best
        te = time.time()
        for e in ema:
            e.eval()
        acc = sample_and_score(vae, vcfg, *ema, tok, clen, n=args.eval_n)
        score = np.mean([acc[k] for k in ("shape", "colour", "size")])
        evlog.write(f"{step}\t{time.time() - t0:.0f}\t" + "\t".join(f"{acc[k]:.3f}" for k in E.ATTRS + ["all_five"]) + "\n")
        evlog.flush()
        print(f"eval step {step}: " + " ".join(f"{k}={v:.3f}" for k, v in acc.items()) + f" ({time.time() - te:.0f}s)",
              flush=True)
        if score > best:
            best = score
            torch.save({"ema": [e.state_dict() for e in ema], "step": step, "shift": shift, "scale": scale, "acc": acc},
                       os.path.splitext(args.out)[0] + "_best.pt")
        return time.time() - te

    if evlog:
        t_spent_eval += evaluate_now()
    while step < args.max_steps and time.time() - t0 < budget:
        frac = min(1.0, (time.time() - t0) / budget)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n, (args.batch,), generator=g)
        x0, cid, tid = x0_all[idx], clip_all[idx].clone(), t5_all[idx].clone()
        drop = torch.rand(args.batch, generator=g) < args.p_drop
        cid[drop], tid[drop] = empty_c, empty_t
        _, pooled = clip(cid[:, :clen])
        emb = t5(tid)
        sigma = sample_sigmas(args.sigma, args.batch, g, args.sigma_m, args.sigma_s)
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
        if evlog and time.time() - t_eval > args.eval_minutes * 60:
            t_spent_eval += evaluate_now()
            t_eval = time.time()
        if step % 250 == 0:
            torch.save({"ema": [e.state_dict() for e in ema], "model": [m.state_dict() for m in (clip, t5, flux)],
                        "step": step, "shift": shift, "scale": scale}, args.out)
    torch.save({"ema": [e.state_dict() for e in ema], "model": [m.state_dict() for m in (clip, t5, flux)],
                "step": step, "shift": shift, "scale": scale}, args.out)
    print("done", step, "steps", flush=True)
    if evlog:
        t_spent_eval += evaluate_now()
        print(f"best eval score {best:.3f}; evaluation took {t_spent_eval:.0f}s", flush=True)
    if args.export:
        export_from_checkpoint(vae_src, args.out, args.export)


def export_from_checkpoint(vae_path, flux_path, out_dir, use_ema=True):
    """vae_path: a train_vae.py checkpoint or an exported folder (its VAE is used)."""
    ck = torch.load(flux_path)
    if os.path.isdir(vae_path):
        vae = load_folder(vae_path)[0]
    else:
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
