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
# Two test workers share the cores: one ONNX Runtime thread per session (ORT's idle threads spin; with one thread per
# worker the suite takes ~9% less on a busy 2-core machine). A caller's own value is kept.
export WORKBENCH_ORT_THREADS=${WORKBENCH_ORT_THREADS:-1}
python -m pytest -n 2 --dist loadscope --timeout 600 "$@"
