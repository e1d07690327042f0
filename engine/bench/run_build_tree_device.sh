#!/usr/bin/env bash
# One device call for build_tree: build (sm_90, this op only), ddtree-selftest, compute-sanitizer
# (memcheck + racecheck), GPU pytest vs the reference heap, bench table, phase profile. Logs go to $OUT.
# STAGES (default "build selftest sanitize pytest bench profile") picks stages; "ncu" adds stall reasons,
# "variants" the out-of-line / 256-thread / 128-thread comparison, "ncusrc" per-line stall samples, e.g.
# STAGES="build selftest pytest bench profile ncu variants".
# Run from the repository root:  bash engine/bench/run_build_tree_device.sh
set -u
OUT=${OUT:-/tmp/build_tree_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-"build selftest sanitize pytest bench profile"}
BENCH_ARGS=${BENCH_ARGS:-}
root=$(pwd)
build=${BUILD_DIR:-$root/engine/build-bt}
# PREBUILT=1: use the library and self-test already in $BUILD_DIR (built on the dev machine with
# -DDDTREE_CUDA_ARCHS=90a -DDDTREE_OPS=build_tree and carried with the call): no build on the device.
if [ "${PREBUILT:-0}" = 1 ]; then
  STAGES=${STAGES/build/}
  [ -f "$build/libddtree.so" ] || { echo "PREBUILT=1 but no $build/libddtree.so"; exit 1; }
  echo "prebuilt library: $build/libddtree.so"
fi
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv,noheader || true

if has build; then
  stamp build
  { cmake -S engine -B "$build" -G Ninja -DDDTREE_CUDA_ARCHS=90 -DDDTREE_OPS=build_tree \
      -DDDTREE_PTXAS_VERBOSE=ON && cmake --build "$build"; } > "$OUT/build.log" 2>&1 \
    || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  grep -A2 "build_tree_kernel" "$OUT/build.log" | grep -E "registers|spill" || true
fi
export DDTREE_LIB=$build/libddtree.so

if has selftest; then
  stamp selftest
  timeout 120 "$build/ddtree-selftest" build_tree 2>&1 | tee "$OUT/selftest.log"
  st_rc=${PIPESTATUS[0]}
  echo "selftest rc=$st_rc"
  # The same self-tests on the previous selection (DDTREE_BUILD_TREE_IMPL is read per launch).
  for impl in ${SELFTEST_IMPLS:-v6 v6dp v7 auto v8 v8auto v9 v10}; do
    DDTREE_BUILD_TREE_IMPL=$impl timeout 120 "$build/ddtree-selftest" build_tree > "$OUT/selftest_$impl.log" 2>&1
    echo "selftest ($impl) rc=$? $(grep -c PASS "$OUT/selftest_$impl.log") PASS lines"
  done
fi

# SAN_DEFAULT=0 skips the runs under the library default (SAN_IMPLS still run).
if has sanitize && [ "${SAN_DEFAULT:-1}" = 1 ]; then
  stamp memcheck
  timeout 90 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 "$build/ddtree-selftest" \
    build_tree_golden build_tree_fallback build_tree_medium build_tree_small build_tree_large > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
fi
if has sanitize; then
  for impl in ${SAN_IMPLS:-auto v6dp v7}; do
    DDTREE_BUILD_TREE_IMPL=$impl timeout 90 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
      "$build/ddtree-selftest" build_tree_golden build_tree_medium build_tree_small build_tree_large > "$OUT/memcheck_$impl.log" 2>&1
    echo "memcheck ($impl) rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck_$impl.log")"
    DDTREE_BUILD_TREE_IMPL=$impl timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$build/ddtree-selftest" build_tree_golden build_tree_medium build_tree_small build_tree_large > "$OUT/racecheck_$impl.log" 2>&1
    echo "racecheck ($impl) rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/racecheck_$impl.log")"
  done
fi
if has sanitize && [ "${SAN_DEFAULT:-1}" = 1 ]; then
  stamp racecheck
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/ddtree-selftest" build_tree_golden \
    build_tree_medium build_tree_small build_tree_large > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; tail -3 "$OUT/racecheck.log"
fi

if has pytest; then
  stamp pytest
  # PYTEST_K narrows the selections (e.g. "auto or v8"); default: every selection.
  PYTHONPATH=$root/engine/python timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    ${PYTEST_FILES:-engine/tests/test_build_tree_gpu.py engine/tests/test_build_tree_v10_gpu.py} \
    ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"
  grep -E "passed|failed|Error|assert" "$OUT/pytest.log" | head -30
