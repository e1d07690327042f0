#!/usr/bin/env bash
# Session 13 (s13topk, NOTES "v17 (session 13"): one device call that measures draft_topk_lse at 8x15 rows with every
# candidate launch in one process, profiles one 8x15 call per side with Nsight Compute, then checks the new default
# (2-CTA clusters at 67..132 rows) and the one-CTA-per-row alternative for correctness.
# STAGE=sweep (call 1): every side, ncu, and the sanitizers also under the one-CTA-per-row side; STAGE=final (call 2): the
# new default against the launch before it (DDTREE_TOPK_V4_CLUSTER=4) and the default's correctness only.
# Runs from the repository root with a prebuilt library and self-test carried in $D (the dev machine's build):
#   D=.device/s13topk STAGE=final bash $D/engine/bench/run_s13topk_device.sh
set -u
export PYTHONUNBUFFERED=1
D=${D:-.device/s13topk}
OUT=${OUT:-/tmp/s13topk_out}
mkdir -p "$OUT/json"
export PYTHONPATH="$PWD/$D/engine/python:$PWD/$D/engine/bench" DDTREE_LIB="$PWD/$D/lib/libddtree.so"
export DDTREE_BENCH_OUT="$OUT/json"
ST="$PWD/$D/lib/ddtree-selftest"
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader

STAGE=${STAGE:-sweep}
SHAPES=8x15x163840,8x15x151936,1x15x163840@,1x15x151936@,8x15x151936f@c4
SIDES=c4:CLUSTER=4,c2v9:CLUSTER=2/OPT=v9,c2v11:CLUSTER=2/OPT=v11,c1solo:CLUSTER=1/LAUNCH=solo
[ "$STAGE" = final ] && SHAPES=8x15x163840,8x15x151936,1x15x163840@,1x15x151936@ SIDES=c4:CLUSTER=4
stamp "1. sides at 8x15 (and the default at 1x15), one process"
timeout 120 python3 "$D/engine/bench/bench_topk_rows_ab.py" --shapes=$SHAPES --sides=$SIDES \
  > "$OUT/bench.log" 2>&1; echo "bench rc=$?"

stamp "2. ncu: one 8x15 x 163,840 call per side, K = 16 and 64"
[ "$STAGE" = sweep ] && timeout 60 ncu --clock-control none -k regex:draft_topk_lse_v4 --launch-skip 6 --launch-count 6 \
  --section LaunchStats --section Occupancy --section SpeedOfLight \
  python3 "$D/engine/bench/profile/topk_rows_ncu.py" --ks=16,64 --sides=c4:CLUSTER=4,c1solo:CLUSTER=1/LAUNCH=solo \
  > "$OUT/ncu.log" 2>&1; echo "ncu rc=$?"

stamp "3. correctness, side by side"
L=$OUT/logs; mkdir -p "$L"
CASES=$("$ST" --list | grep draft_topk)
(timeout 170 "$ST" $CASES > "$L/selftest.log" 2>&1; echo "selftest (default) rc=$? $(grep -c '^PASS' "$L/selftest.log") PASS") &
SMALL="$D/engine/tests/test_draft_topk_lse_small_gpu.py"; [ "$STAGE" = final ] && SMALL=  # unchanged since call 1
(timeout 170 python3 -m pytest -q -p no:cacheprovider "$D/engine/tests/test_draft_topk_lse.py" $SMALL \
   > "$L/pytest.log" 2>&1; echo "pytest rc=$?: $(tail -1 "$L/pytest.log")") &
for tool in memcheck racecheck; do
  (timeout 170 compute-sanitizer --tool $tool --error-exitcode 9 "$ST" draft_topk_lse_sanitizer_sized \
     > "$L/san_${tool}.log" 2>&1
   echo "sanitizer $tool (default): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/san_${tool}.log" | tail -1)") &
  [ "$STAGE" = sweep ] && (DDTREE_TOPK_V4_CLUSTER=1 DDTREE_TOPK_V4_LAUNCH=solo timeout 170 compute-sanitizer --tool $tool --error-exitcode 9 \
     "$ST" draft_topk_lse_sanitizer_sized > "$L/san_${tool}_c1solo.log" 2>&1
   echo "sanitizer $tool (c1 solo): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/san_${tool}_c1solo.log" | tail -1)") &
done
wait
stamp "done"
tar czf "$OUT/logs.tgz" -C "$L" . && rm -rf "$L"
[ -f "$OUT/ncu.log" ] && grep -E "^profiled|draft_topk_lse_v4_kernel|Duration|DRAM Throughput|Memory Throughput|Grid Size|Cluster Size|Waves Per SM|Achieved Occupancy|Registers Per|Block Limit (Registers|Shared)|Compute \(SM\) Throughput" \
  "$OUT/ncu.log" | sed 's/  */ /g' | head -90
tail -60 "$OUT/bench.log"
