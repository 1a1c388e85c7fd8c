#!/usr/bin/env bash
# Set up (scripts/setup.sh) and open the workbench in JupyterLab on the quickstart notebook.
# Extra arguments go to JupyterLab (e.g. --no-browser --port 8890).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# the bundled notebooks are saved with widget state; JupyterLab draws saved widgets only in trusted notebooks
python -m jupyter trust notebooks/*.ipynb >/dev/null
extra=()
if [ "$(id -u)" = "0" ]; then extra+=(--allow-root); fi
exec python -m jupyterlab --ServerApp.root_dir="$PWD" --LabApp.default_url=/lab/tree/notebooks/quickstart.ipynb "${extra[@]}" "$@"
