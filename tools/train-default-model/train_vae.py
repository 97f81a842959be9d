"""Stage 1: trains the AutoencoderKL on generator pictures (reconstruction MSE + small KL).

usage: /usr/bin/python3 train_vae.py --minutes 15 --out runs/vae.pt
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


def batch(rng, n):
    """Training pictures: training combinations only (held-out ones never seen by any stage)."""
    imgs = [S.render(S.sample_attrs(rng), rng) for _ in range(n)]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x


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
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    vae = M.AutoencoderKL(ex.VAE_CFG)
    if args.resume:
        vae.load_state_dict(torch.load(args.resume)["model"])
    if args.decoder_only:
        ex.round_bf16(vae.encoder)  # the shipped (bf16) encoder gave the transformer's latents
        vae.encoder.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in vae.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    stem = os.path.splitext(os.path.basename(args.out))[0]
    log = open(os.path.join(os.path.dirname(args.out), stem + "_loss.tsv"), "w")
    log.write("step\tseconds\tloss\trec_mse\tkl\n")
    t0, step, ema = time.time(), 0, None
    budget = args.minutes * 60
    while step < args.max_steps and time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for gr in opt.param_groups:  # linear warm-up, cosine decay over the time budget
            gr["lr"] = args.lr * min(1.0, (step + 1) / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * frac)))
        x = batch(rng, args.batch)
        if args.decoder_only:
            with torch.no_grad():
                mean, logvar = vae.encode(x)
        else:
            mean, logvar = vae.encode(x)
        z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
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
    torch.save({"model": vae.state_dict(), "step": step}, args.out)
    print("done", step, "steps", flush=True)


if __name__ == "__main__":
    main()
