#!/usr/bin/env bash
# One device call: build the engine for sm_90a, compute-sanitizer on the draft_topk_lse v3 and
# tree_attention fa3 self-tests (never sanitized before), then Nsight Compute on the kernels whose
# speed targets are missed (draft_topk_lse v3, build_tree, tree_attention fa3). Logs go to $OUT.
# STAGES (default "build sanitize ncu") picks stages. Run from the repository root.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/profout}; mkdir -p "$OUT"
STAGES=${STAGES:-"build sanitize ncu"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
B=engine/build-prof
if has build; then
  stamp build
  (cmake -S engine -B $B -G Ninja -DDDTREE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release -DDDTREE_PTXAS_VERBOSE=ON \
     && cmake --build $B -j 16) > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
fi
export DDTREE_LIB=$PWD/$B/libddtree.so
if has sanitize; then
  for t in "memcheck draft_topk_lse_sanitizer_sized" "racecheck draft_topk_lse_sanitizer_sized" \
           "memcheck tree_attention_zz_fa3" "racecheck tree_attention_zz_fa3" "synccheck tree_attention_zz_fa3"; do
    set -- $t
    stamp "compute-sanitizer $1 on $2"
    timeout 100 compute-sanitizer --tool $1 --error-exitcode 9 $B/ddtree-selftest $2 > "$OUT/san_$1_$2.log" 2>&1
    echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' "$OUT/san_$1_$2.log" | tail -3 | tr '\n' ' ')"
  done
fi
if has ncu; then
  P=engine/bench/profile/profile_ops.py
  sec="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis"
  for c in "topk1 4 2" "topk16 4 2" "tree256 3 1" "ta8x512 6 3" "ta64x512 6 3"; do
    set -- $c
    stamp "ncu $1"
    timeout 90 ncu --clock-control none --launch-skip $2 --launch-count $3 $sec python3 $P $1 > "$OUT/ncu_$1.txt" 2>&1
    echo "rc=$?"; grep -E "^  [a-z_].*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occ" "$OUT/ncu_$1.txt" | head -24
  done
fi
stamp done
