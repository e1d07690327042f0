#!/usr/bin/env bash
# One device call for build_tree's small launches (v9, the warp heap; bench/NOTES.md "### v9 (session 6)"
# and "### v9 session 7"; v9s6 = session 6's warp heap, the A/B peer):
# the library, ddtree-selftest and the phase-profile tool are prebuilt on the dev machine (sm_90a) and
# carried in $BUILD_DIR; nothing is compiled here. Stages: selftest (default, then v9, v9s6, v8auto), GPU
# pytest of test_build_tree_gpu.py under v9 / v9auto / v9s6 (in the background, while compute-sanitizer
# memcheck + racecheck run the warp-heap self-tests under v9),
# then the --small bench and the phase profile on an otherwise idle GPU. Logs and the bench JSON / dumped log-probs go to $OUT.
# Run from the root of a tree that holds engine/python, engine/tests and engine/bench:
#   BUILD_DIR=path/to/build bash engine/bench/run_build_tree_small_device.sh
OUT=${OUT:-/tmp/build_tree_small_out}
source "$(dirname "$0")/build_tree_device_env.sh"

stamp selftest
timeout 60 "$build/ddtree-selftest" build_tree > "$OUT/selftest.log" 2>&1
echo "selftest (default) rc=$? $(grep -c PASS "$OUT/selftest.log") PASS, $(grep -c FAIL "$OUT/selftest.log") FAIL"
grep FAIL "$OUT/selftest.log" | head -5
for impl in v9 v9s6 v8auto; do
  DDTREE_BUILD_TREE_IMPL=$impl timeout 60 "$build/ddtree-selftest" build_tree >> "$OUT/selftest.log" 2>&1
  echo "selftest ($impl) rc=$? $(grep -c PASS "$OUT/selftest.log") PASS in total"
done

stamp "pytest (background) + sanitizers"
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" engine/tests/test_build_tree_gpu.py -k "v9" \
  > "$OUT/pytest.log" 2>&1 &
pytest_pid=$!
cases=${SANITIZE_CASES:-"build_tree_golden build_tree_warp_heap"}
for impl in v9; do
  DDTREE_BUILD_TREE_IMPL=$impl timeout 45 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$build/ddtree-selftest" $cases > "$OUT/sanitize_$impl.log" 2>&1
  echo "memcheck ($impl) rc=$? $(grep 'ERROR SUMMARY' "$OUT/sanitize_$impl.log" | tail -1)"
  DDTREE_BUILD_TREE_IMPL=$impl timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$build/ddtree-selftest" $cases >> "$OUT/sanitize_$impl.log" 2>&1
  echo "racecheck ($impl) rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/sanitize_$impl.log" | tail -1)"
done
wait $pytest_pid
echo "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
grep -E "^FAILED|Error" "$OUT/pytest.log" | head -10

stamp bench
timeout 100 python3 engine/bench/bench_build_tree.py --small --json "$OUT/bench_small.json" \
  --dump-lp "$OUT/lp_b8.pt" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
stamp profile
timeout 60 "$build/bt_profile" small > "$OUT/profile.log" 2>&1
echo "profile rc=$?"
grep -E "probe|empty kernel" "$OUT/profile.log"
grep -E "^\[v9|^\[v8\]|^\[auto\]" -A1 "$OUT/profile.log" | grep -v "^--" | head -80
sed -n '/^| M /,$p' "$OUT/bench.log"
stamp done
