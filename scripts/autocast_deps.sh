#!/usr/bin/env bash
# ModelOpt AutoCast's ONNX extras, installed beside the project rather than into it:
#     bash scripts/autocast_deps.sh [DIR]        (default DIR: ~/.cache/onnx-drift-workbench/autocast-deps)
#     AUTOCAST_PYTHONPATH=DIR python benchmarks/bench_repair_anchors.py ...
# `pip install nvidia-modelopt[onnx]` would also pull onnxruntime-gpu, which shares the `onnxruntime` module with the
# CPU package the project runs on and breaks it; these four (AutoCast's own imports, no GPU runtime) go into a
# folder of their own with --no-deps, and the benchmark puts that folder on AutoCast's PYTHONPATH only.
set -euo pipefail
DIR="${1:-$HOME/.cache/onnx-drift-workbench/autocast-deps}"
PY="${PYTHON:-python}"
mkdir -p "$DIR"
"$PY" -m pip install -q --no-deps --target "$DIR" onnx-graphsurgeon==0.6.1 onnxslim==0.1.98 lief==1.0.0 \
    cppimport==26.4.17
AUTOCAST_PYTHONPATH="$DIR" "$PY" - <<'PY'
import os, sys
sys.path.insert(0, os.environ["AUTOCAST_PYTHONPATH"])
import modelopt.onnx.autocast  # noqa: F401  (fails here, not in the benchmark, when something is missing)
print("AutoCast imports with", os.environ["AUTOCAST_PYTHONPATH"])
PY
echo "export AUTOCAST_PYTHONPATH=$DIR"
