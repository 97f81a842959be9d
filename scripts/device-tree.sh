#!/usr/bin/env bash
# Shrinks the working tree the device tool copies to the GPU machine (it takes tracked files and
# untracked ones git does not ignore, 64 MiB in all with the carried .devbundle), and puts it
# back. The test data is about twice that; scripts/device-check.sh needs only part of it.
#
#   scripts/device-tree.sh trim [PATH...]   untrack PATHs (default: the data device-check.sh does
#                                           not read) and ignore them locally; prints the size left
#   scripts/device-tree.sh restore          the index back to HEAD, the local ignore list back
#
# trim refuses to run with staged changes (restore resets the index to HEAD, which would drop
# them). Nothing is deleted from the disk and no commit is made: only the index and
# .git/info/exclude change until restore.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
EXCLUDE="$(git rev-parse --git-path info/exclude)"
BACKUP="$EXCLUDE.device-tree-backup"

# what device-check.sh never reads: the FLUX.2 text model and golden text models (its golden
# script runs the transformers, VAEs and tiny pipelines), the shape-test model, and the data of
# img2img, LoRA, RNG, I/O and VAE-tiling tests (CPU tests)
DEFAULT=(tests/data/golden/flux2_text tests/data/golden/text_models tests/data/golden/img2img
  models/shapes-flux-tiny tests/data/lora tests/data/rng tests/data/io tests/data/vae_tiling)

case "${1:-}" in
trim)
  shift
  [ -e "$BACKUP" ] && { echo "device-tree: already trimmed (run restore first)" >&2; exit 1; }
  git diff --cached --quiet || { echo "device-tree: staged changes; commit or unstage them first" >&2; exit 1; }
  paths=("$@")
  [ ${#paths[@]} -eq 0 ] && paths=("${DEFAULT[@]}")
  cp "$EXCLUDE" "$BACKUP"
  for p in "${paths[@]}"; do
    git rm -r -q --cached --ignore-unmatch -- "$p"
    echo "/$p" >>"$EXCLUDE"
  done
  tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  bundle=$(du -sb .devbundle 2>/dev/null | cut -f1 || echo 0)
  echo "device-tree: tree $((tracked / 1048576)) MiB + .devbundle $((${bundle:-0} / 1048576)) MiB (limit 64 MiB)"
  ;;
restore)
  [ -e "$BACKUP" ] || { echo "device-tree: nothing to restore" >&2; exit 1; }
  git reset -q
  mv "$BACKUP" "$EXCLUDE"
  echo "device-tree: index and ignore list restored"
  ;;
*)
  echo "usage: scripts/device-tree.sh trim [PATH...] | restore" >&2
  exit 2
  ;;
esac
