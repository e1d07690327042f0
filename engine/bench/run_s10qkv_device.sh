#!/usr/bin/env bash
# s10qkv's one device call (copied to .device/s10qkv/ with the prebuilt sm_90a libddtree + ddtree-selftest and the
# engine's Python, tests and benches): selftest, sanitizers, GPU tests, the forward A/B and (when the bench has
# --model-predecessor) tree_attention after the real qkv_prep. Logs under $OUT, one per step, each step timed out.
set -u
D=$PWD/.device/s10qkv
export DDTREE_LIB=$D/libddtree.so PYTHONPATH=$D/engine/python PYTHONUNBUFFERED=1
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cd $D/engine
step() { local name=$1 t=$2; shift 2; local s=$(date +%s%N)
  timeout $t "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a $OUT/steps.log; tail -4 $OUT/$name.log; }
nvidia-smi -L > $OUT/steps.log
step selftest 30 $D/ddtree-selftest qkv_prep
# The repository's pyproject (pytest rootdir) puts its own engine/python first: point pythonpath at this copy.
PT="python3 -m pytest -q -x -p no:cacheprovider -o pythonpath=$D/engine/python"
step pytest_op 60 $PT tests/test_qkv_prep.py
step forward_ab 70 python3 bench/bench_forward_ab.py --ab qkv_prep --presets toy qwen3-0.6b --shapes 1x17 8x65 --rounds 7
step memcheck 30 $CS --tool memcheck --error-exitcode 9 $D/ddtree-selftest qkv_prep
step racecheck 30 $CS --tool racecheck --error-exitcode 9 $D/ddtree-selftest qkv_prep
if grep -q qkv_prep bench/bench_tree_attention.py; then
  step attn_pred 60 python3 bench/bench_tree_attention.py --quick --no-flex --impls fa3 --model-predecessor qkv_prep
fi
# The decode GPU tests with the fused op in the model's fast path (written while it was opt-in: DDTREE_QKV_PREP=1).
DDTREE_QKV_PREP=1 step decode_gpu 150 $PT tests/test_decode_gpu.py
