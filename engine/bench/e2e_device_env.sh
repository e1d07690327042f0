# Shared set-up of the end-to-end device scripts (sourced; the caller sets OUT's default first): the prebuilt
# library ($LIB) and selftest ($SELFTEST), the Python package of this tree, a timestamp helper, a GPU-marked pytest
# under a time limit (pt SECONDS ARGS...), the card's state.
set -u
export PYTHONUNBUFFERED=1
LIB=${LIB:-$PWD/engine/build/libddtree.so}
SELFTEST=${SELFTEST:-$PWD/engine/build/ddtree-selftest}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$LIB
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
pt() { timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu -rs "${@:2}"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader
