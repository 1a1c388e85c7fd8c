#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite: ruff, then pytest (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
python -m pytest -n 2 --timeout 600 "$@"
