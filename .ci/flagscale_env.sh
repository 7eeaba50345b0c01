#!/usr/bin/env bash
# Build (once) the Python 3.12 environment that holds FlagScale's own argument parsing and
# heterogeneous validation (flag-scale 0.8.0: flagscale/train/hetero/*, flagscale/train/arguments.py,
# its Megatron-LM fork with the --hetero-* flags, its runner and its auto-tuner), outside the
# clone, and print the path of its python on stdout.  tools/flagscale_validate.py and
# tools/flagscale_autotune.py run with that python.
#
#   HAPMOE_FLAGSCALE_ENV   where the environment lives (default ~/.cache/hapmoe/flagscale-venv)
#   HAPMOE_PYTHON312       the Python 3.12 interpreter (default: pyenv's 3.12, then python3.12)
#   HAPMOE_FLAGSCALE_OWN_TORCH=1   install torch into this environment instead of borrowing the
#                          Megatron validator environment's (several GB; only when that one cannot
#                          be built)
#
# torch: flag-scale pins a CUDA torch 2.7.1; it is installed with --no-deps and runs on the
# torch 2.13.0 of the Megatron validator environment (.ci/megatron_env.sh, built first if
# missing): a .pth file appends that environment's site-packages to this one's sys.path, after
# FlagScale's own directories.  The import names are FlagScale's runner's (its run scripts export
# PYTHONPATH=<flag_scale>:<flag_scale>/third_party/Megatron-LM): `flagscale` is
# site-packages/flag_scale/flagscale and `megatron` is FlagScale's Megatron-LM fork
# (site-packages/flag_scale/third_party/Megatron-LM/megatron, megatron-core 0.15.0rc5 patched),
# which comes before megatron-core 0.19.2 of the borrowed site-packages; the import check below
# fails the build if any other `megatron` wins.
#
# Exit status 0 with the python path on stdout when the environment is ready; non-zero (and the
# reason on stderr) when it cannot be built.  A failed build leaves nothing half-made: the
# environment is built in a temporary directory and moved into place when its import check
# passes.
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ENV_DIR="${HAPMOE_FLAGSCALE_ENV:-$HOME/.cache/hapmoe/flagscale-venv}"
FLAGSCALE_VERSION="0.8.0"
TORCH_VERSION="2.13.0"
# What FlagScale's argument, hetero-validation, runner (YAML -> args) and auto-tuner code import,
# beyond torch/numpy/packaging: measured by importing them (megatron.training.arguments needs six and
# regex; flagscale.runner needs omegaconf, hydra-core, aiohttp, tqdm; the auto-tuner pandas, psutil).
DEPS=(six regex omegaconf "hydra-core" aiohttp tqdm pandas psutil pyyaml)
OWN_TORCH="${HAPMOE_FLAGSCALE_OWN_TORCH:-0}"

BORROWED_SP=""
TORCH_FROM="own"
if [[ "$OWN_TORCH" != 1 ]]; then
    if MEGATRON_PY="$(bash "$HERE/megatron_env.sh")"; then
        BORROWED_SP="$("$MEGATRON_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
        MEGATRON_STAMP="$(cat "$(dirname "$(dirname "$MEGATRON_PY")")/.hapmoe-ready" 2>/dev/null)"
        TORCH_FROM="$BORROWED_SP ($MEGATRON_STAMP)"
    else
        echo "flagscale_env: the Megatron validator environment could not be built; installing torch here" >&2
        OWN_TORCH=1
    fi
fi
STAMP="flag-scale==${FLAGSCALE_VERSION} torch==${TORCH_VERSION} from ${TORCH_FROM} deps: ${DEPS[*]}"

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
    echo "flagscale_env: no Python 3.12 found (set HAPMOE_PYTHON312)" >&2
    exit 1
fi

mkdir -p "$(dirname "$ENV_DIR")"
TMP="$(mktemp -d "$(dirname "$ENV_DIR")/.flagscale-venv-build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
echo "flagscale_env: building $STAMP with $PY312 in $ENV_DIR (first time only)" >&2
"$PY312" -m venv "$TMP" || { echo "flagscale_env: venv creation failed" >&2; exit 1; }
SP="$("$TMP/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$TMP/bin/python" -m pip install --quiet --no-deps "flag-scale==${FLAGSCALE_VERSION}" >&2 \
    || { echo "flagscale_env: pip install --no-deps flag-scale==${FLAGSCALE_VERSION} failed" >&2; exit 1; }
# Relative lines in a .pth file are taken relative to site-packages, so the two FlagScale lines
# survive the move below.  The borrowed site-packages comes last: its megatron-core must not win.
{
    echo "flag_scale"
    echo "flag_scale/third_party/Megatron-LM"
    [[ -n "$BORROWED_SP" ]] && echo "$BORROWED_SP"
} > "$SP/hapmoe-flagscale.pth"
if [[ "$OWN_TORCH" == 1 ]]; then
    "$TMP/bin/python" -m pip install --quiet "torch==${TORCH_VERSION}" numpy "packaging>=24.2" >&2 \
        || { echo "flagscale_env: pip install torch==${TORCH_VERSION} failed" >&2; exit 1; }
fi
# pip sees the borrowed torch/numpy/packaging through the .pth and leaves them where they are
# (it warns that flag-scale wants torch 2.7.1: expected).
"$TMP/bin/python" -m pip install --quiet "${DEPS[@]}" 2>"$TMP/.pip-deps.log" >&2 \
    || { echo "flagscale_env: pip install ${DEPS[*]} failed" >&2; tail -n 5 "$TMP/.pip-deps.log" >&2; exit 1; }
# venvs are not relocatable: rebuild the scripts' paths by recreating in place after the move
rm -rf "$ENV_DIR"
mv "$TMP" "$ENV_DIR" && trap - EXIT
"$PY312" -m venv --upgrade "$ENV_DIR" >/dev/null 2>&1 || true
sed -i "s#$TMP#$ENV_DIR#g" "$ENV_DIR"/bin/* 2>/dev/null || true
CHECK='
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch, megatron, flagscale
root = os.path.dirname(os.path.dirname(os.path.abspath(flagscale.__file__)))
fork = os.path.join(root, "third_party", "Megatron-LM", "megatron")
assert os.path.dirname(os.path.abspath(megatron.__file__)) == fork, f"megatron is {megatron.__file__}, not FlagScale fork {fork}"
assert torch.__version__.split("+")[0] == sys.argv[1], f"torch {torch.__version__}"
import megatron.training.arguments, megatron.training.initialize
import flagscale.train.arguments, flagscale.train.hetero.parallel_context
import flagscale.runner.runner_train, flagscale.runner.auto_tuner.hetero
print(megatron.__file__)
'
if ! "$ENV_DIR/bin/python" -c "$CHECK" "$TORCH_VERSION" >"$ENV_DIR/.import-check.log" 2>&1; then
    echo "flagscale_env: import check failed (see $ENV_DIR/.import-check.log)" >&2
    tail -n 5 "$ENV_DIR/.import-check.log" >&2
    rm -f "$ENV_DIR/.hapmoe-ready"
    exit 1
fi
echo "$STAMP" > "$ENV_DIR/.hapmoe-ready"
echo "flagscale_env: built in $(( $(date +%s) - start )) s" >&2
echo "$ENV_DIR/bin/python"
