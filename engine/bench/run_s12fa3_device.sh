#!/usr/bin/env bash
# s12fa3 device call (tree_attention v21, NOTES.md): selftest on the LPT library, bench A/B (LPT library vs main's,
# and the same library in index order), ncu SpeedOfLight of 64/8 x 512 x 4k for both (SM active cycles), then GPU
# pytest -k fa3 beside the three sanitizers on tree_attention_zz_fa3 (LPT library). Libraries carried in
# .device/s12fa3/{a,main}; run from the repository root of the device copy. STAGE=2: the second call (the gated
# default: selftest, bench A/B in 5 rounds with the order forced both ways, the order's GPU tests).
set -u
export PYTHONUNBUFFERED=1
R=$PWD; D=$R/.device/s12fa3
OUT=${OUT:-/tmp/s12out}; mkdir -p "$OUT"; W=/tmp/s12w; mkdir -p $W
export PYTHONPATH=$D/engine/python:$D/engine/bench
A=$D/a/libddtree.so; M=$D/main/libddtree.so
st() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }
left() { [ $SECONDS -lt $1 ]; }
if [ "${STAGE:-1}" = 2 ]; then  # call 2: the gated default (NOTES v21), library in .device/s12fa3/a
  nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv | tee $OUT/gpu.txt
  st selftest v21
  LD_LIBRARY_PATH=$D/a timeout 60 $D/a/ddtree-selftest tree_attention > $OUT/checks.log 2>&1; echo "selftest rc=$?" | tee -a $OUT/checks.log
  grep -E "PASS|FAIL" $OUT/checks.log | tail -6
  st bench
  DDTREE_LIB=$A timeout 80 python3 $D/engine/bench/bench_tree_attention.py --impls fa3 --no-flex --interleaved-floor \
    --ab --ab-only fa3_index_order,fa3_lpt --ab-lib main=$M --ab-rounds 5 --json $W/bench.json > $OUT/bench.log 2>&1
  echo "bench rc=$?"; tail -42 $OUT/bench.log
  st pytest
  DDTREE_LIB=$A timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu -rs -k "fa3 and (longest or schedules or pdl)" \
    $D/engine/tests/test_tree_attention_gpu.py > $OUT/pytest.log 2>&1; echo "pytest rc=$?" | tee -a $OUT/checks.log
  tail -2 $OUT/pytest.log; cp $W/bench.json $OUT/ 2>/dev/null; st done; exit 0
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee $OUT/gpu.txt
st selftest lpt
LD_LIBRARY_PATH=$D/a timeout 60 $D/a/ddtree-selftest tree_attention > $OUT/checks.log 2>&1; echo "selftest rc=$?" | tee -a $OUT/checks.log
grep -E "PASS|FAIL" $OUT/checks.log | tail -6
st bench
DDTREE_LIB=$A timeout 110 python3 $D/engine/bench/bench_tree_attention.py --impls fa3 --no-flex --interleaved-floor \
  --ab --ab-only fa3_index_order --ab-lib main=$M --ab-rounds 3 --json $W/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
tail -40 $OUT/bench.log
for n in main a; do
  left 160 || { echo "skip ncu $n"; continue; }
  st ncu $n
  L=$M; [ $n = a ] && L=$A
  DDTREE_LIB=$L timeout 40 ncu --clock-control none -k regex:tree_attention_fa3 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats -o $W/ncu_$n python3 $D/engine/bench/profile/profile_ops.py ta64x512 --reps 5 \
    > $W/ncu_run_$n.log 2>&1; echo "ncu rc=$?"
  ncu -i $W/ncu_$n.ncu-rep --page details > $OUT/ncu_$n.txt 2>&1
  grep -E "Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|Compute \(SM\) Throughput|Grid Size" $OUT/ncu_$n.txt | head -8
done
st pytest + sanitizers
DDTREE_LIB=$A timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs -k "fa3" $D/engine/tests/test_tree_attention_gpu.py \
  > $W/pytest.log 2>&1 &
PY=$!
for t in memcheck racecheck synccheck; do
  LD_LIBRARY_PATH=$D/a timeout 70 compute-sanitizer --tool $t --error-exitcode 9 $D/a/ddtree-selftest tree_attention_zz_fa3 > $W/san_$t.log 2>&1
  echo "sanitizer $t: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$t.log | tail -1)" | tee -a $OUT/checks.log
done
wait $PY; echo "pytest rc=$?" | tee -a $OUT/checks.log; tail -3 $W/pytest.log | tee -a $OUT/checks.log
cp $W/pytest.log $OUT/ 2>/dev/null
tar czf $OUT/extra.tgz --exclude='*.ncu-rep' -C $W . 2>/dev/null
st done
