#!/usr/bin/env bash
# Create ./.venv and install the workbench with everything that installs on a CPU machine.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.workbench-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # torch first and pinned: an unpinned torch would pull GBs of CUDA packages.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[all,dev]"
  touch "$stamp"
fi
# The package's bytecode, as pip writes it for a regular install (an editable one writes none, and with
# PYTHONDONTWRITEBYTECODE set Python never does): every `workbench` command then starts ~0.07 s sooner. Quick when
# nothing changed; a stale file is recompiled in memory by Python, as without it.
python -m compileall -q workbench
python -c "import workbench, onnx, onnxruntime; print('workbench', workbench.__version__, '| onnx', onnx.__version__, '| onnxruntime', onnxruntime.__version__)"
