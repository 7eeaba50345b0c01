#!/usr/bin/env bash
# Build (once) the Python 3.12 environment that holds Megatron-LM's own argument validator
# (megatron-core 0.19.2 with megatron.training, and torch), outside the clone, and print the path
# of its python on stdout.  The validator tests (tests/test_megatron_validator.py) use it to check
# every emitted launcher against Megatron itself; reference/megatron.md section 5 says why it
# needs Python >= 3.12 and what the CPU-only run needs.
#
#   HAPMOE_MEGATRON_ENV   where the environment lives (default ~/.cache/hapmoe/megatron-venv)
#   HAPMOE_PYTHON312      the Python 3.12 interpreter (default: pyenv's 3.12, then python3.12)
#
# Exit status 0 with the python path on stdout when the environment is ready; non-zero (and the
# reason on stderr) when it cannot be built.  A failed build leaves nothing half-made: the
# environment is built in a temporary directory and moved into place when its import check
# passes.
set -uo pipefail

ENV_DIR="${HAPMOE_MEGATRON_ENV:-$HOME/.cache/hapmoe/megatron-venv}"
MCORE_VERSION="0.19.2"
TORCH_VERSION="2.13.0"
STAMP="megatron-core==${MCORE_VERSION} torch==${TORCH_VERSION}"

ready() {
    [[ -x "$ENV_DIR/bin/python" && -f "$ENV_DIR/.hapmoe-ready" ]] \
        && [[ "$(cat "$ENV_DIR/.hapmoe-ready")" == "$STAMP" ]]
}

if ready; then
    echo "$ENV_DIR/bin/python"
    exit 0
fi

PY312="${HAPMOE_PYTHON312:-}"
if [[ -z "$PY312" ]]; then
    for cand in "$HOME/.pyenv/versions/3.12.1/bin/python3.12" "$(command -v python3.12 || true)"; do
        if [[ -n "$cand" && -x "$cand" ]]; then PY312="$cand"; break; fi
    done
    if [[ -z "$PY312" && -d "$HOME/.pyenv/versions" ]]; then
        PY312="$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1)"
    fi
fi
if [[ -z "$PY312" || ! -x "$PY312" ]]; then
    echo "megatron_env: no Python 3.12 found (set HAPMOE_PYTHON312)" >&2
    exit 1
fi

mkdir -p "$(dirname "$ENV_DIR")"
TMP="$(mktemp -d "$(dirname "$ENV_DIR")/.megatron-venv-build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
echo "megatron_env: building $STAMP with $PY312 in $ENV_DIR (first time only)" >&2
"$PY312" -m venv "$TMP" || { echo "megatron_env: venv creation failed" >&2; exit 1; }
# torch's Linux wheels on PyPI carry CUDA libraries; they import and run fine without a GPU.
# The machine's pip constraints file caps torch; the pins here are within it.
"$TMP/bin/python" -m pip install --quiet "torch==${TORCH_VERSION}" "numpy" "packaging>=24.2" >&2 \
    || { echo "megatron_env: pip install torch==${TORCH_VERSION} failed" >&2; exit 1; }
"$TMP/bin/python" -m pip install --quiet --no-deps "megatron-core==${MCORE_VERSION}" >&2 \
    || { echo "megatron_env: pip install megatron-core==${MCORE_VERSION} failed" >&2; exit 1; }
# venvs are not relocatable: rebuild the scripts' paths by recreating in place after the move
rm -rf "$ENV_DIR"
mv "$TMP" "$ENV_DIR" && trap - EXIT
"$PY312" -m venv --upgrade "$ENV_DIR" >/dev/null 2>&1 || true
sed -i "s#$TMP#$ENV_DIR#g" "$ENV_DIR"/bin/* 2>/dev/null || true
if ! "$ENV_DIR/bin/python" -c "import torch, megatron.training.arguments" >/dev/null 2>"$ENV_DIR/.import-check.log"; then
    echo "megatron_env: import check failed (see $ENV_DIR/.import-check.log)" >&2
    tail -n 5 "$ENV_DIR/.import-check.log" >&2
    exit 1
fi
echo "$STAMP" > "$ENV_DIR/.hapmoe-ready"
echo "megatron_env: built in $(( $(date +%s) - start )) s" >&2
echo "$ENV_DIR/bin/python"
