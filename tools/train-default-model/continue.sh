#!/bin/sh
# Continues models/shapes-flux-tiny from its own exported (bf16) weights (3 December 2026, see
# README.md "Continued training"): no .pt checkpoints needed, train_flux.py/train_vae.py --init load the
# folder. Two single-thread processes side by side on the 2-core machine:
#   * stage 2 continued: 40 000 new training pictures (data seed 5) encoded with the folder's (frozen)
#     encoder, the folder's shift/scaling factors kept, AdamW lr 3e-4 (warm-up 100, cosine over the time
#     budget), logit-normal sigma sampling, EMA 0.998; every 12 minutes 64 held-out prompts (seed 99, not
#     the evaluation's) are sampled and scored, the best EMA weights go to runs/r2/flux_best.pt
#   * the decoder alone, on the frozen encoder, MSE + 0.5 L1: phase 1 lr 3e-4, decoder input mean + 0.5 x
#     posterior std x noise, stopped at step 2 600 (~53 min; it had a 106-minute cosine budget); phase 2
#     from there, lr 2e-4, the sampled posterior, 44 min. Every 10 minutes both are scored on
#     reconstructions of true held-out pictures and on decodes of the folder's own generated latents; the
#     best of each phase goes to runs/r2/vae_dec*_best.pt (the shipped decoder: phase 2's, its last step).
#     (A phase with random-RGB colour augmentation, --random-colours 0.5, made both scores worse and was
#     dropped after 10 minutes; it is not in this script.)
# Run it on the folder train.sh exported (running it twice continues twice). Budgets are wall-clock (the
# schedules follow them), so a rerun gives a similar, not bit-identical model. pick.py compares
# checkpoints x decoders x CFG scales on held-out prompts (seed 99) before exporting.
set -eu
. "$(dirname "$0")/env.sh"
R=runs/r2
mkdir -p $R
( $PY train_vae.py --init "$INIT" --decoder-only --threads 1 --minutes 106 --max-steps 2600 --batch 32 --lr 3e-4 \
      --warmup 50 --l1 0.5 --z-noise 0.5 --seed 11 --eval-minutes 10 --eval-n 100 --out $R/vae_dec.pt > $R/vae_dec.log 2>&1
  $PY train_vae.py --init "$INIT" --resume $R/vae_dec.pt --decoder-only --threads 1 --minutes 44 --batch 32 --lr 2e-4 \
      --warmup 20 --l1 0.5 --z-noise 1.0 --seed 13 --eval-minutes 10 --eval-n 100 --out $R/vae_dec3.pt > $R/vae_dec3.log 2>&1 ) &
$PY train_flux.py --init "$INIT" --cli "$CLI" --n-data 40000 --data-seed 5 --threads 1 --minutes 108 --lr 3e-4 \
    --warmup 100 --sigma logit-normal --eval-minutes 12 --eval-n 64 --out $R/flux.pt > $R/flux.log 2>&1
wait
# export (EMA weights, bf16) + parity of the new folder
$PY pick.py --init "$INIT" --flux $R/flux_best.pt $R/flux.pt --dec shipped $R/vae_dec_best.pt $R/vae_dec3_best.pt --cfg 3 2
$PY train_flux.py export $R/vae_dec3_best.pt $R/flux_best.pt "$OUT"
$PY check_parity.py --cli "$CLI" --model "$OUT"
# evaluation through cdiffusers, contact sheet, loss plot (as in train.sh)
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 200 --out $R/eval
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 16 --out $R/eval --rescore --contact-sheet "$REPO/docs/default-model/contact_sheet.png"
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 100 --split train --out $R/eval_train
$PY score_vae_recon.py "$OUT"
$PY plot_losses.py $R loss_curves_continued.png
