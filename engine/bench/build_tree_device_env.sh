# Shared set-up of the build_tree device scripts (sourced; the caller sets OUT's default first): prebuilt
# library, self-test and bt_profile in $BUILD_DIR, the Python package of this tree, a timestamp helper.
set -u
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
build=${BUILD_DIR:?set BUILD_DIR to the folder with libddtree.so, ddtree-selftest and bt_profile}
export DDTREE_LIB=$build/libddtree.so
export PYTHONPATH=$(pwd)/engine/python${BT_EXTRA_PYTHONPATH:-}
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,driver_version --format=csv,noheader || true
