#!/usr/bin/env bash
# One device call for tree_attention: build (sm_90a, this op only), ddtree-selftest (every check runs
# on every back end the GPU can run: mma, wgmma, fa3), compute-sanitizer (memcheck + racecheck on small
# shapes, all back ends), GPU pytest vs the fp32 reference (parametrized over the back ends), bench
# table with every back end's time side by side, torch SDPA and flex.
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

if has selftest; then
  stamp "selftest (all back ends)"
  timeout 240 "$build/ddtree-selftest" tree_attention 2>&1 | tee "$OUT/selftest.log" | grep -v "^ok" | tail -30
  echo "selftest rc=${PIPESTATUS[0]}"
fi

if has sanitize; then
  # The selftest loops over mma and wgmma itself; fa3 has its own test, tree_attention_zz_fa3_backend. The fa3 back end synchronizes with mbarriers and
  # named barriers: read a racecheck hazard on it against that before calling it a bug.
  stamp "memcheck + racecheck (all back ends)"
  timeout 150 compute-sanitizer --tool memcheck --leak-check no \
    "$build/ddtree-selftest" tree_attention_star > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|FAIL|PASS" "$OUT/memcheck.log" | tail -4
  timeout 150 compute-sanitizer --tool racecheck \
    "$build/ddtree-selftest" tree_attention_chain > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|FAIL|PASS" "$OUT/racecheck.log" | tail -4
  # fa3 runs in its own selftest (registered last): memcheck it too.
  timeout 200 compute-sanitizer --tool memcheck --leak-check no \
    "$build/ddtree-selftest" tree_attention_zz_fa3 > "$OUT/memcheck_fa3.log" 2>&1
  echo "memcheck fa3 rc=$?"; grep -E "ERROR SUMMARY|FAIL|PASS" "$OUT/memcheck_fa3.log" | tail -4
fi

if has pytest; then
  stamp "pytest (parametrized over mma, wgmma, fa3)"
  timeout 400 python3 -m pytest -q -p no:cacheprovider -rs \
    engine/tests/test_tree_attention_gpu.py engine/tests/test_tree_attention.py > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"
  grep -E "passed|failed|^E  |^FAILED" "$OUT/pytest.log" | head -20
fi

if has bench; then
  stamp "bench (every back end, torch SDPA + flex)"
  timeout 400 python3 engine/bench/bench_tree_attention.py --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^{"
fi
stamp done
