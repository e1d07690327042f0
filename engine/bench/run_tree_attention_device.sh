#!/usr/bin/env bash
# One device call for tree_attention: build (sm_90a, this op only), ddtree-selftest (every check runs
# on every back end the GPU can run: mma, wgmma, fa3), compute-sanitizer (memcheck + racecheck on small
# shapes, all back ends; memcheck, racecheck and synccheck on the fa3 selftest), Nsight Compute on the
# fa3 kernel (full set with source: stall totals and the hottest SASS lines), GPU pytest vs the fp32
# reference (parametrized over the back ends), bench table with every back end's time side by side,
# torch SDPA and flex.
# Logs go to $OUT. STAGES (default "build selftest sanitize pytest bench"; "ncu" on request) picks
# stages; PYTEST_K narrows pytest (-k), BENCH_ARGS is passed to the bench (e.g. "--impls fa3 --no-flex"),
# SAN_BACKENDS=fa3 sanitizes only the fa3 selftest, NCU_CASE picks the profile_ops.py case (ta8x512),
# BUILD_DIR points at a carried build (then leave "build" out of STAGES).
# Run from the repository root:  bash engine/bench/run_tree_attention_device.sh
set -u
OUT=${OUT:-/tmp/tree_attention_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-"build selftest sanitize pytest bench"}
ARCHS=${ARCHS:-90a}
root=$(pwd)
build=${BUILD_DIR:-$root/engine/build-ta}  # BUILD_DIR: a library built elsewhere and carried (skip "build")
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
  if [[ "${SAN_BACKENDS:-all}" == all ]]; then
    stamp "memcheck + racecheck (all back ends)"
    timeout 150 compute-sanitizer --tool memcheck --leak-check no \
      "$build/ddtree-selftest" tree_attention_star > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|FAIL|PASS" "$OUT/memcheck.log" | tail -4
    timeout 150 compute-sanitizer --tool racecheck \
      "$build/ddtree-selftest" tree_attention_chain > "$OUT/racecheck.log" 2>&1
    echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|FAIL|PASS" "$OUT/racecheck.log" | tail -4
  fi
  stamp "memcheck + racecheck + synccheck (fa3)"
  # fa3 runs in its own selftest (registered last): memcheck, racecheck and synccheck it.
  for tool in memcheck racecheck synccheck; do
    timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool $tool --error-exitcode 9 \
      "$build/ddtree-selftest" tree_attention_zz_fa3 > "$OUT/san_${tool}_fa3.log" 2>&1
    echo "$tool fa3 rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL|PASS" "$OUT/san_${tool}_fa3.log" | tail -3 | tr '\n' ' ')"
  done
fi

if has ncu; then
  # Source-level evidence on the fa3 kernel (default 8/1 heads x 512 nodes x 4k context): the full set
  # with SASS source, condensed here to the stall totals and the hottest lines (few files come back).
  stamp "ncu fa3 (${NCU_CASE:-ta8x512}, full set, source)"
  timeout 150 ncu --clock-control none --set full --import-source yes -k regex:tree_attention_fa3 \
    --launch-skip 6 --launch-count 1 -o /tmp/fa3 -f python3 engine/bench/profile/profile_ops.py ${NCU_CASE:-ta8x512} \
    > "$OUT/ncu_run.log" 2>&1
  echo "ncu rc=$?"
  ncu -i /tmp/fa3.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
  ncu -i /tmp/fa3.ncu-rep --page source --csv --print-source sass > /tmp/fa3_source.csv 2>&1
  python3 engine/bench/profile/ncu_top_sass.py /tmp/fa3_source.csv --top 60 > "$OUT/ncu_top_sass.txt" 2>&1 \
    || head -c 3000 /tmp/fa3_source.csv >> "$OUT/ncu_top_sass.txt"
  grep -E "Duration|Elapsed Cycles|Compute \(SM\) Th|Issued Warp|Registers Per|Eligible Warps" "$OUT/ncu_details.txt" | head -12
  head -30 "$OUT/ncu_top_sass.txt"
fi

if has pytest; then
  stamp "pytest (parametrized over mma, wgmma, fa3)"
  timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rs ${PYTEST_K:+-k "$PYTEST_K"} \
    engine/tests/test_tree_attention_gpu.py engine/tests/test_tree_attention.py > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"
  grep -E "passed|failed|^E  |^FAILED" "$OUT/pytest.log" | head -20
fi

if has bench; then
  stamp "bench (every back end, torch SDPA + flex)"
  timeout 400 python3 engine/bench/bench_tree_attention.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^{"
fi
stamp done
