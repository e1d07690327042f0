#!/usr/bin/env bash
# Session 10, issue #6 (bf16 target and drafter logits at V = 151,936; the accept's scoring loops): one device call.
#   1. correctness, three processes at once: tree_accept GPU tests; the end-to-end decode GPU tests; the selftest's
#      tree_accept and round_finish cases, then compute-sanitizer memcheck / racecheck / synccheck on the random-tree
#      case (every launch plan and scoring loop, V up to 151,936);
#   2. bench_accept_vocab.py: the accept alone at V = 151,936 (fp32 / bf16 x unrolled / compact / packed);
#   3. bench_e2e --preset qwen3-0.6b --logits fp32 act (before / after in one process, each with its AR peer) and the
#      toy, noisy oracle, CUPTI in the same process ($PRESETS, $KINDS, $LOGITS override);
#   4. bench_forward_ab --ab logits: the qwen3-0.6b target forward with fp32 vs bf16 logits, interleaved graph replays.
# $STEPS picks and orders the steps (default 1 2 3).
# Takes a prebuilt library ($LIB) and selftest ($SELFTEST), sm_90a. Run from the folder that holds engine/ and
# pyproject.toml:   LIB=lib/libddtree.so SELFTEST=lib/ddtree-selftest OUT=/tmp/out bash engine/bench/run_s10e2e_device.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/s10e2e}
LIB=${LIB:-$PWD/engine/build/libddtree.so}
SELFTEST=${SELFTEST:-$PWD/engine/build/ddtree-selftest}
STEPS=${STEPS:-1 2 3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/engine/python" DDTREE_LIB=$LIB
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
case " $STEPS " in *" 4 "*)
  stamp "4. bench_forward_ab --ab logits"
  timeout 90 python3 engine/bench/bench_forward_ab.py --ab logits --presets qwen3-0.6b \
    --shapes 1x1 8x1 1x17 1x65 8x17 8x65 > "$OUT/bench_forward_logits.log" 2>&1
  echo "rc=$?"; tail -8 "$OUT/bench_forward_logits.log"
;; esac
case " $STEPS " in *" 1 "*)
  stamp "1. correctness (three processes)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs engine/tests/test_tree_accept.py \
    > "$OUT/pytest_accept.log" 2>&1 &
  timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rs engine/tests/test_decode_gpu.py \
    > "$OUT/pytest_decode.log" 2>&1 &
  for tool in memcheck racecheck synccheck; do
    { timeout 140 compute-sanitizer --tool $tool --error-exitcode 9 "$SELFTEST" tree_accept_random_trees_vs_host \
        2>&1 | tail -4; echo "$tool rc=${PIPESTATUS[0]}"; } > "$OUT/sanitizer_$tool.log" 2>&1 &
  done
  { timeout 60 "$SELFTEST" tree_accept round_finish; echo "selftest rc=$?"; } > "$OUT/selftest.log" 2>&1
  wait
  cat "$OUT"/sanitizer_*.log > "$OUT/selftest_sanitizer.log"; rm -f "$OUT"/sanitizer_*.log
  tail -4 "$OUT/selftest.log"
  grep -E "passed|failed|rc=|ERROR SUMMARY|^FAILED|^ERROR" "$OUT/selftest_sanitizer.log" "$OUT/pytest_accept.log" \
    "$OUT/pytest_decode.log" | tail -20
  grep -hE "bf16 logits|oracle drafter" "$OUT/pytest_decode.log" | head -4
;; esac
case " $STEPS " in *" 2 "*)
  stamp "2. bench_accept_vocab"
  timeout 120 python3 engine/bench/bench_accept_vocab.py > "$OUT/bench_accept_vocab.log" 2>&1
  echo "rc=$?"; tail -36 "$OUT/bench_accept_vocab.log"
;; esac
case " $STEPS " in *" 3 "*)
  for p in ${PRESETS:-qwen3-0.6b toy}; do
    stamp "3. bench_e2e --preset $p"
    timeout 200 python3 engine/bench/bench_e2e.py --preset "$p" --kinds ${KINDS:-noisy} --logits ${LOGITS:-fp32 act} \
      --batch 1 8 --distill-steps 300 \
      --budgets 16 64 --tokens 64 --cupti > "$OUT/bench_$p.log" 2>&1
    echo "rc=$?"
    grep -E "^model|copy bandwidth|AR \(|DDTree|CUPTI summary|Error|error" "$OUT/bench_$p.log" | sed -E 's/ +/ /g'
  done
;; esac
stamp "done"
