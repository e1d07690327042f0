#!/usr/bin/env bash
# E1's one-call device run: build the E1 ops for sm_90, selftest, compute-sanitizer, GPU tests, benches.
# Logs go to $OUT (the device tool's folder) or /tmp/e1out. Usage: bash engine/bench/run_e1_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/e1out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
B=engine/build-e1
t0=$(date +%s)
if ! (cmake -S engine -B $B -G Ninja -DDDTREE_CUDA_ARCHS=90 -DDDTREE_PTXAS_VERBOSE=ON \
      -DDDTREE_OPS="draft_topk_lse;tree_accept;kv_commit" && cmake --build $B -j 16) > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
export DDTREE_LIB=$PWD/$B/libddtree.so
timeout 120 $B/ddtree-selftest 2>&1 | tee "$OUT/selftest.log"
echo "selftest rc=${PIPESTATUS[0]}"
timeout 180 python3 -m pytest engine/tests/test_draft_topk_lse.py engine/tests/test_tree_accept.py \
  engine/tests/test_kv_commit.py -m gpu -p no:cacheprovider -q 2>&1 | tee "$OUT/pytest.log" | tail -15
export DDTREE_BENCH_OUT=$OUT
for b in draft_topk_lse tree_accept kv_commit; do
  timeout 120 python3 engine/bench/bench_$b.py > "$OUT/bench_$b.log" 2>&1
  echo "bench_$b rc=$?"; tail -16 "$OUT/bench_$b.log"
done
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $B/ddtree-selftest golden sanitizer_sized kv_commit \
    gumbel > "$OUT/sanitizer_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
done
echo "total: $(( $(date +%s) - t0 )) s"
