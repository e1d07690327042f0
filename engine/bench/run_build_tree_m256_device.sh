#!/usr/bin/env bash
# One device call for build_tree at M = 256 (bench/NOTES.md "### Session 10 (s10tree)"): the library,
# ddtree-selftest and bt_profile prebuilt on the dev machine (sm_90a, -DDDTREE_OPS="build_tree;build_tree_paths":
# build_tree alone leaves out the medium / large / small-budget self-tests) and carried in
# $BUILD_DIR; nothing is compiled here. Selftest under the default, v6 and DDTREE_BUILD_TREE_ORDER=bitonic (session 13's peer);
# GPU pytest of test_build_tree_gpu.py under v9auto / v6 / v6dp in the background while compute-sanitizer
# memcheck + racecheck run the golden / medium / small / large cases under the default; then the --m256 bench
# (the survivor sorts vs the default's bucketed rank, same process) and `bt_profile m256` on an otherwise idle GPU. Logs go to $OUT.
# Run from the root of a tree that holds engine/python, engine/tests and engine/bench:
#   BUILD_DIR=path/to/build bash engine/bench/run_build_tree_m256_device.sh
OUT=${OUT:-/tmp/build_tree_m256_out}
source "$(dirname "$0")/build_tree_device_env.sh"

stamp selftest
for mode in default v6 bitonic rankt; do  # bitonic / rankt: DDTREE_BUILD_TREE_ORDER (session 13)
  unset DDTREE_BUILD_TREE_IMPL DDTREE_BUILD_TREE_ORDER
  if [ "$mode" = v6 ]; then export DDTREE_BUILD_TREE_IMPL=v6; fi
  if [ "$mode" = bitonic ] || [ "$mode" = rankt ]; then export DDTREE_BUILD_TREE_ORDER=$mode; fi
  timeout 60 "$build/ddtree-selftest" build_tree > "$OUT/selftest_$mode.log" 2>&1
  echo "selftest ($mode) rc=$? $(grep -c PASS "$OUT/selftest_$mode.log") PASS, $(grep -c FAIL "$OUT/selftest_$mode.log") FAIL"
  grep FAIL "$OUT/selftest_$mode.log" | head -5
done
unset DDTREE_BUILD_TREE_IMPL DDTREE_BUILD_TREE_ORDER

stamp "pytest (background) + sanitizers"
(timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" engine/tests/test_build_tree_gpu.py \
  -k "v9auto or v6" > "$OUT/pytest.log" 2>&1; echo "rc=$?" >> "$OUT/pytest.log"
 DDTREE_BUILD_TREE_ORDER=bitonic timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  engine/tests/test_build_tree_gpu.py -k "v9auto" > "$OUT/pytest_bitonic.log" 2>&1; echo "rc=$?" >> "$OUT/pytest_bitonic.log") &
pytest_pid=$!
cases="build_tree_golden build_tree_medium build_tree_small build_tree_large build_tree_random"
for mode in default rankt; do
  if [ "$mode" = rankt ]; then export DDTREE_BUILD_TREE_ORDER=rankt; fi
  timeout 60 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 "$build/ddtree-selftest" $cases \
    > "$OUT/sanitize_$mode.log" 2>&1
  echo "memcheck ($mode) rc=$? $(grep 'ERROR SUMMARY' "$OUT/sanitize_$mode.log" | tail -1)"
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/ddtree-selftest" $cases \
    >> "$OUT/sanitize_$mode.log" 2>&1
  echo "racecheck ($mode) rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/sanitize_$mode.log" | tail -1)"
done
unset DDTREE_BUILD_TREE_ORDER
wait $pytest_pid
for f in pytest pytest_bitonic; do echo "$f: $(tail -2 "$OUT/$f.log" | tr '\n' ' ')"; grep -E "^FAILED|Error" "$OUT/$f.log" | head -10; done

stamp bench
timeout 120 python3 engine/bench/bench_build_tree.py --m256 --json "$OUT/bench_m256.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
stamp profile
timeout 30 "$build/bt_profile" m256 > "$OUT/profile.log" 2>&1
echo "profile rc=$?"
grep -E "^\[" -A1 "$OUT/profile.log" | grep -v "^--"
sed -n '/^| M /,$p' "$OUT/bench.log"
stamp done
