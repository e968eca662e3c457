#!/usr/bin/env bash
# Installs what the JupyterLab browser test needs and nothing else:
# Debian's chromium (Playwright's own browser download is not reachable here, and
# `playwright install` would fetch it from a CDN) and Playwright's Python package
# plus JupyterLab (the project's `lab` extra) into the project venv.
# Idempotent: it skips what is already installed, so `make test-ui` stays quick on reruns.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"

if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests/ui/install.sh: chromium is missing and installing it needs root (apt-get install chromium)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# The `ui` extra (pyproject.toml) pins jupyterlab and playwright's Python package.
# Never `playwright install`: the test drives /usr/bin/chromium through executable_path.
if ! "$PY" -c 'import jupyterlab, playwright' >/dev/null 2>&1; then
    "$PY" -m pip install --quiet -e '.[dev,ui]'
fi

echo "chromium: $(chromium --version 2>/dev/null || echo missing)"
echo "playwright: $("$PY" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
echo "jupyterlab: $("$PY" -c 'import jupyterlab; print(jupyterlab.__version__)')"
