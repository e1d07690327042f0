#!/usr/bin/env bash
# s11fa3 device call (as run, but for fa3_ncu_ranges.py, which ran here on the returned CSVs): selftest,
# bench A/B (proto vs main), ncu SourceCounters (main, proto), pytest and sanitizers on the proto library.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; D=$R/.device/s11fa3
OUT=${OUT:-/tmp/s11out}; mkdir -p "$OUT"; W=/tmp/s11w; mkdir -p $W
export PYTHONPATH=$D/engine/python:$D/engine/bench
A=$D/a/libddtree.so; M=$D/main/libddtree.so
st() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }
left() { [ $SECONDS -lt $1 ]; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee $OUT/gpu.txt
st selftest proto
LD_LIBRARY_PATH=$D/a timeout 90 $D/a/ddtree-selftest tree_attention > $OUT/checks.log 2>&1; echo "selftest rc=$?" | tee -a $OUT/checks.log
grep -E "PASS|FAIL" $OUT/checks.log | tail -6
st bench
DDTREE_LIB=$A timeout 150 python3 $D/engine/bench/bench_tree_attention.py --impls fa3 --no-flex --interleaved-floor \
  --ab-lib main=$M --ab-rounds 3 --json $W/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
tail -24 $OUT/bench.log
for n in main a; do
  left 150 || { echo "skip ncu $n"; continue; }
  st ncu $n
  L=$M; [ $n = a ] && L=$A
  DDTREE_LIB=$L timeout 70 ncu --clock-control none -k regex:tree_attention_fa3 --launch-skip 3 --launch-count 1 \
    --warp-sampling-interval 0 --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    -o $W/ncu_$n python3 $D/engine/bench/profile/profile_ops.py ta64x512 --reps 5 > $W/ncu_run_$n.log 2>&1; echo "ncu rc=$?"
  ncu -i $W/ncu_$n.ncu-rep --page source --csv --print-source sass > $W/sass_$n.csv 2>>$W/ncu_run_$n.log
  ncu -i $W/ncu_$n.ncu-rep --page details > $W/details_$n.txt 2>&1
  { cat $W/details_$n.txt; python3 $D/engine/bench/profile/fa3_ncu_ranges.py $W/sass_$n.csv
    python3 $D/engine/bench/profile/ncu_top_sass.py $W/sass_$n.csv --top 70; } > $OUT/ncu_$n.txt 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|warp-stall samples" $OUT/ncu_$n.txt | head -6
  if [ $n = main ]; then left 170 && {
    st pytest proto
    DDTREE_LIB=$A timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -rs -k "fa3" $D/engine/tests/test_tree_attention_gpu.py >> $OUT/checks.log 2>&1
    echo "pytest proto rc=$?" | tee -a $OUT/checks.log; tail -2 $OUT/checks.log
    DDTREE_LIB=$M timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu -k "row_max" $D/engine/tests/test_tree_attention_gpu.py >> $OUT/checks.log 2>&1
    echo "pytest row_max main rc=$?" | tee -a $OUT/checks.log
    for t in memcheck racecheck synccheck; do
      left 215 || { echo "skip $t"; continue; }
      LD_LIBRARY_PATH=$D/a timeout 50 compute-sanitizer --tool $t --error-exitcode 9 $D/a/ddtree-selftest tree_attention_zz_fa3 > $W/san_$t.log 2>&1
      echo "sanitizer $t: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$t.log | tail -1)" | tee -a $OUT/checks.log
    done; }
  fi
done
tar czf $OUT/extra.tgz --exclude='*.ncu-rep' -C $W . 2>/dev/null
st done
