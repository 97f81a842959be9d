"""Held-out evaluation through cdiffusers: generates pictures for held-out prompts with the
`cdiffusers generate` CLI (the trained folder loaded by the C library, not by the training code)
and scores each requested attribute with pixel statistics.

usage: /usr/bin/python3 evaluate.py --cli build/cdiffusers [--model DIR] [--n 200] [--out DIR]
       /usr/bin/python3 evaluate.py --self-test     (the scorer on the generator's own pictures)
       /usr/bin/python3 evaluate.py --contact-sheet docs/default-model/contact_sheet.png --n 16 ...
Without --model the CLI's default model is used (models/shapes-flux-tiny).

Scorer (no learned parts):
  background = the palette colour most pixels are nearest to;
  colour     = the palette colour (other than the background) most of the remaining pixels that
               are far (> 80 in RGB distance) from the background are nearest to;
  mask       = pixels nearer the shape colour than the background colour;
  position   = 3x3 grid cell of the mask's centroid (cell borders at 24 and 40 px);
  size       = small/medium/large whose reference area (the requested shape drawn at that size)
               is nearest to the mask's area (log scale);
  shape      = the shape whose template (any radius 4..19 px, drawn so that its centroid is the mask's)
               has the highest IoU with the mask.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes as S  # noqa: E402

NAMES = list(S.COLOURS)
PAL = np.array([S.COLOURS[c] for c in NAMES], np.float32)
RADII = np.arange(4.0, 19.5, 0.5)
_TEMPLATES = None


def templates():
    """(shape, radius) -> (binary mask drawn at the image centre, centroid offset)"""
    global _TEMPLATES
    if _TEMPLATES is None:
        _TEMPLATES = {}
        yy, xx = np.mgrid[0:S.RES, 0:S.RES] + 0.5
        for s in S.SHAPES:
            for r in RADII:
                m = S.shape_mask(s, 32.0, 32.0, r, ss=2) > 0.5
                _TEMPLATES[s, r] = (m, (xx[m].mean() - 32.0, yy[m].mean() - 32.0))
    return _TEMPLATES


def ref_area(shape, size):
    return (S.shape_mask(shape, 32.0, 32.0, S.SIZES[size], ss=2) > 0.5).sum()


def score_image(img, want_shape):
    """img uint8 [64,64,3] -> dict of detected attributes."""
    px = img.reshape(-1, 3).astype(np.float32)
    d = ((px[:, None, :] - PAL[None]) ** 2).sum(-1)  # [N, 8]
    cls = d.argmin(1)
    bg = np.bincount(cls, minlength=len(NAMES)).argmax()
    far = d[:, bg] > 80.0 ** 2
    res = {"bg": NAMES[bg]}
    if far.sum() < 4:
        return dict(res, colour=None, shape=None, position=None, size=None)
    dd = d[far].copy()
    dd[:, bg] = np.inf
    fg = np.bincount(dd.argmin(1), minlength=len(NAMES)).argmax()
    res["colour"] = NAMES[fg]
    mask = (d[:, fg] < d[:, bg]).reshape(S.RES, S.RES)
    yy, xx = np.mgrid[0:S.RES, 0:S.RES] + 0.5
    if mask.sum() < 4:
        return dict(res, shape=None, position=None, size=None)
    mx, my = xx[mask].mean(), yy[mask].mean()
    cell = lambda v: 0 if v < 24 else (1 if v < 40 else 2)
    rc = (cell(my), cell(mx))
    res["position"] = next(k for k, v in S.POSITIONS.items() if v == rc)
    area = mask.sum()
    res["size"] = min(S.SIZES, key=lambda z: abs(np.log(area / ref_area(want_shape, z))))
    best, best_iou = None, -1.0
    for (s, r), (t, (ox, oy)) in templates().items():
        ts = S.shape_mask(s, mx - ox, my - oy, r, ss=2) > 0.5  # drawn at the sub-pixel centre
        iou = (ts & mask).sum() / max(1, (ts | mask).sum())
        if iou > best_iou:
            best, best_iou = s, iou
    res["shape"] = best
    res["shape_iou"] = float(best_iou)
    return res


def expected(a):
    return {"shape": a["shape"], "colour": a["colour"], "bg": a["bg"], "size": a.get("size") or "medium",
            "position": a.get("position") or "center"}


ATTRS = ["shape", "colour", "bg", "size", "position"]


def eval_prompts(n, seed=1234, heldout=True):
    rng = np.random.default_rng(seed)
    return [S.sample_attrs(rng, heldout=heldout) for _ in range(n)]


def summarise(rows):
    acc = {k: float(np.mean([r["got"][k] == r["want"][k] for r in rows])) for k in ATTRS}
    acc["all_five"] = float(np.mean([all(r["got"][k] == r["want"][k] for k in ATTRS) for r in rows]))
    return acc


def heldout_splits(rows):
    """-> [(name, rows)]: the rows whose colour x shape, then colour x background, pair is held out
    (a prompt can be in both)."""
    return [(name, [r for r in rows if (r["want"]["colour"], r["want"][key]) in held])
            for name, held, key in (("colour x shape", S.HOLDOUT_SHAPE_COLOUR, "shape"),
                                    ("colour x background", S.HOLDOUT_COLOUR_BG, "bg"))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(S.__file__.rsplit("/tools/", 1)[0], "build", "cdiffusers"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default="/tmp/cdf_eval")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--split", choices=["heldout", "train"], default="heldout",
                    help="held-out combinations (default) or combinations seen in training, for comparison")
    ap.add_argument("--contact-sheet", default=None)
    ap.add_argument("--rescore", action="store_true", help="score the PNGs already in --out, generate only missing ones")
    ap.add_argument("--threads", type=int, default=1,
                    help="generate --threads (1: the pictures are tiny; 2 OpenMP threads on a busy 2-core machine spin)")
    ap.add_argument("--extra", default="", help="extra generate arguments, one string (shell syntax)")
    args = ap.parse_args()
    prompts = eval_prompts(args.n, args.seed, heldout=args.split == "heldout")
    rows = []
    os.makedirs(args.out, exist_ok=True)
    t_gen = 0.0
    for i, a in enumerate(prompts):
        cap = S.caption(a)
        if args.self_test:
            img = S.render(a, np.random.default_rng(i))
        else:
            png = os.path.join(args.out, f"{i:03d}.png")
            cmd = [args.cli, "generate", "--prompt", cap, "--seed", str(i), "--output", png, "--force", "--quiet",
                   "--threads", str(args.threads)]
            cmd += (["--model", args.model] if args.model else []) + shlex.split(args.extra)
            t0 = time.time()
            if not (args.rescore and os.path.exists(png)):
                subprocess.run(cmd, check=True)
            t_gen += time.time() - t0
            from PIL import Image
            img = np.asarray(Image.open(png).convert("RGB"))
        got = score_image(img, a["shape"])
        rows.append({"prompt": cap, "seed": i, "want": expected(a), "got": got})
    acc = summarise(rows)
    with open(os.path.join(args.out, "scores.json"), "w") as f:
        json.dump({"accuracy": acc, "n": len(rows), "rows": rows}, f, indent=1)
    print(f"n={len(rows)}", " ".join(f"{k}={v:.3f}" for k, v in acc.items()))
    if args.split == "heldout":
        for name, sub in heldout_splits(rows):
            print(f"  held-out {name} pairs: n={len(sub)}", " ".join(f"{k}={v:.3f}" for k, v in summarise(sub).items()))
    if not args.self_test:
        print(f"mean generate wall time per image (CLI process incl. load): {t_gen / len(rows):.2f}s")
    if args.contact_sheet:
        contact_sheet(args.out, rows, args.contact_sheet)


def contact_sheet(img_dir, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image
    n = len(rows)
    cols = 4
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(cols * 2.6, ((n + cols - 1) // cols) * 2.9), dpi=100)
    for ax in axes.flat:
        ax.axis("off")
    for i, (ax, r) in enumerate(zip(axes.flat, rows)):
        ax.imshow(np.asarray(Image.open(os.path.join(img_dir, f"{i:03d}.png")).convert("RGB")), interpolation="nearest")
        words = r["prompt"].split(" on ")
        ax.set_title(words[0] + "\non " + words[1], fontsize=7.5)
    fig.suptitle("cdiffusers generate, default model shapes-flux-tiny, held-out prompts (seed = index)", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    print("wrote", path)


if __name__ == "__main__":
    main()
