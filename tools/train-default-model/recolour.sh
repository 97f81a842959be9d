#!/bin/sh
# Third training round of models/shapes-flux-tiny (3 December 2026, afternoon; see README.md
# "Round 3: a VAE that generalises colour"). The shipped VAE could not reconstruct held-out colour x
# background pairs (a blue square on yellow came back green: reconstruction colour 35% on those
# pairs), so no transformer could draw them. This round:
#   1. the whole VAE (encoder too), from the folder's VAE, with 60% of the pictures in random RGB
#      shape/background colours (train_vae.py --random-colours; a random pair whose nearest palette
#      colours form a held-out colour x background pair is redrawn, so nothing held out is seen);
#      22 minutes, one thread (a from-scratch run with the same recipe beside it was worse and was
#      not used);
#   2. side by side, one thread each:
#      * stage 2 from the folder's text encoders and transformer on 32 000 pictures encoded with the
#        new VAE (new shift/scaling factors measured), lr 5e-4, logit-normal sigmas, EMA 0.998; every
#        12 minutes 64 held-out prompts (seed 99, not the evaluation's 1234) scored, best kept;
#      * the new decoder alone on the frozen new encoder (30% random colours, L1 + MSE);
#   3. pick.py, export, parity, evaluation.
# Budgets are wall-clock, so a rerun gives a similar, not bit-identical model.
set -eu
. "$(dirname "$0")/env.sh"
R=runs/r3
mkdir -p $R
$PY train_vae.py --init "$INIT" --threads 1 --minutes 22 --batch 16 --lr 5e-4 --warmup 50 --l1 0.5 \
    --random-colours 0.6 --seed 21 --out $R/vae_a.pt > $R/vae_a.log 2>&1
$PY score_vae_recon.py $R/vae_a.pt
$PY train_vae.py --resume $R/vae_a.pt --decoder-only --threads 1 --minutes 85 --batch 32 --lr 2e-4 --warmup 20 \
    --l1 0.5 --z-noise 0.7 --random-colours 0.3 --seed 23 --out $R/vae_dec.pt > $R/vae_dec.log 2>&1 &
$PY train_flux.py --init "$INIT" --new-vae $R/vae_a.pt --cli "$CLI" --n-data 32000 --data-seed 7 --threads 1 \
    --minutes 88 --lr 5e-4 --warmup 100 --sigma logit-normal --eval-minutes 12 --eval-n 64 --out $R/flux.pt \
    > $R/flux.log 2>&1
wait
$PY pick.py --init "$INIT" --flux $R/flux_best.pt $R/flux.pt --dec $R/vae_a.pt $R/vae_dec.pt --cfg 3 4
$PY train_flux.py export $R/vae_dec.pt $R/flux.pt "$OUT"  # the last EMA weights: they tied with flux_best.pt
$PY check_parity.py --cli "$CLI" --model "$OUT"
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 200 --out $R/eval
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 16 --out $R/eval --rescore --contact-sheet "$REPO/docs/default-model/contact_sheet.png"
$PY evaluate.py --cli "$CLI" --model "$OUT" --n 100 --split train --out $R/eval_train
N=200 $PY score_vae_recon.py "$OUT"
$PY plot_losses.py $R loss_curves_round3.png
