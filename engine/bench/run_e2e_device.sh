#!/usr/bin/env bash
# Issue #6 (the small model's share of the round outside the two forwards) on the H200, in ONE device call
# (session 7: the round tail's accept):
#   1. timings, alone on the GPU: bench_e2e (batch 1/8, budget 16/64; variants s6final = session 6's default
#      tail, compact = its greedy scoring without the unrolled noise code, early = compact + PDL launch and
#      prefetches, onecta = the one-CTA accept with compact scoring; each captured into its own graph in one
#      process, the AR peer in the same run) and the CUPTI round profile of the same variants (per-kernel times,
#      the gaps, where the memcpy records sit, the drafter+target graph profiled alone);
#   2. correctness, processes at once (no timings): ddtree-selftest of the changed ops + compute-sanitizer
#      memcheck/racecheck, the kernel GPU tests (every accept plan by parametrization), the end-to-end decoding
#      GPU tests under the candidate defaults ($CAND_ENV: early mode; $CAND2_ENV: the one-CTA accept).
# Takes a prebuilt library and self-test (sm_90a) in $B. Every step has its own timeout; logs go to $OUT
# (at most 8 files come back). Run from the folder that holds engine/ and pyproject.toml:
#   B=engine/build OUT=/tmp/out bash engine/bench/run_e2e_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/e2e_device}
B=${B:-$PWD/engine/build}
TOKENS=${TOKENS:-64}
VARIANTS=${VARIANTS:-s6final compact early onecta}
BENCH_VARIANTS=${BENCH_VARIANTS:-s6final early onecta}
CAND_ENV=${CAND_ENV:-DDTREE_ACCEPT_SCORE=compact DDTREE_ACCEPT_PDL=1 DDTREE_ACCEPT_ONE_CTA=0}
CAND2_ENV=${CAND2_ENV:-DDTREE_ACCEPT_SCORE=compact DDTREE_ACCEPT_ONE_CTA=1}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$B/libddtree.so LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader

stamp "1a. bench_e2e, 2-layer d_model 128 model, variants $BENCH_VARIANTS"
timeout 100 python3 engine/bench/bench_e2e.py --batch 1 8 --budgets 16 64 --tokens "$TOKENS" --kinds noisy \
  --variants $BENCH_VARIANTS > "$OUT/bench_e2e.log" 2>&1; echo "rc=$?"
grep -E "AR \(|DDTree" "$OUT/bench_e2e.log" | sed -E 's/ +/ /g'
stamp "1b. CUPTI round profile"
timeout 90 python3 engine/bench/profile/e2e_round_profile.py --variants $VARIANTS --reps 12 \
  > "$OUT/round_profile.log" 2>&1
echo "rc=$?"; grep -E "^batch|engine ops|memcpy|models graph|draft_topk|build_tree|tree_accept" "$OUT/round_profile.log"

stamp "2. correctness"
(
  for t in tree_accept round_finish round_update kv_commit; do
    timeout 40 "$B/ddtree-selftest" $t; echo "selftest $t rc=$?"
  done
  for t in round_finish_san tree_accept_golden; do
    for tool in memcheck racecheck; do
      timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 "$B/ddtree-selftest" $t > /tmp/san.log 2>&1
      echo "sanitizer $tool $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
    done
  done
) > "$OUT/selftest.log" 2>&1 &
P1=$!
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_round_finish.py \
  engine/tests/test_tree_accept.py engine/tests/test_draft_topk_lse_small_gpu.py engine/tests/test_round_update.py \
  engine/tests/test_kv_commit.py > "$OUT/pytest_kernels.log" 2>&1 &
P2=$!
D=engine/tests/test_decode_gpu.py
(
  env $CAND_ENV timeout 90 python3 -m pytest -v -p no:cacheprovider -m gpu -rs $D -k "greedy_lossless" 2>&1 &
  env $CAND_ENV timeout 90 python3 -m pytest -v -p no:cacheprovider -m gpu -rs $D -k "not greedy_lossless" 2>&1 &
  env $CAND2_ENV timeout 90 python3 -m pytest -v -p no:cacheprovider -m gpu -rs $D \
    -k "fused or 64-8 or 15-1 or sampled" 2>&1 | sed 's/^/[onecta] /' &
  wait
) > "$OUT/pytest_decode.log" 2>&1 &
P3=$!
wait $P1; wait $P2; echo "kernel pytest rc=$?"; wait $P3
grep -E "^PASS|^FAIL|rc=|SUMMARY" "$OUT/selftest.log"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest_kernels.log" | tail -8
grep -E " passed| failed|FAILED|^ERROR" "$OUT/pytest_decode.log" | tail -12
stamp "done"
