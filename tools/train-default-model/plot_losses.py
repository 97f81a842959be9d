"""Loss curves of the training runs -> PNG.

usage: /usr/bin/python3 plot_losses.py runs/ loss_curves.png
Reads every runs/*_loss.tsv (vae_loss.tsv, vae2_loss.tsv, vae_dec_loss.tsv, flux_loss.tsv).
An optional RUN_DIR/labels.json ({"vae_dec": "...", "flux": "...", "title": "..."}) names the curves.
"""
import json
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def smooth(y, k=50):
    if len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    return np.concatenate([c[1:k] / np.arange(1, k), (c[k:] - c[:-k]) / k])


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(run_dir, "*_loss.tsv")))
    vae = [f for f in files if "vae" in os.path.basename(f)]
    flux = [f for f in files if "flux" in os.path.basename(f)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    # stages in training order, each continuing the step count of the previous one
    order = {"vae": 0, "vae_a": 0, "vae_dec": 1, "vae_dec2": 2}
    vae.sort(key=lambda f: order.get(os.path.basename(f).replace("_loss.tsv", ""), 9))
    labels = {"vae": "encoder + decoder", "vae_dec": "decoder only (at nice 19)", "vae_dec2": "decoder only"}
    lpath = os.path.join(run_dir, "labels.json")
    if os.path.exists(lpath):
        labels = json.load(open(lpath))
    offset = 0
    for f in vae:
        d = np.genfromtxt(f, names=True, delimiter="\t")
        name = os.path.basename(f).replace("_loss.tsv", "")
        axes[0].plot(d["step"] + offset, smooth(d["rec_mse"]), label=labels.get(name, name))
        offset += int(d["step"][-1])
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step, stages one after the other (batch sizes in the legend)")
    axes[0].set_ylabel("reconstruction MSE (pixels in [-1, 1]), 50-step mean")
    axes[0].set_title("stage 1: AutoencoderKL")
    axes[0].legend()
    for f in flux:
        d = np.genfromtxt(f, names=True, delimiter="\t")
        name = os.path.basename(f).replace("_loss.tsv", "")
        axes[1].plot(d["step"], smooth(d["loss"], 100), label=labels.get(name, name))
    axes[1].set_xlabel("step (batch 64)")
    axes[1].set_ylabel("flow-matching MSE, 100-step mean")
    axes[1].set_title("stage 2: CLIP + T5 + FluxTransformer2DModel")
    axes[1].legend()
    for a in axes:
        a.grid(alpha=0.3)
    if "title" in labels:
        fig.suptitle(labels["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
