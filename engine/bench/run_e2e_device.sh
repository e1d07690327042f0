#!/usr/bin/env bash
# Issue #6 (the small model's share of the round outside the two forwards) on the H200, in ONE device call:
#   1. timings, alone on the GPU: bench_e2e (batch 1/8, budget 16/64, the session-5 engine kernels "s5" and
#      session 6's small-row top-k + one-CTA accept "s6", each captured into its own graph in one process, the
#      AR peer in the same run) and the CUPTI round profile of both variants;
#   2. correctness, three processes at once (no timings): ddtree-selftest of the changed ops + compute-
#      sanitizer memcheck/racecheck on their sanitizer-sized tests, the kernel GPU tests (both variants by
#      parametrization), the end-to-end decoding GPU tests with the s6 kernels on.
# Takes a prebuilt library and self-test (sm_90a) in $B. Every step has its own timeout; logs go to $OUT
# (at most 8 files come back). Run from the folder that holds engine/ and pyproject.toml:
#   B=engine/build OUT=/tmp/out bash engine/bench/run_e2e_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/e2e_device}
B=${B:-$PWD/engine/build}
TOKENS=${TOKENS:-128}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$B/libddtree.so LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader

stamp "1a. bench_e2e, 2-layer d_model 128 model, variants s5 s6"
timeout 60 python3 engine/bench/bench_e2e.py --batch 1 8 --budgets 16 64 --tokens "$TOKENS" --kinds noisy \
  --variants s5 s6 > "$OUT/bench_e2e.log" 2>&1; echo "rc=$?"
grep -E "AR \(|DDTree" "$OUT/bench_e2e.log"
stamp "1b. CUPTI round profile (s5 and s6)"
timeout 35 python3 engine/bench/profile/e2e_round_profile.py --variants s5 s6 > "$OUT/round_profile.log" 2>&1
echo "rc=$?"; grep -E "^batch|engine ops|memcpy|draft_topk|build_tree|tree_accept" "$OUT/round_profile.log"

stamp "2. correctness (three processes)"
(
  for t in round_finish tree_accept draft_topk_lse round_update kv_commit; do
    timeout 30 "$B/ddtree-selftest" $t; echo "selftest $t rc=$?"
  done
  for t in round_finish_san draft_topk_lse_san; do
    for tool in memcheck racecheck; do
      timeout 25 compute-sanitizer --tool $tool --error-exitcode 9 "$B/ddtree-selftest" $t > /tmp/san.log 2>&1
      echo "sanitizer $tool $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
    done
  done
) > "$OUT/selftest.log" 2>&1 &
P1=$!
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_round_finish.py \
  engine/tests/test_tree_accept.py engine/tests/test_draft_topk_lse_small_gpu.py engine/tests/test_round_update.py \
  engine/tests/test_kv_commit.py > "$OUT/pytest_kernels.log" 2>&1 &
P2=$!
DDTREE_TOPK_SMALL=1 DDTREE_ACCEPT_ONE_CTA=1 timeout 80 python3 -m pytest -v -p no:cacheprovider -m gpu -rs \
  engine/tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1 &
P3=$!
wait $P1; wait $P2; echo "kernel pytest rc=$?"; wait $P3; echo "decode pytest rc=$?"
grep -E "^PASS|^FAIL|rc=|SUMMARY" "$OUT/selftest.log"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest_kernels.log" | tail -8
grep -E "passed|failed|PASSED|FAILED|^ERROR" "$OUT/pytest_decode.log" | tail -12
stamp "done"
