#!/usr/bin/env bash
# One device call for draft_topk_lse v4: build only that op for sm_90a, self-test, compute-sanitizer
# (memcheck + racecheck) on the sized self-test, the GPU pytest (v4, the default, graphs, streams), the
# bench (v2/v3/v4 vs torch f32/bf16; then k = 1, 16 again without PDL; then v4's CTA-size/cluster sweep),
# Nsight Compute on v4 (K = 1, 16: sections + hottest SASS lines).
# "async" repeats the selftest, sanitizers and v4 GPU tests with the opt-in st.async exchange.
# STAGES (default "build selftest sanitize pytest async bench ncu") picks stages.
# Logs go to $OUT (the device tool's folder, at most 8 files come back) or /tmp/v4out.
# Usage, from the repository root: bash engine/bench/run_topk_v4_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/v4out}; mkdir -p "$OUT"
STAGES=${STAGES:-"build selftest sanitize pytest async bench ncu"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
cd "$(dirname "$0")/../.."
B=engine/build-v4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if has build; then
  stamp build
  (cmake -S engine -B $B -G Ninja -DDDTREE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release -DDDTREE_PTXAS_VERBOSE=ON \
     -DDDTREE_OPS=draft_topk_lse && cmake --build $B -j 16) > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
  grep -A2 "draft_topk_lse_v4" "$OUT/build.log" | grep -E "Used|spill" | sort | uniq -c
fi
export DDTREE_LIB=$PWD/$B/libddtree.so
if has selftest; then
  stamp selftest
  timeout 120 $B/ddtree-selftest draft_topk_lse > "$OUT/selftest.log" 2>&1
  echo "selftest rc=$?"; grep -E "PASS|FAIL" "$OUT/selftest.log" | head -12
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool"
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $B/ddtree-selftest draft_topk_lse_golden \
      draft_topk_lse_sanitizer_sized > "$OUT/san_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' "$OUT/san_$tool.log" | tail -3 | tr '\n' ' ')"
  done
fi
if has pytest; then
  stamp pytest
  timeout 200 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider -q -x \
    -k "v4 or default or graph or back_to_back or nan or rejects or smaller" > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -4 "$OUT/pytest.log"
fi
if has async; then
  # The opt-in st.async exchange (DDTREE_TOPK_V4_CONFIG=512,8,1): selftest, sanitizers and the v4 GPU tests
  # again with it, appended to the same logs.
  export DDTREE_TOPK_V4_CONFIG=512,8,1
  stamp "async exchange: selftest, sanitizers, pytest"
  timeout 120 $B/ddtree-selftest draft_topk_lse >> "$OUT/selftest.log" 2>&1
  echo "async selftest rc=$?"; tail -4 "$OUT/selftest.log"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $B/ddtree-selftest draft_topk_lse_sanitizer_sized \
      >> "$OUT/san_$tool.log" 2>&1
    echo "async $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1)"
  done
  timeout 200 python3 -m pytest engine/tests/test_draft_topk_lse.py -m gpu -p no:cacheprovider -q -x -k "v4" \
    >> "$OUT/pytest.log" 2>&1
  echo "async pytest rc=$?"; tail -2 "$OUT/pytest.log"
  unset DDTREE_TOPK_V4_CONFIG
fi
if has bench; then
  stamp bench
  DDTREE_BENCH_OUT=$OUT timeout 200 python3 engine/bench/bench_draft_topk_lse.py > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  DDTREE_DISABLE_PDL=1 timeout 60 python3 engine/bench/bench_draft_topk_lse.py --quick >> "$OUT/bench.log" 2>&1
  echo "bench (no PDL) rc=$?"
  timeout 150 python3 engine/bench/bench_topk_v4_variants.py >> "$OUT/bench.log" 2>&1
  echo "v4 shape sweep rc=$?"
  grep -v "^\[" "$OUT/bench.log" | tail -40
fi
if has ncu; then
  # Nsight Compute on v4 (1 x 15 x 163840 bf16, K = 1 and 16): launch, occupancy, warp states, and the
  # hottest SASS lines (bench/profile/ncu_top_sass.py) into one file.
  sec="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section SourceCounters"
  for c in topk1v4 topk16v4; do
    stamp "ncu $c"
    timeout 90 ncu --clock-control none -k regex:draft_topk_lse_v4 --launch-skip 3 --launch-count 1 $sec -f -o /tmp/ncu_$c \
      python3 engine/bench/profile/profile_ops.py $c > /tmp/ncu_$c.log 2>&1
    echo "ncu $c rc=$?"
    { echo "=== $c"; ncu -i /tmp/ncu_$c.ncu-rep 2>&1 | grep -vE "^\s*$|----"; \
      ncu -i /tmp/ncu_$c.ncu-rep --page source --csv --print-source sass > /tmp/src_$c.csv 2>/dev/null && \
      python3 engine/bench/profile/ncu_top_sass.py /tmp/src_$c.csv --top 40; } >> "$OUT/ncu.txt" 2>&1
  done
  grep -E "^===|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Cluster|Issued Warp|Eligible|No Eligible|SM Busy|Memory Throughput|DRAM Throughput" "$OUT/ncu.txt" | head -40
fi
stamp done
