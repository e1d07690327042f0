#!/usr/bin/env bash
# The session's final verification on the H200 (device tool), in two back-to-back calls:
#   STAGE=1: a real `ddtreectl deploy` through the local transport (full engine build for the detected
#            arch, ddtree-selftest of every op on the GPU, no-op and one-file redeploys, status, rollback);
#            then, against the library that deploy built: every kernel's GPU tests (all implementations:
#            draft_topk_lse v2/v3, tree_attention mma/wgmma/fa3), the end-to-end decoding GPU tests, and
#            `ddtreectl gpus` idle -> busy -> idle on the real GPU.
#   STAGE=2: benches (draft_topk_lse, build_tree, tree_attention, end-to-end decoding) on that library.
# Every step has its own timeout so one hang cannot eat the call (the device tool returns at most 8
# files from $OUT, so each stage writes at most 7 logs there plus one archive).
# Run from the repository root:  STAGE=1 bash engine/bench/run_final_device.sh   (carry build/wheels)
set -u
export PYTHONUNBUFFERED=1
# The main logs go straight to $OUT (they come back even if the call is cut off); the sub-scripts'
# many files go under /tmp/final_logs and are packed into one archive at the end.
OUT=${OUT:-/tmp/final_device}
SUB=/tmp/final_logs
mkdir -p "$OUT" "$SUB"
STAGE=${STAGE:-1}
pack() { tar czf "$OUT/stage$STAGE-sub-logs.tgz" -C "$SUB" . 2>/dev/null; }
trap pack EXIT
root=$PWD
stamp() { echo "[$(date +%H:%M:%S)] $*"; }

# ddtreectl's own Python dependencies, pinned (typer < 0.29), ahead of the image's packages.
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  build/wheels/typer-*.whl build/wheels/rich-*.whl build/wheels/shellingham-*.whl \
  build/wheels/annotated_doc-*.whl build/wheels/markdown_it_py-*.whl build/wheels/mdurl-*.whl \
  build/wheels/pygments-*.whl build/wheels/typing_extensions-*.whl build/wheels/pyyaml-*-$py-*.whl \
  > "$SUB/pip.log" 2>&1 || { echo "pip install of the wheels failed"; tail -5 "$SUB/pip.log"; }
export PYTHONPATH="/tmp/site:$root:$root/engine/python"
work=$root/build/deploy-check

find_lib() {  # the library the deploy built (current release, else any staged or built release)
  for f in "$work/root/current/build/libddtree.so" "$work"/root/releases/*/build/libddtree.so \
           "$work"/root/releases/.incoming-*/build/libddtree.so; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
}

if [ "$STAGE" = 1 ]; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  stamp "1. ddtreectl deploy on the GPU machine (bench/device_deploy_check.sh)"
  rm -rf "$work"
  DEPLOY_WORK=$work OUT=$SUB/deploy timeout 280 bash bench/device_deploy_check.sh > "$OUT/deploy.log" 2>&1
  echo "deploy check rc=$?"
  grep -E "DEPLOY CHECK|archs:|self-test:|first deploy|ninja steps|one-file compiled" "$OUT/deploy.log"
  lib=$(find_lib)
  echo "library: ${lib:-NONE}"
  [ -n "$lib" ] || { tail -40 "$OUT/deploy.log"; exit 1; }
  sed -n '/--- selftest.log/,/--- .build-stamp/p' "$OUT/deploy.log" | grep -vE "^ok" | tail -30
  export DDTREE_LIB=$lib

  stamp "2. kernel GPU tests (every implementation)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs \
    engine/tests/test_draft_topk_lse.py engine/tests/test_tree_accept.py engine/tests/test_kv_commit.py \
    engine/tests/test_build_tree_gpu.py engine/tests/test_tree_attention_gpu.py engine/tests/test_lib.py \
    engine/tests/test_round_update.py \
    > "$OUT/pytest_kernels.log" 2>&1
  echo "kernel pytest rc=$?"
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest_kernels.log" | head -25

  stamp "2b. compute-sanitizer on the self-tests of every op (the library the deploy built)"
  st=$(dirname "$lib")/ddtree-selftest
  for t in "memcheck draft_topk_lse_sanitizer_sized" "racecheck draft_topk_lse_sanitizer_sized" \
           "memcheck build_tree_golden" "racecheck build_tree_golden" "memcheck round_update" \
           "racecheck round_update" "memcheck kv_commit" "memcheck tree_accept" \
           "memcheck tree_attention_zz_fa3" "racecheck tree_attention_zz_fa3" "synccheck tree_attention_zz_fa3"; do
    set -- $t
    timeout 100 compute-sanitizer --tool $1 --error-exitcode 9 "$st" $2 > "$SUB/san_$1_$2.log" 2>&1
    echo "sanitizer $1 $2: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$SUB/san_$1_$2.log" | tail -1)"
  done

  stamp "3. end-to-end decoding GPU tests"
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_decode_gpu.py -s \
    > "$OUT/pytest_decode.log" 2>&1
  echo "decode pytest rc=$?"
  grep -E "passed|failed|^FAILED|^ERROR|match" "$OUT/pytest_decode.log" | head -20

  stamp "4. ddtreectl gpus: idle, busy under a PyTorch process, idle again"
  OUT=$SUB/gpus timeout 60 bash bench/device_gpus_check.sh > "$OUT/gpus.log" 2>&1
  echo "gpus check rc=$?"
  grep -E "=====|device_gpus_check" "$OUT/gpus.log" | head -20
  stamp "stage 1 done"
else
  lib=$(find_lib)
  echo "library: ${lib:-NONE}"
  [ -n "$lib" ] || exit 1
  export DDTREE_LIB=$lib DDTREE_BENCH_OUT=$SUB
  stamp "bench draft_topk_lse (v2 vs v3 vs torch)"
  timeout 70 python3 engine/bench/bench_draft_topk_lse.py > "$OUT/bench_topk.log" 2>&1; echo "rc=$?"
  tail -16 "$OUT/bench_topk.log"
  stamp "bench build_tree (vs the Python heap)"
  timeout 50 python3 engine/bench/bench_build_tree.py --quick > "$OUT/bench_build_tree.log" 2>&1; echo "rc=$?"
  tail -14 "$OUT/bench_build_tree.log"
  stamp "bench tree_attention (mma / wgmma / fa3 vs SDPA and flex)"
  timeout 110 python3 engine/bench/bench_tree_attention.py --json "$OUT/bench_tree_attention.json" \
    > "$OUT/bench_tree_attention.log" 2>&1; echo "rc=$?"
  tail -22 "$OUT/bench_tree_attention.log"
  stamp "bench end to end (AR vs DDTree, CUDA graphs)"
  timeout 100 python3 engine/bench/bench_e2e.py --batch 1 8 --budgets 16 64 --tokens 256 --distill-steps 300 \
    > "$OUT/bench_e2e.log" 2>&1; echo "rc=$?"
  tail -20 "$OUT/bench_e2e.log"
  stamp "bench end to end on a ~0.7B-parameter model (16 layers, d_model 2048, head_dim 128): round overhead share"
  timeout 150 python3 engine/bench/bench_e2e.py --batch 1 8 --budgets 16 64 --tokens 128 --kinds noisy \
    --d-model 2048 --heads 16 --kv-heads 4 --head-dim 128 --layers 16 > "$OUT/bench_e2e_large.log" 2>&1; echo "rc=$?"
  tail -10 "$OUT/bench_e2e_large.log"
  stamp "stage 2 done"
fi
