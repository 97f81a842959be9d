"""Stage 1: trains the AutoencoderKL on generator pictures (reconstruction MSE + small KL).

usage: /usr/bin/python3 train_vae.py --minutes 15 --out runs/vae.pt
       /usr/bin/python3 train_vae.py --init models/shapes-flux-tiny --decoder-only --eval-minutes 10 ...
         (fine-tunes an exported folder's decoder; its encoder, hence the transformer's latents, stay)
Writes a checkpoint every 100 steps and a loss log (runs/vae_loss.tsv).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as ex  # noqa: E402
import models as M  # noqa: E402
import shapes as S  # noqa: E402


def batch(rng, n, p_random=0.0):
    """Training pictures: training combinations only (held-out ones never seen by any stage).
    p_random: that fraction gets random RGB shape/background colours instead (colour augmentation, so
    that the decoder does not tie a colour to the backgrounds it was seen on); a random pair whose
    nearest palette colours form a held-out colour x background pair, or the same colour, is redrawn."""
    imgs = [random_colour_picture(rng) if p_random > 0 and rng.random() < p_random else S.render(S.sample_attrs(rng), rng)
            for _ in range(n)]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x


_PAL = np.array(list(S.COLOURS.values()), np.float32)


def nearest_palette(c):
    return list(S.COLOURS)[int(((_PAL - c) ** 2).sum(1).argmin())]


def random_colour_picture(rng):
    a = S.sample_attrs(rng)
    while True:
        fg, bg = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        nf, nb = nearest_palette(fg), nearest_palette(bg)
        if nf != nb and (nf, nb) not in S.HOLDOUT_COLOUR_BG and ((fg - bg) ** 2).sum() > 80.0 ** 2:
            break
    r = S.SIZES[a["size"] or "medium"] * rng.uniform(0.93, 1.07)
    row, col = S.POSITIONS[a["position"] or "center"]
    cx, cy = S.CELL_CENTRES[col] + rng.uniform(-2.5, 2.5), S.CELL_CENTRES[row] + rng.uniform(-2.5, 2.5)
    m = S.shape_mask(a["shape"], cx, cy, r)[..., None]
    return np.clip(np.round(m * fg + (1 - m) * bg), 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--kl", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    ap.add_argument("--l1", type=float, default=0.0, help="weight of an extra L1 reconstruction term")
    ap.add_argument("--resume", default=None, help="start from this checkpoint")
    ap.add_argument("--decoder-only", action="store_true",
                    help="train only the decoder (the encoder, hence the transformer's latents, stay fixed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ex.HERE, "runs", "vae.pt"))
    ap.add_argument("--init", default=None, help="start from this exported folder's VAE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--z-noise", type=float, default=1.0,
                    help="decoder input = mean + z_noise * posterior std * N(0, 1) (1: the sampled posterior)")
    ap.add_argument("--eval-minutes", type=float, default=0,
                    help="with --init: every so many minutes score (a) reconstructions of true held-out pictures "
                         "and (b) decodes of the --init folder's own generated latents; keep the best decoder")
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--random-colours", type=float, default=0.0,
                    help="fraction of training pictures with random RGB colours (see batch())")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    vae = M.AutoencoderKL(ex.VAE_CFG)
    if args.resume:
        vae.load_state_dict(torch.load(args.resume)["model"])
    evaluate_now = None
    if args.init:
        import train_flux as TF
        vae, clip, t5, flux, vcfg = TF.load_folder(args.init)
        if args.resume:  # the folder's models (for the evaluation), the checkpoint's VAE
            vae.load_state_dict(torch.load(args.resume)["model"])
        if args.eval_minutes > 0:
            evaluate_now = make_evaluator(args, vae, clip, t5, flux, vcfg, TF)
    if args.decoder_only:
        ex.round_bf16(vae.encoder)  # the shipped (bf16) encoder gave the transformer's latents
        vae.encoder.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in vae.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    stem = os.path.splitext(os.path.basename(args.out))[0]
    log = open(os.path.join(os.path.dirname(args.out), stem + "_loss.tsv"), "w")
    log.write("step\tseconds\tloss\trec_mse\tkl\n")
    t0, step, ema = time.time(), 0, None
    budget = args.minutes * 60
    t_eval = time.time()
    if evaluate_now:
        evaluate_now(vae, step)
    while step < args.max_steps and time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for gr in opt.param_groups:  # linear warm-up, cosine decay over the time budget
            gr["lr"] = args.lr * min(1.0, (step + 1) / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * frac)))
        x = batch(rng, args.batch, args.random_colours)
        if args.decoder_only:
            with torch.no_grad():
                mean, logvar = vae.encode(x)
        else:
            mean, logvar = vae.encode(x)
        z = mean + args.z_noise * torch.exp(0.5 * logvar) * torch.randn_like(mean)
        rec = vae.decode(z)
        mse = ((rec - x) ** 2).mean()
        kl = 0.5 * (mean ** 2 + logvar.exp() - 1 - logvar).mean()
        loss = mse + args.kl * kl + args.l1 * (rec - x).abs().mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        ema = mse.item() if ema is None else 0.95 * ema + 0.05 * mse.item()
        log.write(f"{step}\t{time.time() - t0:.1f}\t{loss.item():.6f}\t{mse.item():.6f}\t{kl.item():.4f}\n")
        if step % 20 == 0:
            log.flush()
            print(f"step {step} t={time.time() - t0:.0f}s mse(ema) {ema:.5f} kl {kl.item():.3f}", flush=True)
        if step % 100 == 0:
            torch.save({"model": vae.state_dict(), "step": step}, args.out)
        if evaluate_now and time.time() - t_eval > args.eval_minutes * 60:
            evaluate_now(vae, step)
            t_eval = time.time()
    torch.save({"model": vae.state_dict(), "step": step}, args.out)
    print("done", step, "steps", flush=True)
    if evaluate_now:
        evaluate_now(vae, step)


def make_evaluator(args, vae, clip, t5, flux, vcfg, TF):
    """Scores (a) reconstructions (posterior mean) of the true pictures of args.eval_n held-out prompts and
    (b) decodes of latents the --init folder's transformer generated for 64 other held-out prompts (torch
    sampler, the CLI's defaults): the decoder as the pipeline will use it. Saves the best decoder (mean of
    shape, colour and size over (a) and (b)) to OUT_best.pt. Prompts: seed 99, not evaluate.py's 1234."""
    import evaluate as E
    prompts = E.eval_prompts(args.eval_n, seed=99)
    x = torch.from_numpy(np.stack([S.render(a) for a in prompts])).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        zr = vae.encode(x)[0]
    tok = S.Tokenizer(os.path.join(ex.REPO, "build", "cdiffusers"),
                      os.path.join(ex.REPO, "tests", "data", "pipelines", "flux1_schnell_tiny"),
                      os.path.join(os.path.dirname(args.out), "tokens.json"), ex.T5_LEN)
    for m in (clip, t5, flux):
        m.eval()
    gp, zg = TF.sample_and_score(vae, vcfg, clip, t5, flux, tok, 77, n=64, latents_only=True)
    log = open(os.path.splitext(args.out)[0] + "_eval.tsv", "w")
    log.write("step\t" + "\t".join(f"{w}_{k}" for w in ("recon", "gen") for k in E.ATTRS) + "\n")
    best = [-1.0]

    def run(v, step):
        v.eval()
        a, b = TF.score_decoded(v, zr, prompts), TF.score_decoded(v, zg, gp)
        v.train()
        log.write(f"{step}\t" + "\t".join(f"{acc[k]:.3f}" for acc in (a, b) for k in E.ATTRS) + "\n")
        log.flush()
        score = np.mean([acc[k] for acc in (a, b) for k in ("shape", "colour", "size")])
        print(f"eval step {step}: recon " + " ".join(f"{k}={a[k]:.3f}" for k in E.ATTRS) + " | generated "
              + " ".join(f"{k}={b[k]:.3f}" for k in E.ATTRS) + f" | score {score:.3f}", flush=True)
        if score > best[0]:
            best[0] = score
            torch.save({"model": v.state_dict(), "step": step, "recon": a, "gen": b},
                       os.path.splitext(args.out)[0] + "_best.pt")
    return run


if __name__ == "__main__":
    main()
