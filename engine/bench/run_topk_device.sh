#!/usr/bin/env bash
# One device call for draft_topk_lse (written for v7, engine/bench/NOTES.md "v7 (session 5)"; v8 in session 6,
# v9 in session 7; the per-version scripts of v4-v6 that NOTES names stay in git history), on the library, the
# self-test and the stage profiler built beforehand on the CPU machine (sm_90a, DDTREE_OPS=draft_topk_lse;
# topk_stages from bench/profile/draft_topk_lse_stages.cu) in $B (default engine/build-topk).
# Stages (STAGES, default below, in this order): stages (stage-truncation profile of v8 and v9, each v9 option
# alone, per-CTA traces), selftest, selftest_opt (the same with DDTREE_TOPK_V4_OPT=$OPT, default v9), bench
# (the default vs torch f32/bf16 at BENCH_SHAPES), bench_opt (the same with DDTREE_TOPK_V4_OPT=$OPT, its own
# process and torch peer), pytest / pytest_opt (draft_topk_lse GPU tests), sanitize / sanitize_opt (memcheck +
# racecheck on the sized self-test), ncu (source-level profile, 1x15 K = 16, under DDTREE_TOPK_V4_OPT=$NCU_OPT when set),
# ab (session 9: bench_topk_v13_ab.py, the default against DDTREE_TOPK_V4_OPT=$OPT in one process, alternating passes).
# Logs under $OUT (a few files). Usage, from the repository root: bash engine/bench/run_topk_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/v7out}; mkdir -p "$OUT"
STAGES=${STAGES:-"stages selftest selftest_opt bench_opt pytest_opt sanitize_opt"}
OPT=${OPT:-v9}
BENCH_SHAPES=${BENCH_SHAPES:-1x15x163840,8x15x163840,1x15x320,8x15x320}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
B=$(realpath "${B:-engine/build-topk}")
export DDTREE_LIB=$B/libddtree.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if has stages; then
  stamp stages
  timeout 90 "$B/topk_stages" ${STAGES_MODE:-} > "$OUT/stages.log" 2>&1  # STAGES_MODE: quick | v10 (NOTES)
  echo "stages rc=$?"; cat "$OUT/stages.log"
fi
if has selftest; then
  stamp selftest
  timeout 90 "$B/ddtree-selftest" draft_topk_lse > "$OUT/selftest.log" 2>&1
  echo "selftest rc=$?"; grep -E "PASS|FAIL" "$OUT/selftest.log" | head -12
fi
if has selftest_opt; then
  stamp "selftest DDTREE_TOPK_V4_OPT=$OPT"
  DDTREE_TOPK_V4_OPT=$OPT timeout 90 "$B/ddtree-selftest" draft_topk_lse >> "$OUT/selftest.log" 2>&1
  echo "selftest_opt rc=$?"; grep -E "PASS|FAIL" "$OUT/selftest.log" | tail -4
fi
if has bench; then
  stamp bench
  DDTREE_BENCH_OUT=/tmp/v7bench timeout 150 python3 engine/bench/bench_draft_topk_lse.py \
    --shapes=$BENCH_SHAPES --ks=1,16,32,64 --impls=v4 > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -v "^\[" "$OUT/bench.log" | grep -E "x15x|TB/s" | head -20
fi
if has bench_opt; then
  stamp "bench DDTREE_TOPK_V4_OPT=$OPT"
  DDTREE_TOPK_V4_OPT=$OPT DDTREE_BENCH_OUT=/tmp/v7bench timeout 150 python3 engine/bench/bench_draft_topk_lse.py \
    --shapes=$BENCH_SHAPES --ks=1,16,32,64 --impls=v4 > "$OUT/bench_opt.log" 2>&1
  echo "bench_opt rc=$?"; grep -v "^\[" "$OUT/bench_opt.log" | grep -E "x15x|TB/s" | head -20
fi
if has ab; then
  stamp "ab default vs DDTREE_TOPK_V4_OPT=$OPT"
  DDTREE_BENCH_OUT=/tmp/v7bench timeout 150 python3 engine/bench/bench_topk_v13_ab.py --opt=$OPT \
    --shapes=${AB_SHAPES:-1x15x163840,8x15x163840} --ks=1,16,32,64 --passes=${AB_PASSES:-3} > "$OUT/ab.log" 2>&1
  echo "ab rc=$?"; grep -v "^\[" "$OUT/ab.log" | tail -12
fi
if has pytest; then
  stamp pytest
  timeout 200 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider -q -x \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
fi
if has pytest_opt; then
  stamp "pytest DDTREE_TOPK_V4_OPT=$OPT"
  DDTREE_TOPK_V4_OPT=$OPT timeout 200 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider \
    -q -x > "$OUT/pytest_opt.log" 2>&1
  echo "pytest_opt rc=$?"; tail -3 "$OUT/pytest_opt.log"
fi
sanitize() {  # $1: log suffix, $2: DDTREE_TOPK_V4_OPT (empty: the default)
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool ($1)"
    DDTREE_TOPK_V4_OPT=$2 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$B/ddtree-selftest" draft_topk_lse_golden \
      draft_topk_lse_sanitizer_sized > "$OUT/san_$tool$1.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' "$OUT/san_$tool$1.log" | tail -3 | tr '\n' ' ')"
  done
}
has sanitize && sanitize "" ""
has sanitize_opt && sanitize "_$OPT" "$OPT"
if has ncu; then
  stamp ncu
  LD_LIBRARY_PATH=$B DDTREE_TOPK_V4_OPT=${NCU_OPT:-} timeout 60 ncu --clock-control none --cache-control none -k regex:draft_topk_lse_v4 \
    --launch-skip 8 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    --warp-sampling-interval 0 -f -o /tmp/v7k16 "$B/topk_stages" calls 16 > /tmp/v7ncu.log 2>&1
  echo "ncu rc=$?"; tail -2 /tmp/v7ncu.log
  ncu -i /tmp/v7k16.ncu-rep --page details > "$OUT/ncu16_details.txt" 2>&1
  ncu -i /tmp/v7k16.ncu-rep --page source --csv --print-source sass > "$OUT/ncu16_src.csv" 2>&1
  grep -E "Duration|SM Active|Warp Cycles Per Issued|excessive" "$OUT/ncu16_details.txt" | head -6
fi
stamp done