fi

if has bench; then
  stamp bench
  timeout 240 python3 engine/bench/bench_build_tree.py --json "$OUT/bench.json" $BENCH_ARGS 2>&1 \
    | tee "$OUT/bench.log"
fi
if has profile; then
  stamp profile
  # A carried build may bring the tool already compiled (same command, on the dev machine).
  [ -x "$build/bt_profile" ] || nvcc -O3 -std=c++17 -arch=sm_90 -Iengine/include \
    engine/bench/profile/build_tree_profile.cu -o "$build/bt_profile"
  timeout 60 "$build/bt_profile" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.log"
fi
# Stall reasons of the kernel itself (stage "ncu", after "profile", whose tool it reuses): the first two
# profile configurations (M=256 K=64, sharpness 4 and 8). A large "no_instruction" share confirms that
# instruction fetch (code size) is the cost; appended to profile.log.
if has ncu; then
  stamp ncu
  timeout 150 ncu --clock-control none -k regex:build_tree_kernel --launch-count 2 --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section InstructionStats "$build/bt_profile" \
    >> "$OUT/profile.log" 2>&1
  echo "ncu rc=$?"
  grep -E "Warp Cycles Per Issued|Executed Instructions  |stall|Stall" "$OUT/profile.log" | head -20
fi
# Per-line stall samples (stage "ncusrc"): one M=256 K=64 sharpness-4 launch of the profile tool built
# with -lineinfo, sampled every 32 cycles; the CUDA-line view and the hottest SASS lines go to ncusrc.log.
if has ncusrc; then
  stamp ncusrc
  nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -Iengine/include engine/bench/profile/build_tree_profile.cu \
    -o "$build/bt_profile_li" || exit 1
  rm -f "$build/bt.ncu-rep"
  timeout 150 ncu --clock-control none -k regex:build_tree_kernel --launch-count 1 --warp-sampling-interval 0 \
    --section WarpStateStats --section SourceCounters --import-source yes -o "$build/bt" "$build/bt_profile_li" \
    > "$OUT/ncusrc.log" 2>&1
  echo "ncu rc=$?"
  ncu -i "$build/bt.ncu-rep" --page source --csv --print-source sass > "$build/sass.csv" 2>>"$OUT/ncusrc.log"
  python3 engine/bench/profile/ncu_top_sass.py "$build/sass.csv" --top 80 >> "$OUT/ncusrc.log" 2>&1
  ncu -i "$build/bt.ncu-rep" --page source --csv --print-source cuda > "$build/cuda.csv" 2>>"$OUT/ncusrc.log"
  python3 engine/bench/profile/ncu_top_sass.py "$build/cuda.csv" --top 80 >> "$OUT/ncusrc.log" 2>&1
  gzip -c "$build/sass.csv" > "$OUT/sass.csv.gz"
fi
# Variant experiment (stage "variants"): the phase profile and the quick bench of the kernel built with
# v6's out-of-line helper layout and with 256 / 128 threads per CTA, appended to
# profile.log / bench.log, so one call compares them with the default build above.
if has variants; then
  for v in "outline:-DDDTREE_BUILD_TREE_OUTLINE" "t256:-DDDTREE_BUILD_TREE_THREADS=256" \
           "t128:-DDDTREE_BUILD_TREE_THREADS=128"; do
    name=${v%%:*}; flag=${v#*:}
    stamp "profile, $name"
    nvcc -O3 -std=c++17 -arch=sm_90 $flag -Iengine/include engine/bench/profile/build_tree_profile.cu \
      -o "$build/bt_profile_$name" && timeout 60 "$build/bt_profile_$name" 2>&1 | sed "s/^/[$name] /" \
      | tee -a "$OUT/profile.log"
    stamp "bench, $name"
    { cmake -S engine -B "$build-$name" -G Ninja -DDDTREE_CUDA_ARCHS=90 -DDDTREE_OPS=build_tree \
        -DCMAKE_CUDA_FLAGS=$flag && cmake --build "$build-$name"; } >> "$OUT/build.log" 2>&1 \
      && DDTREE_LIB=$build-$name/libddtree.so timeout 120 python3 engine/bench/bench_build_tree.py --quick 2>&1 \
        | sed "s/^/[$name] /" | tee -a "$OUT/bench.log"
  done
fi
stamp done
