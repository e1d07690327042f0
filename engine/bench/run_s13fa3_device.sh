#!/usr/bin/env bash
# s13fa3 device call (tree_attention v22, NOTES.md): what sets the fa3 tile period at 64/8 x 512. Bench with the
# diagnostic builds (DDTREE_TA_FA3_PROBE 1 = no softmax, 2 = no K/V copies, 3 = both; wrong outputs by design) timed
# in alternation with main's library, the LPT switch alternated in the same rounds (the bench's new rotation), then
# ncu SourceCounters of main's library at 64/8 x 512 x 4k and 64k. Libraries carried in .device/s13fa3/{main,p1,p2,p3}
# with this branch's engine/python and engine/bench; run from the repository root of the device copy.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; D=$R/.device/s13fa3
OUT=${OUT:-/tmp/s13out}; mkdir -p "$OUT"; W=/tmp/s13w; mkdir -p $W
export PYTHONPATH=$D/engine/python:$D/engine/bench
M=$D/main/libddtree.so
st() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }
# STAGE=3 (the third call): where the copies cost. ncu MemoryWorkloadAnalysis + ComputeWorkloadAnalysis of main and
# p2b at 64/8 x 512 x 64k (shared-memory wavefronts and pipe use with and without the steady-state copies).
if [ "${STAGE:-1}" = 3 ]; then
  for n in main p2b; do
    st ncu $n; LIB=$M; [ $n = main ] || LIB=$D/$n/libddtree.so
    DDTREE_LIB=$LIB timeout 30 ncu --clock-control none -k regex:tree_attention_fa3 --launch-skip 3 --launch-count 1 \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
      python3 $D/engine/bench/profile/profile_ops.py ta64x512x64k --reps 5 > $OUT/mwa_$n.txt 2>&1; echo "ncu rc=$?"
    grep -E "Duration|Shared|Pipe|Issue|L1/TEX Hit|Mem Busy|Max Bandwidth|Executed Ipc" $OUT/mwa_$n.txt | head -24
  done
  st done; exit 0
fi
# STAGE=2 (the second call): p2b / p3b = the copy probe with every ring stage filled once (real K/V data; p2z = call
# 1's p2 on stale memory, kept to see what the data did), timed in alternation with main and p1 at 64/8 x 512; then
# cycles or clock: each build's sustained µs per call with nvidia-smi's SM clock and power (fa3_probe_clocks.py), and
# ncu SpeedOfLight (elapsed cycles of one launch) at 64k.
if [ "${STAGE:-1}" = 2 ]; then
  nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv | tee $OUT/gpu.txt
  st bench
  DDTREE_LIB=$M timeout 60 python3 $D/engine/bench/bench_tree_attention.py --impls fa3 --no-flex --interleaved-floor \
    --ab-lib p1=$D/p1/libddtree.so --ab-lib p2b=$D/p2b/libddtree.so --ab-lib p3b=$D/p3b/libddtree.so \
    --ab-lib p2z=$D/p2/libddtree.so --ab-rounds 3 --shapes 64/8x512x4k,64/8x512x64k --json $OUT/bench2.json \
    > $OUT/bench2.log 2>&1; echo "bench rc=$?"; tail -12 $OUT/bench2.log
  L="main=$M p1=$D/p1/libddtree.so p2b=$D/p2b/libddtree.so p2z=$D/p2/libddtree.so p3b=$D/p3b/libddtree.so"
  st clocks 64k
  timeout 40 python3 $D/engine/bench/profile/fa3_probe_clocks.py $L --ctx 65536 --secs 1.2 --rounds 2 2>&1 | tee -a $OUT/clocks.log
  for n in main p2b p1; do
    [ $SECONDS -lt 85 ] || { echo "skip ncu $n"; continue; }
    st ncu $n; LIB=$M; [ $n = main ] || LIB=$D/$n/libddtree.so
    DDTREE_LIB=$LIB timeout 25 ncu --clock-control none -k regex:tree_attention_fa3 --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight python3 $D/engine/bench/profile/profile_ops.py ta64x512x64k --reps 5 > $W/sol_$n.txt 2>&1
    echo "== $n" >> $OUT/sol.txt; grep -E "SM Frequency|Elapsed Cycles|Duration|SM Active|Compute \(SM\)|L2 Cache Th" $W/sol_$n.txt | tee -a $OUT/sol.txt
  done
  st done; exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv | tee $OUT/gpu.txt
st bench
DDTREE_LIB=$M timeout ${BENCH_S:-120} python3 $D/engine/bench/bench_tree_attention.py --impls fa3 --no-flex \
  --interleaved-floor --ab --ab-only fa3_index_order --ab-lib p1=$D/p1/libddtree.so --ab-lib p2=$D/p2/libddtree.so \
  --ab-lib p3=$D/p3/libddtree.so --ab-rounds ${ROUNDS:-5} --shapes ${SHAPES:-8/1x512x4k,64/8x512x4k,64/8x512x64k} \
  --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
tail -32 $OUT/bench.log
for c in ta64x512 ta64x512x64k; do
  [ $SECONDS -lt ${NCU_BEFORE:-150} ] || { echo "skip ncu $c"; continue; }
  st ncu $c
  DDTREE_LIB=$M timeout 45 ncu --clock-control none -k regex:tree_attention_fa3 --launch-skip 3 --launch-count 1 \
    --warp-sampling-interval 0 --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    -o $W/ncu_$c python3 $D/engine/bench/profile/profile_ops.py $c --reps 5 > $W/ncu_run_$c.log 2>&1; echo "ncu rc=$?"
  ncu -i $W/ncu_$c.ncu-rep --page source --csv --print-source sass > $W/sass_$c.csv 2>>$W/ncu_run_$c.log
  ncu -i $W/ncu_$c.ncu-rep --page details > $W/details_$c.txt 2>&1
  { cat $W/details_$c.txt; python3 $D/engine/bench/profile/fa3_ncu_ranges.py $W/sass_$c.csv
    python3 $D/engine/bench/profile/ncu_top_sass.py $W/sass_$c.csv --top 60; } > $OUT/ncu_$c.txt 2>&1
  grep -E "Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|Compute \(SM\) Throughput|warp-stall samples" $OUT/ncu_$c.txt | head -8
done
tar czf $OUT/extra.tgz --exclude='*.ncu-rep' -C $W . 2>/dev/null
st done
