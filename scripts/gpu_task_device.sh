#!/usr/bin/env bash
# The one command for the GPU machine, run from the repository root:
#     bash scripts/gpu_task_device.sh [CASES]
# Needs CASES (default .gpu/cases: the folder scripts/gpu_task_cases.py or gpu_transformer_cases.py wrote) and .gpu/whl/onnx2torch-*.whl (pure Python; the
# machine has torch, torchvision, onnx, numpy). Installs the wheel into /tmp/site, prints the GPU and versions,
# runs scripts/gpu_task_check.py under `timeout 300` and writes its JSON/table (and this log) to $OUT.
# Overrides for a local test: GPU_TASK_DEVICE=cpu (a labelled dry run), GPU_TASK_PYTHON, GPU_TASK_SITE.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results}"
PY="${GPU_TASK_PYTHON:-python3}"
SITE="${GPU_TASK_SITE:-/tmp/site}"
DEVICE="${GPU_TASK_DEVICE:-cuda}"
CASES="${1:-.gpu/cases}"
mkdir -p "$OUT"
ls .gpu/whl/*.whl "$CASES/cases.json" >/dev/null
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu/whl/*.whl
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  "$PY" -c "import torch, onnx, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cuda available', torch.cuda.is_available(), 'cudnn', torch.backends.cudnn.version(), 'onnx', onnx.__version__, \
'numpy', numpy.__version__)"
  PYTHONUNBUFFERED=1 timeout 300 "$PY" scripts/gpu_task_check.py --cases "$CASES" --device "$DEVICE" --out "$OUT"
} 2>&1 | tee "$OUT/gpu_task_device.log"
