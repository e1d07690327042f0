#!/usr/bin/env bash
# One device call for draft_topk_lse v6 (engine/bench/NOTES.md, "v6 (session 4)"), on the library, the
# self-test and the stage profiler built beforehand on the CPU machine and carried in engine/build-topk
# (sm_90a, only draft_topk_lse; topk_stages from bench/profile/draft_topk_lse_stages.cu).
# Stages (STAGES, default all, in this order): stages (the stage-truncation profile: v5b paths, v5b + fast
# loads and the v6 default in one process, plus the library's default), selftest, bench (the default vs
# torch f32/bf16), pytest (draft_topk_lse GPU tests), sanitize (memcheck + racecheck on the sized self-test).
# Logs under $OUT. Usage, from the repository root: bash engine/bench/run_topk_v6_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/v6out}; mkdir -p "$OUT"
STAGES=${STAGES:-"stages selftest bench pytest sanitize"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
cd "$(dirname "$0")/../.."
B=${B:-engine/build-topk}
export DDTREE_LIB=$PWD/$B/libddtree.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if has stages; then
  stamp stages
  timeout 90 $B/topk_stages > "$OUT/stages.log" 2>&1
  echo "stages rc=$?"; cat "$OUT/stages.log"
fi
if has selftest; then
  stamp selftest
  timeout 90 $B/ddtree-selftest draft_topk_lse > "$OUT/selftest.log" 2>&1
  echo "selftest rc=$?"; grep -E "PASS|FAIL" "$OUT/selftest.log" | head -12
fi
if has bench; then
  stamp bench
  DDTREE_BENCH_OUT=$OUT timeout 150 python3 engine/bench/bench_draft_topk_lse.py \
    --shapes=1x15x163840,8x15x163840 --ks=1,16,32,64 --impls=v4 > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -v "^\[" "$OUT/bench.log" | grep -E "x15x|TB/s" | head -20
fi
if has pytest; then
  stamp pytest
  timeout 200 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider -q -x \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool"
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $B/ddtree-selftest draft_topk_lse_golden \
      draft_topk_lse_sanitizer_sized > "$OUT/san_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' "$OUT/san_$tool.log" | tail -3 | tr '\n' ' ')"
  done
fi
stamp done
