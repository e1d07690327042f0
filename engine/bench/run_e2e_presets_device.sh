#!/usr/bin/env bash
# Issue #6 at realistic shapes (session 9): one device call, one process per preset, CUDA graphs, CUPTI in the
# same process as the bench (bench_e2e.py --cupti):
#   1. the bf16 fast path's GPU tests (fail early if the new path is broken; timings follow regardless);
#   2. bench_e2e --preset qwen3-0.6b, toy, then qwen3-1.7b (batch 1/8 x budget 16/64; drafters: TinyDrafter
#      distilled on the GPU, and the noisy oracle as a labelled second row);
#   3. the whole end-to-end GPU test file (exact lossless + fast mode), two processes at once; then qwen3-1.7b.
# Takes a prebuilt library in $LIB (sm_90a). Logs under $OUT (at most 8 files come back). Run from the folder
# that holds engine/ and pyproject.toml:   LIB=lib/libddtree.so OUT=/tmp/out bash engine/bench/run_e2e_presets_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/e2e_presets}
LIB=${LIB:-$PWD/engine/build/libddtree.so}
PRESETS=${PRESETS:-qwen3-0.6b toy qwen3-1.7b}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$LIB
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
D=engine/tests/test_decode_gpu.py
stamp "1. bf16 fast-path GPU tests"
timeout 45 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rs $D -k bf16 > "$OUT/pytest_bf16.log" 2>&1
echo "rc=$?"; grep -E "bf16|batched|oracle|passed|failed|Error" "$OUT/pytest_bf16.log" | tail -8
for p in $PRESETS; do
  [ "$p" = qwen3-1.7b ] && continue
  case $p in
    toy) T=60; TOK=64 ;;
    qwen3-0.6b) T=90; TOK=64 ;;
    *) T=90; TOK=48 ;;
  esac
  stamp "2. bench_e2e --preset $p"
  timeout $T python3 engine/bench/bench_e2e.py --preset "$p" --batch 1 8 --budgets 16 64 --tokens $TOK \
    --distill-steps 300 --cupti > "$OUT/bench_$p.log" 2>&1
  echo "rc=$?"
  grep -E "^model|copy bandwidth|distilled drafter|drafter weight|AR \(|DDTree|CUPTI summary" "$OUT/bench_$p.log" \
    | sed -E 's/ +/ /g'
done
stamp "3. end-to-end GPU tests"
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rs $D -k "greedy_lossless" > "$OUT/pytest_e2e_a.log" 2>&1 &
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rs $D -k "not greedy_lossless and not bf16" \
  > "$OUT/pytest_e2e_b.log" 2>&1
wait
grep -hE "passed|failed|^FAILED|^ERROR" "$OUT/pytest_e2e_a.log" "$OUT/pytest_e2e_b.log" | tail -8
for p in $PRESETS; do
  [ "$p" = qwen3-1.7b ] || continue
  case $p in
    toy) T=60; TOK=64 ;;
    qwen3-0.6b) T=90; TOK=64 ;;
    *) T=90; TOK=48 ;;
  esac
  stamp "2. bench_e2e --preset $p"
  timeout $T python3 engine/bench/bench_e2e.py --preset "$p" --batch 1 8 --budgets 16 64 --tokens $TOK \
    --distill-steps 300 --cupti > "$OUT/bench_$p.log" 2>&1
  echo "rc=$?"
  grep -E "^model|copy bandwidth|distilled drafter|drafter weight|AR \(|DDTree|CUPTI summary" "$OUT/bench_$p.log" \
    | sed -E 's/ +/ /g'
done
stamp "done"
