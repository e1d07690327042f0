#!/usr/bin/env bash
# A real `ddtreectl deploy` on the GPU machine (device tool), through the `local` transport:
#   1. first deploy: archs DETECTED from nvidia-smi's compute_cap (9.0 -> sm_90a on the H200), CMake +
#      ninja build of the engine, ddtree-selftest on the GPU (inventory says gpus: 1, so a missing GPU
#      or a failing self-test is a failure), `current` switched, build stamp written
#   2. no-op redeploy (nothing rebuilt), timed against the first
#   3. one changed engine file: only that object is recompiled (ninja step count, compiled objects)
#   4. `ddtreectl status` and `ddtreectl rollback` on the same host
# Prints every command's output and a final "DEPLOY CHECK: PASS" or "DEPLOY CHECK: FAIL (...)".
# Logs and JSON go to $OUT. OPS="draft_topk_lse;build_tree" restricts the ops built (default: all).
# Run from the repository root:  bash bench/device_deploy_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/deploy_check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
repo=$PWD
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
fail() { echo "DEPLOY CHECK: FAIL ($*)"; exit 1; }

nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
for t in python3 cmake ninja nvcc rsync flock; do
  printf '%-8s %s\n' "$t" "$(command -v "$t" || { [ "$t" = nvcc ] && ls /usr/local/cuda/bin/nvcc 2>/dev/null; } || echo 'MISSING')"
done
python3 -c "import typer, rich, yaml, jinja2; print('python deps ok')" || fail "python deps missing"

# DEPLOY_WORK keeps the work dir (and the built release) for later steps of the same device session.
work=${DEPLOY_WORK:-$(mktemp -d /tmp/ddtree-deploy-check.XXXXXX)}
mkdir -p "$work"
# A private copy of the engine: step 3 edits a source file.
mkdir -p "$work/engine"
(cd engine && tar --exclude='./build*' --exclude='__pycache__' -cf - .) | (cd "$work/engine" && tar -xf -)
cp -r templates "$work/templates"
ops_arg=""
[ -n "${OPS:-}" ] && ops_arg="      cmake_args: [\"-DDDTREE_OPS=$OPS\"]"
cat > "$work/hosts.yaml" <<EOF
hosts:
  gpu:
    transport: local
    gpus: 1
    remote_root: $work/root
    build:
      cuda_archs: ["90a"]
$ops_arg
EOF
cat "$work/hosts.yaml"
ddt() { python3 -c 'import sys; from ddtreectl.cli.main import main; sys.argv[0] = "ddtreectl"; main()' \
          -i "$work/hosts.yaml" "$@"; }
field() { python3 -c "import json,sys; h=json.load(open(sys.argv[1]))['hosts'][0]; print(h$2)" "$1"; }

stamp "1. first deploy"
t0=$(date +%s.%N)
ddt deploy gpu --json > "$OUT/first.json" 2> "$OUT/first.err"; rc=$?
t1=$(date +%s.%N)
cat "$OUT/first.err" | tail -40
cat "$OUT/first.json"
[ $rc -eq 0 ] || fail "first deploy exit $rc"
rel1=$(field "$OUT/first.json" "['release']")
echo "archs: $(field "$OUT/first.json" "['archs']") ($(field "$OUT/first.json" "['archs_source']"))"
echo "self-test: $(field "$OUT/first.json" "['selftest']")"
cp "$work/root/releases/$rel1/build.log" "$OUT/build.log" 2>/dev/null
cp "$work/root/releases/$rel1/selftest.log" "$OUT/selftest.log" 2>/dev/null
echo "--- selftest.log (tail)"; tail -25 "$work/root/releases/$rel1/selftest.log"
echo "--- .build-stamp"; cat "$work/root/releases/$rel1/.build-stamp"
[ "$(field "$OUT/first.json" "['selftest']")" = passed ] || fail "self-test did not pass"
[ "$(field "$OUT/first.json" "['archs_source']")" = detected ] || fail "archs not detected from the GPU"
[ "$(readlink "$work/root/current")" = "releases/$rel1" ] || fail "current not switched"

stamp "2. no-op redeploy"
t2=$(date +%s.%N)
ddt deploy gpu --json > "$OUT/noop.json" 2> "$OUT/noop.err" || fail "no-op deploy failed: $(tail -5 "$OUT/noop.err")"
t3=$(date +%s.%N)
[ "$(field "$OUT/noop.json" "['action']")" = noop ] || fail "redeploy was not a no-op"

stamp "3. one changed file"
echo "// device deploy check: one changed line" >> "$work/engine/src/status.cu"
t4=$(date +%s.%N)
ddt deploy gpu --json > "$OUT/one.json" 2> "$OUT/one.err" || fail "one-file deploy failed: $(tail -20 "$OUT/one.err")"
t5=$(date +%s.%N)
echo "ninja steps: first $(field "$OUT/first.json" "['ninja_steps']"), one-file $(field "$OUT/one.json" "['ninja_steps']")"
echo "one-file compiled: $(field "$OUT/one.json" "['compiled']")"
echo "one-file self-test: $(field "$OUT/one.json" "['selftest']")"
python3 - "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" <<'EOF'
import sys
t = [float(x) for x in sys.argv[1:]]
first, noop, one = t[1] - t[0], t[3] - t[2], t[5] - t[4]
print(f"first deploy {first:.1f} s | no-op {noop:.2f} s ({noop / first:.1%} of first) | "
      f"one-file change {one:.1f} s ({one / first:.1%} of first)")
EOF

stamp "4. status and rollback"
COLUMNS=200 ddt status gpu
ddt rollback --host gpu || fail "rollback failed"
[ "$(readlink "$work/root/current")" = "releases/$rel1" ] || fail "rollback did not restore $rel1"
echo "audit log:"; cat "$work/root/state/audit.log"
[ -n "${DEPLOY_WORK:-}" ] || rm -rf "$work"
echo "DEPLOY CHECK: PASS"
