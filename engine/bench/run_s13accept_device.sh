#!/usr/bin/env bash
# Session 13 (s13accept), issue #6: tree_accept's leaf mode. One device call, benches first (the decision), then
# the checks side by side. Takes a prebuilt library ($LIB) and selftest ($SELFTEST), sm_90a. From the folder that
# holds engine/:  LIB=lib/libddtree.so SELFTEST=lib/ddtree-selftest OUT=/tmp/out bash engine/bench/run_s13accept_device.sh
#   1. tree_accept alone, bf16, V = 151,936: leaf mode vs every row read (DDTREE_ACCEPT_LEAF=0), steered walks
#   2. bench_e2e qwen3-0.6b noleaf / default (leaf), all four shapes, CUPTI, leaf statistics of the round's trees
#   3. correctness: selftest (default and leaf forced), compute-sanitizer memcheck / racecheck / synccheck on the
#      tree_accept cases with leaf forced, GPU pytest of the accept / tail ops, test_decode_gpu.py with leaf forced
#      (-n 6), and the bf16 graph-vs-eager decode tests in 3 processes side by side (default)
#   4. (STEPS=4) leaf mode 2, the row-list first pass (opt-in): sanitizer + its GPU tests, then 1 and 2 against it
#   5. (STEPS=5) a short form of 4 that fit this helper's remaining device time (run in session 13)
OUT=${OUT:-/tmp/s13accept}
STEPS=${STEPS:-1 2 3}
source "$(dirname "$0")/e2e_device_env.sh"
for s in $STEPS; do case $s in
1)
  stamp "1. tree_accept alone, bf16, steered walks"
  (cd engine/bench && timeout 30 python3 bench_accept_vocab.py --dtypes bf16 --steer 0.8 \
    --variants packed_wide leaf) > "$OUT/accept.log" 2>&1
  echo "rc=$?"; grep -E "bfloat16|TB/s|leaf rows|Error|error" "$OUT/accept.log" | sed -E 's/ +/ /g'
  ;;
2)
  stamp "2. bench_e2e qwen3-0.6b noleaf / default"
  timeout 100 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act \
    --variants noleaf default --batch 1 8 --budgets 16 64 --tokens 64 --cupti --leaf-stats \
    > "$OUT/bench_e2e.log" 2>&1
  echo "rc=$?"
  grep -E "^model|AR \(|DDTree|paired|CUPTI summary|leaf stats|Error|error" "$OUT/bench_e2e.log" | sed -E 's/ +/ /g' \
    | cut -c1-330
  ;;
3)
  stamp "3. correctness (side by side)"
  for tool in memcheck racecheck synccheck; do
    { DDTREE_ACCEPT_LEAF=1 timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" tree_accept \
        2>&1 | tail -3; echo "$tool tree_accept (leaf) rc=${PIPESTATUS[0]}"; } > "$OUT/san_$tool.log" 2>&1 &
  done
  pt 85 -n 3 engine/tests/test_tree_accept.py engine/tests/test_round_finish.py engine/tests/test_round_update.py \
    > "$OUT/pytest_ops.log" 2>&1 &
  DDTREE_ACCEPT_LEAF=1 pt 85 -n 5 engine/tests/test_decode_gpu.py > "$OUT/pytest_decode_leaf.log" 2>&1 &
  for k in 1 2 3; do
    pt 85 -k "bf16_fast_graph_rounds or bf16_logits_rounds or graph_replay_equals_eager" engine/tests/test_decode_gpu.py \
      > "$OUT/pytest_bf16graph_$k.log" 2>&1 &
  done
  { timeout 40 "$SELFTEST" tree_accept round_finish commit_update 2>&1 | tail -2; echo "selftest rc=${PIPESTATUS[0]}";
    DDTREE_ACCEPT_LEAF=1 timeout 40 "$SELFTEST" tree_accept 2>&1 | tail -2; echo "selftest leaf rc=${PIPESTATUS[0]}";
  } > "$OUT/selftest.log" 2>&1
  wait
  cat "$OUT"/san_*.log "$OUT/selftest.log" > "$OUT/selftest_sanitizer.log"; rm -f "$OUT"/san_*.log "$OUT/selftest.log"
  for f in "$OUT"/pytest_bf16graph_*.log; do tail -1 "$f" >> "$OUT/pytest_bf16graph.log"; done
  rm -f "$OUT"/pytest_bf16graph_?.log
  grep -E "PASS|FAIL|passed|failed|rc=|ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK|^FAILED|^ERROR" \
    "$OUT/selftest_sanitizer.log" "$OUT"/pytest_*.log | cut -c1-220 | tail -30
  ;;
5)
  stamp "5. leaf mode 2 (the device cap's remainder): the round at batch 8 against leaf mode 1, then its checks"
  timeout 25 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act \
    --variants default leafrows --batch 8 --budgets 16 64 --tokens 64 --cupti --leaf-stats > "$OUT/bench_e2e3.log" 2>&1
  echo "rc=$?"
  grep -E "DDTree|paired|CUPTI summary|leaf stats|Error|error" "$OUT/bench_e2e3.log" | sed -E 's/ +/ /g' | cut -c1-330
  for tool in memcheck racecheck; do
    { DDTREE_ACCEPT_LEAF=2 timeout 18 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" tree_accept \
        2>&1 | tail -2; echo "$tool tree_accept (leaf 2) rc=${PIPESTATUS[0]}"; } > "$OUT/san2_$tool.log" 2>&1 &
  done
  pt 18 -n 6 -k "fused_leaf_rows or walks_ending" engine/tests/test_tree_accept.py > "$OUT/pytest_leaf2.log" 2>&1
  wait
  cat "$OUT"/san2_*.log; rm -f "$OUT"/san2_*.log; tail -1 "$OUT/pytest_leaf2.log"
  ;;
4)
  stamp "4. leaf mode 2 (row-list first pass): checks, then tree_accept alone and the round, against leaf mode 1"
  for tool in memcheck racecheck; do
    { DDTREE_ACCEPT_LEAF=2 timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" tree_accept \
        2>&1 | tail -2; echo "$tool tree_accept (leaf 2) rc=${PIPESTATUS[0]}"; } > "$OUT/san2_$tool.log" 2>&1 &
  done
  pt 40 -n 4 -k "fused_leaf_rows or walks_ending or small_vocab_trees" engine/tests/test_tree_accept.py \
    > "$OUT/pytest_leaf2.log" 2>&1
  wait
  cat "$OUT"/san2_*.log; rm -f "$OUT"/san2_*.log; tail -1 "$OUT/pytest_leaf2.log"
  (cd engine/bench && timeout 30 python3 bench_accept_vocab.py --dtypes bf16 --steer 0.8 \
    --variants leaf packed_wide leaf_rows) > "$OUT/accept2.log" 2>&1
  echo "rc=$?"; grep -E "bfloat16|Error|error" "$OUT/accept2.log" | sed -E 's/ +/ /g'
  timeout 60 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act \
    --variants default leafrows --batch 1 8 --budgets 16 64 --tokens 64 --cupti --leaf-stats \
    > "$OUT/bench_e2e2.log" 2>&1
  echo "rc=$?"
  grep -E "DDTree|paired|CUPTI summary|leaf stats|Error|error" "$OUT/bench_e2e2.log" | sed -E 's/ +/ /g' | cut -c1-330
  ;;
esac; done
stamp "done"
