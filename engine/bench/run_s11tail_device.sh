#!/usr/bin/env bash
# Session 11, issue #6 at 8/64 (s11tail): one device call.
#   1. correctness: selftest kv_commit / round_update / commit_update / round_finish; compute-sanitizer memcheck and
#      racecheck on commit_update_golden + round_update_golden + kv_commit; GPU pytest (commit_update, round_update,
#      kv_commit, round_finish, tree_accept, decode), the commit_update tests and selftest again under PDL
#   2. bench_e2e --preset qwen3-0.6b --variants splitops default cupdl --cupti (the split tail's two ops + mask vs
#      one commit_update launch vs that with PDL, same process)
# (test_decode_gpu.py needs ~110 s: the 55 s limit of this session's call cut it short; 120 s now.)
# Takes a prebuilt library ($LIB) and selftest ($SELFTEST), sm_90a. Run from the folder that holds engine/:
#   LIB=lib/libddtree.so SELFTEST=lib/ddtree-selftest OUT=/tmp/out bash engine/bench/run_s11tail_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/s11tail}
LIB=${LIB:-$PWD/engine/build/libddtree.so}
SELFTEST=${SELFTEST:-$PWD/engine/build/ddtree-selftest}
STEPS=${STEPS:-1 2}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$LIB
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
pt() { timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu -rs "${@:2}"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for s in $STEPS; do case $s in
1)
  stamp "1. correctness (parallel)"
  pt 55 engine/tests/test_commit_update.py engine/tests/test_round_update.py engine/tests/test_kv_commit.py \
    engine/tests/test_round_finish.py > "$OUT/pytest_tail.log" 2>&1 &
  pt 120 engine/tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1 &
  pt 55 engine/tests/test_tree_accept.py > "$OUT/pytest_accept.log" 2>&1 &
  for tool in memcheck racecheck; do
    { timeout 55 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" commit_update round_update kv_commit \
        2>&1 | tail -6; echo "$tool rc=${PIPESTATUS[0]}"; } > "$OUT/san_$tool.log" 2>&1 &
  done
  { timeout 30 "$SELFTEST" kv_commit round_update commit_update round_finish; echo "selftest rc=$?";
    DDTREE_COMMIT_UPDATE_PDL=1 timeout 20 "$SELFTEST" commit_update; echo "selftest pdl rc=$?";
    DDTREE_COMMIT_UPDATE_PDL=1 pt 120 engine/tests/test_commit_update.py engine/tests/test_decode_gpu.py \
      -k "commit or split or graph" 2>&1 | tail -3; } > "$OUT/selftest.log" 2>&1
  wait
  cat "$OUT"/san_*.log "$OUT/selftest.log" > "$OUT/selftest_sanitizer.log"; rm -f "$OUT"/san_*.log "$OUT/selftest.log"
  grep -E "PASS|FAIL|passed|failed|rc=|ERROR SUMMARY|RACECHECK SUMMARY|^FAILED|^ERROR" "$OUT/selftest_sanitizer.log" \
    "$OUT/pytest_tail.log" "$OUT/pytest_decode.log" "$OUT/pytest_accept.log" | tail -30
  ;;
2)
  stamp "2. bench_e2e qwen3-0.6b splitops vs commit_update vs +pdl"
  timeout 75 python3 engine/bench/bench_e2e.py --preset qwen3-0.6b --kinds noisy --logits act \
    --variants splitops default cupdl --batch 1 8 --budgets 16 64 --tokens 64 --cupti > "$OUT/bench_e2e.log" 2>&1
  echo "rc=$?"
  grep -E "^model|AR \(|DDTree|paired|CUPTI summary|Error|error" "$OUT/bench_e2e.log" | sed -E 's/ +/ /g' | cut -c1-330
  ;;
esac; done
stamp "done"
