#!/usr/bin/env bash
# One device call for build_tree v11 (build_tree/v11.cuh; bench/NOTES.md "### v11 (session 7)"): the library,
# ddtree-selftest and the phase-profile tool are prebuilt on the dev machine (sm_90a) and carried in $BUILD_DIR;
# nothing is compiled here. Stages: selftest (default, then every build_tree case under v11), GPU pytest
# (test_build_tree_v11_gpu.py and every test of test_build_tree_gpu.py under v11, in the background while
# compute-sanitizer memcheck + racecheck run the v11 self-test case), then on an otherwise idle GPU the --v11
# bench (every M = 64 / 256 / 1024 row, v11 vs v8auto vs the default, heap ratios), the phase profile
# (`bt_profile v11`) and one ncu look at the v11 kernel and the default kernel (stall reasons).
# Run from the root of a tree that holds engine/python, engine/tests and engine/bench:
#   BUILD_DIR=path/to/build bash engine/bench/run_build_tree_v11_device.sh
OUT=${OUT:-/tmp/build_tree_v11_out}
BT_EXTRA_PYTHONPATH=:$(pwd)/engine/tests
source "$(dirname "$0")/build_tree_device_env.sh"

stamp selftest
timeout 60 "$build/ddtree-selftest" build_tree > "$OUT/selftest.log" 2>&1
echo "selftest (default) rc=$? $(grep -c PASS "$OUT/selftest.log") PASS, $(grep -c FAIL "$OUT/selftest.log") FAIL"
DDTREE_BUILD_TREE_IMPL=v11 timeout 60 "$build/ddtree-selftest" build_tree > "$OUT/selftest_v11.log" 2>&1
echo "selftest (v11) rc=$? $(grep -c PASS "$OUT/selftest_v11.log") PASS, $(grep -c FAIL "$OUT/selftest_v11.log") FAIL"
grep -h FAIL "$OUT/selftest.log" "$OUT/selftest_v11.log" | head -5

stamp "pytest (background) + sanitizers"
timeout ${PYTEST_TIMEOUT:-170} python3 -m pytest -q -p no:cacheprovider -o addopts="" engine/tests/test_build_tree_v11_gpu.py \
  engine/tests/test_build_tree_gpu.py -k "v11" > "$OUT/pytest.log" 2>&1 &
pytest_pid=$!
timeout 70 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 "$build/ddtree-selftest" \
  build_tree_v11 build_tree_golden > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log")"
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/ddtree-selftest" build_tree_v11 \
  > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.log")"
wait $pytest_pid
echo "pytest rc=$?"
grep -E "passed|failed|Error|assert" "$OUT/pytest.log" | head -20

stamp bench
timeout ${BENCH_TIMEOUT:-130} python3 engine/bench/bench_build_tree.py --v11 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "^\||^B=64" "$OUT/bench.log"
stamp profile
timeout 40 "$build/bt_profile" v11 > "$OUT/profile.log" 2>&1
echo "profile rc=$?"
grep -E "^\[|^  [0-9]|warp probe|empty" "$OUT/profile.log" | head -60
if [ "${NCU:-1}" = 1 ]; then
  stamp ncu
  # First profile configuration of each kernel (M = 64 K = 64 sharpness 8 is cfg 0; skip to M = 256 K = 64
  # sharpness 4 with --launch-skip: 4 launches per kernel precede it).
  st=smsp__average_warps_issue_stalled
  m=smsp__inst_executed.sum,smsp__cycles_active.max
  for r in barrier short_scoreboard long_scoreboard no_instruction wait branch_resolving math_pipe_throttle \
           mio_throttle lg_throttle dispatch_stall not_selected selected drain sleeping membar misc; do
    m=$m,${st}_${r}_per_issue_active.ratio
  done
  timeout 60 ncu --clock-control none -k regex:"build_tree_(v11_)?kernel" --launch-skip 8 --launch-count 2 \
    --section WarpStateStats --metrics "$m" "$build/bt_profile" v11 > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"
  grep -E "build_tree_|Warp Cycles Per Issued|inst_executed|cycles_active|issue_stalled" "$OUT/ncu.log" | head -50
fi
stamp done
