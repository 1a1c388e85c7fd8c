#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite: ruff, then pytest (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Browser tests drive Debian's Chromium (never `playwright install`): install it once, quietly, when missing.
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver) \
    >/dev/null 2>&1 || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
ruff check .
# Four test workers on two cores: the JupyterLab modules run on one of them (tests/conftest.py) and mostly wait on the
# browser and the kernel, the other three keep the cores busy meanwhile (and get their share of a machine another
# job is busy on: 14:19 for two workers next to a busy loop against 10:54-12:40 for four, when measured side by side). One ONNX Runtime thread per
# session (ORT's idle threads spin on a shared machine); a caller's own value is kept. Scopes go out in conftest.py's
# order. Likewise one BLAS/OpenMP thread (numpy's OpenBLAS, torch): their idle threads spin too (a repair on onnx's
# reference evaluator, many small matrix products: 3.1 s of CPU with OpenBLAS's two threads, 2.0 s with one).
export WORKBENCH_ORT_THREADS=${WORKBENCH_ORT_THREADS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
python -m pytest -n 4 --dist loadscope --no-loadscope-reorder --timeout 600 "$@"
