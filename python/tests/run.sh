#!/usr/bin/env bash
# ctest's `python` test: the package's pytest suite against the module in the build tree.
#   run.sh PYTHON BUILD_PYTHON_DIR
# Exits 77 (ctest: skipped) with a message when pytest or numpy is missing for that interpreter.
set -euo pipefail
py=$1 pkg=$2
for m in pytest numpy; do
  if ! "$py" -c "import $m" 2>/dev/null; then
    echo "python tests skipped: $py has no $m (apt install python3-$m)"
    exit 77
  fi
done
cd "$(dirname "$0")"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=PASSIVE
exec "$py" -m pytest -q -p no:cacheprovider -rs .
