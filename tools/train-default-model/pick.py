"""Chooses what continue.sh exports: samples held-out prompts (seed 99, not evaluate.py's 1234) with each
stage-2 checkpoint's EMA weights (torch sampler, the CLI's defaults, true CFG scale(s) given) and decodes
the same latents with each candidate decoder; prints the scorer's accuracies for every combination.

usage: /usr/bin/python3 pick.py --init DIR --flux A.pt [B.pt ...] --dec shipped|C.pt [...] [--cfg 3] [--n 128]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as ex  # noqa: E402
import shapes as S  # noqa: E402
import train_flux as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--flux", nargs="+", required=True)
    ap.add_argument("--dec", nargs="+", required=True)
    ap.add_argument("--cfg", nargs="+", type=float, default=[3.0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vae, clip, t5, flux, vcfg = T.load_folder(args.init)
    decs = {}
    for d in args.dec:
        v = T.load_folder(args.init)[0] if d == "shipped" else None
        if v is None:
            v = type(vae)(vcfg)
            v.load_state_dict(torch.load(d)["model"])
            ex.round_bf16(v)  # what the export will hold
        decs[d] = v.eval()
    tok = S.Tokenizer(os.path.join(ex.REPO, "build", "cdiffusers"), "", os.path.join(ex.HERE, "runs", "r2", "tokens.json"),
                      ex.T5_LEN)
    print("flux\tcfg\tdecoder\tshape\tcolour\tsize\tposition\tbg\tall_five")
    for f in args.flux:
        ck = torch.load(f)
        for m, sd in zip((clip, t5, flux), ck["ema"]):
            m.load_state_dict(sd)
            ex.round_bf16(m)
            m.eval()
        for cfg in args.cfg:
            # the checkpoint's latent factors (a --new-vae stage 2 measured its own)
            vc = dict(vcfg, scaling_factor=ck["scale"], shift_factor=ck["shift"])
            ps, z = T.sample_and_score(vae, vc, clip, t5, flux, tok, 77, n=args.n, cfg_scale=cfg, latents_only=True)
            for d, v in decs.items():
                a = T.score_decoded(v, z, ps)
                print(f"{os.path.basename(f)}@{ck['step']}\t{cfg}\t{os.path.basename(d)}\t" +
                      "\t".join(f"{a[k]:.3f}" for k in ("shape", "colour", "size", "position", "bg", "all_five")),
                      flush=True)


if __name__ == "__main__":
    main()
