#!/usr/bin/env bash
# One device call for draft_topk_lse v5 (engine/bench/NOTES.md, "v5 (session 3)"), on libraries built
# beforehand on the CPU machine and carried: engine/build-topk (this tree, sm_90a, only draft_topk_lse) and,
# for an in-run baseline, engine/build-topk-old (the previous commit's library, same flags).
# Stages (STAGES, default all, in this order): selftest, bench (v5 default vs torch f32/bf16, then the
# previous library's default in its own process), sweep (cluster size x exchange, bench_topk_v4_variants.py),
# pytest (draft_topk_lse GPU tests), e2e (test_decode_gpu.py: decoding with the library's default top-k),
# sanitize (memcheck + racecheck on the sized self-test). Logs under $OUT (at most 8 files come back).
# Usage, from the repository root: bash engine/bench/run_topk_v5_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/v5out}; mkdir -p "$OUT"
STAGES=${STAGES:-"selftest bench sweep pytest e2e sanitize"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
cd "$(dirname "$0")/../.."
B=${B:-engine/build-topk}
OLD=${OLD:-engine/build-topk-old}
export DDTREE_LIB=$PWD/$B/libddtree.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
SHAPES="--shapes=1x15x163840,8x15x163840 --ks=1,16,32,64"
if has selftest; then
  stamp selftest
  timeout 90 $B/ddtree-selftest draft_topk_lse > "$OUT/selftest.log" 2>&1
  echo "selftest rc=$?"; grep -E "PASS|FAIL" "$OUT/selftest.log" | head -12
fi
if has bench; then
  stamp bench
  DDTREE_BENCH_OUT=$OUT timeout 120 python3 engine/bench/bench_draft_topk_lse.py $SHAPES --impls=v4 > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  if [ -f "$OLD/libddtree.so" ]; then
    echo "=== previous commit's library (v4.1 default: 8 CTAs per row, cluster-barrier exchange)" >> "$OUT/bench.log"
    DDTREE_LIB=$PWD/$OLD/libddtree.so timeout 90 python3 engine/bench/bench_draft_topk_lse.py $SHAPES --impls=v4 \
      >> "$OUT/bench.log" 2>&1
    echo "bench (previous library) rc=$?"
  fi
  grep -v "^\[" "$OUT/bench.log" | grep -E "x15x|TB/s|===" | head -30
fi
if has sweep; then
  stamp sweep
  timeout 150 python3 engine/bench/bench_topk_v4_variants.py ${SWEEP:-} > "$OUT/sweep.log" 2>&1
  echo "sweep rc=$?"; tail -8 "$OUT/sweep.log"
fi
if has pytest; then
  stamp pytest
  timeout 240 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider -q -x \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
fi
if has e2e; then
  stamp e2e
  timeout 200 python3 -m pytest engine/tests/test_decode_gpu.py -m gpu -p no:cacheprovider -q > "$OUT/e2e.log" 2>&1
  echo "e2e rc=$?"; tail -3 "$OUT/e2e.log"
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
