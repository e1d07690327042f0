#!/usr/bin/env bash
# One device call for tree_attention: build (sm_90a, this op only), ddtree-selftest on both MMA back
# ends, compute-sanitizer (memcheck + racecheck on small shapes), GPU pytest vs the fp32 reference on
# both back ends, bench table (wgmma default with torch SDPA + flex; mma.sync without flex).
# Logs go to $OUT. STAGES (default "build selftest sanitize pytest bench") picks stages.
# Run from the repository root:  bash engine/bench/run_tree_attention_device.sh
set -u
OUT=${OUT:-/tmp/tree_attention_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-"build selftest sanitize pytest bench"}
ARCHS=${ARCHS:-90a}
root=$(pwd)
build=$root/engine/build-ta
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv,noheader || true

if has build; then
  stamp build
  { cmake -S engine -B "$build" -G Ninja -DDDTREE_CUDA_ARCHS="$ARCHS" -DDDTREE_OPS=tree_attention \
      -DDDTREE_PTXAS_VERBOSE=ON && cmake --build "$build"; } > "$OUT/build.log" 2>&1 \
    || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  grep -A2 "tree_attention_kernel" "$OUT/build.log" | grep -E "registers|spill" || true
fi
export DDTREE_LIB=$build/libddtree.so

ok_impls=""
if has selftest; then
  for impl in wgmma mma; do
    stamp "selftest $impl"
    DDTREE_TREE_ATTENTION_IMPL=$impl timeout 120 "$build/ddtree-selftest" tree_attention 2>&1 \
      | tee "$OUT/selftest_$impl.log"
    rc=${PIPESTATUS[0]}
    echo "selftest $impl rc=$rc"
    [[ $rc == 0 ]] && ok_impls="$ok_impls $impl"
  done
fi

if has sanitize; then
  for impl in wgmma mma; do
    stamp "memcheck + racecheck $impl"
    DDTREE_TREE_ATTENTION_IMPL=$impl timeout 100 compute-sanitizer --tool memcheck --leak-check no \
      "$build/ddtree-selftest" tree_attention_star > "$OUT/memcheck_$impl.log" 2>&1
    echo "memcheck $impl rc=$?"; grep -E "ERROR SUMMARY|FAIL|PASS" "$OUT/memcheck_$impl.log" | tail -3
    DDTREE_TREE_ATTENTION_IMPL=$impl timeout 100 compute-sanitizer --tool racecheck \
      "$build/ddtree-selftest" tree_attention_chain > "$OUT/racecheck_$impl.log" 2>&1
    echo "racecheck $impl rc=$?"; grep -E "RACECHECK SUMMARY|FAIL|PASS" "$OUT/racecheck_$impl.log" | tail -3
  done
fi

if has pytest; then
  for impl in wgmma mma; do
    stamp "pytest $impl"
    DDTREE_TREE_ATTENTION_IMPL=$impl timeout 200 python3 -m pytest -q -p no:cacheprovider \
      engine/tests/test_tree_attention_gpu.py engine/tests/test_tree_attention.py > "$OUT/pytest_$impl.log" 2>&1
    echo "pytest $impl rc=$?"
    grep -E "passed|failed|^E  " "$OUT/pytest_$impl.log" | head -12
  done
fi

if has bench; then
  if [[ " $ok_impls " == *" wgmma "* ]]; then
    stamp "bench (default impl, with flex)"
    timeout 300 python3 engine/bench/bench_tree_attention.py --json "$OUT/bench.json" 2>&1 \
      | tee "$OUT/bench.log" | grep -v "^{"
  fi
  if [[ " $ok_impls " == *" mma "* ]]; then
    stamp "bench (mma.sync, no flex)"
    DDTREE_TREE_ATTENTION_IMPL=mma timeout 120 python3 engine/bench/bench_tree_attention.py --no-flex \
      --json "$OUT/bench_mma.json" 2>&1 | tee "$OUT/bench_mma.log" | grep -v "^{"
  fi
fi
stamp done
