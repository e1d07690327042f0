#!/usr/bin/env bash
# Session 12, issue #6 at 8/64 (s12tail): one device call, the bench first (it is the decision), then the checks.
# (As run in session 12 it also had tree_accept's wider chunk, DDTREE_ACCEPT_WIDE=2, since removed: NOTES.)
#   1. bench_e2e --preset qwen3-0.6b --variants splitops cutile16 default --cupti: session 10's split ops, the
#      16-row commit_update pass, the default (bookkeeping CTA first, 8-row pass)
#   2. tree_accept alone at V = 151,936 bf16 (with and without PDL) and an ncu pass of the fused kernel at 8x65
#      (--clock-control none: the card's clocks are left alone)
#   3. correctness, in parallel: selftest (default; commit_update at 16 rows), compute-sanitizer memcheck +
#      racecheck on commit_update / round_update / kv_commit, GPU pytest of the tail ops, test_decode_gpu.py
#      (xdist workers; alone, -n 6, it took 56 s)
# Takes a prebuilt library ($LIB) and selftest ($SELFTEST), sm_90a. Run from the folder that holds engine/:
#   LIB=lib/libddtree.so SELFTEST=lib/ddtree-selftest OUT=/tmp/out bash engine/bench/run_s12tail_device.sh
OUT=${OUT:-/tmp/s12tail}
STEPS=${STEPS:-1 2 3}
source "$(dirname "$0")/e2e_device_env.sh"
for s in $STEPS; do case $s in
1)
  stamp "1. bench_e2e qwen3-0.6b splitops / cutile16 / default"
  timeout 95 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act \
    --variants splitops cutile16 default --batch 1 8 --budgets 16 64 --tokens 64 --cupti \
    > "$OUT/bench_e2e.log" 2>&1
  echo "rc=$?"
  grep -E "^model|AR \(|DDTree|paired|CUPTI summary|Error|error" "$OUT/bench_e2e.log" | sed -E 's/ +/ /g' | cut -c1-250
  ;;
2)
  stamp "2. tree_accept alone, bf16; ncu at 8x65"
  (cd engine/bench && timeout 20 python3 bench_accept_vocab.py --dtypes bf16 \
    --variants packed_wide packed_wide+pdl) > "$OUT/accept.log" 2>&1
  echo "rc=$?"; grep -E "bfloat16|TB/s" "$OUT/accept.log" | sed -E 's/ +/ /g'
  (cd engine/bench && timeout 20 ncu --clock-control none --kernel-name regex:tree_accept_fused --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 bench_accept_vocab.py --dtypes bf16 --variants packed_wide --shapes 8x65 --once) \
    > "$OUT/ncu_accept.log" 2>&1
  echo "ncu rc=$?"
  grep -E "tree_accept_fused|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occ|Registers Per|Waves Per|Block Limit Reg|Mem Busy|Max Bandwidth" \
    "$OUT/ncu_accept.log" | sed -E 's/ +/ /g' | cut -c1-120
  ;;
3)
  stamp "3. correctness (parallel)"
  pt 60 -n 2 engine/tests/test_commit_update.py engine/tests/test_round_update.py engine/tests/test_kv_commit.py \
    engine/tests/test_round_finish.py > "$OUT/pytest_tail.log" 2>&1 &
  pt 100 -n 5 engine/tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1 &
  for tool in memcheck racecheck; do
    { timeout 50 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" commit_update round_update kv_commit \
        2>&1 | tail -4; echo "$tool tail rc=${PIPESTATUS[0]}"; } > "$OUT/san_$tool.log" 2>&1 &
  done
  { timeout 30 "$SELFTEST" kv_commit round_update commit_update round_finish tree_accept 2>&1 | tail -3;
    echo "selftest rc=${PIPESTATUS[0]}";
    DDTREE_COMMIT_UPDATE_TILE=16 timeout 20 "$SELFTEST" commit_update 2>&1 | tail -2;
    echo "selftest tile16 rc=${PIPESTATUS[0]}"; } > "$OUT/selftest.log" 2>&1
  wait
  cat "$OUT"/san_*.log "$OUT/selftest.log" > "$OUT/selftest_sanitizer.log"; rm -f "$OUT"/san_*.log "$OUT/selftest.log"
  grep -E "PASS|FAIL|passed|failed|rc=|ERROR SUMMARY|RACECHECK SUMMARY|^FAILED|^ERROR" "$OUT/selftest_sanitizer.log" \
    "$OUT"/pytest_*.log | cut -c1-200 | tail -30
  ;;
esac; done
stamp "done"
