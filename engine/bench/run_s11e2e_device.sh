#!/usr/bin/env bash
# Session 11, issue #6 (s11e2e): one device call.
#   1. correctness, in parallel: tree_accept / round_finish / decode GPU tests; selftest tree_accept + round_finish;
#      compute-sanitizer memcheck / racecheck / synccheck on the random-tree case (the wide bf16 chunk is the default)
#   2. bench_accept_vocab.py --dtypes bf16: the accept alone at V = 151,936, 8192- vs 16,384-logit chunks
#   3. profile/round_timeline.py: the events "other" against fenced single replays and CUPTI (qwen3-0.6b)
#   4. bench_e2e --preset qwen3-0.6b --variants narrow default --cupti (the chunk A/B in the round, same process)
# $STEPS picks and orders the steps (default 1 2 3 4). Takes a prebuilt library ($LIB) and selftest ($SELFTEST),
# sm_90a. Run from the folder that holds engine/ and pyproject.toml:
#   LIB=lib/libddtree.so SELFTEST=lib/ddtree-selftest OUT=/tmp/out bash engine/bench/run_s11e2e_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/s11e2e}
LIB=${LIB:-$PWD/engine/build/libddtree.so}
SELFTEST=${SELFTEST:-$PWD/engine/build/ddtree-selftest}
STEPS=${STEPS:-1 2 3 4}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$LIB
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for s in $STEPS; do case $s in
1)
  stamp "1. correctness (parallel)"
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_tree_accept.py \
    engine/tests/test_round_finish.py > "$OUT/pytest_accept.log" 2>&1 &
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_decode_gpu.py \
    > "$OUT/pytest_decode.log" 2>&1 &
  for tool in memcheck racecheck synccheck; do
    { timeout 110 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" tree_accept_random_trees_vs_host \
        2>&1 | tail -4; echo "$tool rc=${PIPESTATUS[0]}"; } > "$OUT/san_$tool.log" 2>&1 &
  done
  { timeout 60 "$SELFTEST" tree_accept round_finish; echo "selftest rc=$?"; } > "$OUT/selftest.log" 2>&1
  wait
  cat "$OUT"/san_*.log "$OUT/selftest.log" > "$OUT/selftest_sanitizer.log"; rm -f "$OUT"/san_*.log "$OUT/selftest.log"
  grep -E "PASS|FAIL|passed|failed|rc=|ERROR SUMMARY|^FAILED|^ERROR" "$OUT/selftest_sanitizer.log" \
    "$OUT/pytest_accept.log" "$OUT/pytest_decode.log" | tail -24
  ;;
2)
  stamp "2. bench_accept_vocab"
  (cd engine/bench && timeout 60 python3 bench_accept_vocab.py --dtypes bf16 \
    --variants packed packed_wide packed+pdl packed_wide+pdl) > "$OUT/bench_accept_vocab.log" 2>&1
  echo "rc=$?"; grep -vE "^\s*$" "$OUT/bench_accept_vocab.log" | tail -20
  ;;
3)
  stamp "3. round_timeline"
  timeout 100 python3 engine/bench/profile/round_timeline.py --preset qwen3-0.6b --shapes 1/64 8/16 8/64 --samples 20 > "$OUT/round_timeline.log" 2>&1
  echo "rc=$?"; grep -vE "Warning|warn_once" "$OUT/round_timeline.log" | tail -40
  ;;
4)
  stamp "4. bench_e2e qwen3-0.6b narrow vs wide"
  timeout 130 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act --variants narrow default \
    --batch 1 8 --budgets 16 64 --tokens 64 --cupti > "$OUT/bench_e2e.log" 2>&1
  echo "rc=$?"
  grep -E "^model|copy bandwidth|AR \(|DDTree|CUPTI summary|Error|error" "$OUT/bench_e2e.log" | sed -E 's/ +/ /g' | cut -c1-400
  ;;
esac; done
stamp "done"
