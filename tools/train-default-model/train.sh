#!/bin/sh
# The whole recipe of models/shapes-flux-tiny (see README.md). Needs Debian's python3-torch
# (/usr/bin/python3) and a built cdiffusers (for the tokenizers, the parity check and the
# evaluation). Times are wall-clock budgets on 2 shared CPU cores; the schedules follow them.
set -eu
. "$(dirname "$0")/env.sh"
mkdir -p runs
# 0. cdiffusers runs our torch model code exactly (random weights, every component + generate)
$PY check_parity.py --cli "$CLI"
# 1. AutoencoderKL, reconstruction + KL (16 min)
$PY train_vae.py --minutes 16 --batch 16 --out runs/vae.pt
# 2. text encoders + transformer on the (now frozen) encoder's latents (60 min); alongside, at
#    nice 19 (spare cycles only; the shipped run started it at nice 0 and reniced it after 7 min),
#    the decoder alone on the same frozen encoder
nice -n 19 $PY train_vae.py --resume runs/vae.pt --decoder-only --minutes 25 --batch 16 --lr 5e-4 --l1 0.5 \
    --seed 1 --out runs/vae_dec.pt &
$PY train_flux.py --vae runs/vae.pt --cli "$CLI" --minutes 60 --out runs/flux.pt
wait
# 2b. the decoder alone once more, now with the whole machine (5 min)
$PY train_vae.py --resume runs/vae_dec.pt --decoder-only --minutes 5 --batch 16 --lr 3e-4 --l1 0.5 --seed 2 \
    --out runs/vae_dec2.pt
# 3. export (EMA weights, bf16) with the fine-tuned decoder; parity of the trained folder
$PY train_flux.py export runs/vae_dec2.pt runs/flux.pt "$REPO/models/shapes-flux-tiny"
$PY check_parity.py --cli "$CLI" --model "$REPO/models/shapes-flux-tiny"
# 4. evaluation through cdiffusers (default model), contact sheet (its first 16), loss plot
$PY evaluate.py --cli "$CLI" --n 200 --out runs/eval
$PY evaluate.py --cli "$CLI" --n 16 --out runs/eval --rescore --contact-sheet "$REPO/docs/default-model/contact_sheet.png"
$PY evaluate.py --cli "$CLI" --n 100 --split train --out runs/eval_train
$PY score_vae_recon.py
$PY plot_losses.py runs loss_curves.png
# 5. (3 December 2026) the shipped folder = the above, continued from its own exported weights for ~108 more
#    minutes (stage 2) and ~97 minutes (decoder); export, parity, evaluation, contact sheet: continue.sh
sh "$HERE/continue.sh"
# 6. (3 December 2026, afternoon) the shipped folder = the above, then a VAE retrained with random-colour
#    augmentation and stage 2 continued on its latents; export, parity, evaluation: recolour.sh
sh "$HERE/recolour.sh"
