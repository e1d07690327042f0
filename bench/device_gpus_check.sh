#!/usr/bin/env bash
# The real-GPU check of `ddtreectl gpus` (issue 8), for one device call on the H200 machine:
#   1. idle   2. busy while a PyTorch process holds memory and computes   3. idle again after it exits.
# Each phase prints `ddtreectl gpus local --json` (3 samples, 1 s apart) and its exit code (0 idle, 7 busy),
# and saves the RAW nvidia-smi output of that moment under $OUT/fixtures/ (real captures for
# tests/probes/fixtures). Exits non-zero when a phase's verdict is not the expected one.
#
# Run from the repository root:  bash bench/device_gpus_check.sh
# Needs python3 with torch + CUDA. When typer/rich/PyYAML are missing there, they are installed from
# build/wheels (git-ignored; carry it: ["build/wheels"]). Fill it here first with
#   pip download --no-deps --only-binary=:all: -d build/wheels typer==0.28.0 click==8.4.0 rich==15.0.0 \
#     annotated-doc shellingham markdown-it-py mdurl pygments typing_extensions
#   for py in 3.10 3.11 3.12 3.13; do pip download --no-deps --only-binary=:all: --python-version $py \
#     --platform manylinux2014_x86_64 -d build/wheels pyyaml==6.0.3; done
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_gpus_check}
mkdir -p "$OUT/fixtures"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! python3 -c "import typer, rich, yaml" 2>/dev/null; then
  if [ -d build/wheels ]; then
    python3 -m pip install -q --no-index --find-links build/wheels typer rich pyyaml || exit 3
  else
    echo "device_gpus_check: typer/rich/PyYAML missing and no build/wheels to install them from" >&2
    exit 3
  fi
fi

work=$(mktemp -d)
cat > "$work/hosts.yaml" <<YAML
hosts:
  local:
    transport: local
    address: 127.0.0.1
    gpus: 1
    remote_root: $work/root
YAML

gpus() {  # phase-name expected-exit-code
  local phase=$1 expected=$2 rc
  nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,persistence_mode,compute_cap \
    --format=csv,noheader,nounits > "$OUT/fixtures/nvidia-smi-gpus-h200-$phase.txt" 2>&1
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits \
    > "$OUT/fixtures/nvidia-smi-apps-h200-$phase.txt" 2>&1
  echo "===== phase $phase: ddtreectl gpus local --json (expect exit $expected)"
  python3 -c 'import sys; from ddtreectl.cli.main import main; sys.argv[0] = "ddtreectl"; main()' \
    -i "$work/hosts.yaml" gpus local --json --samples 3 --interval 1 | tee "$OUT/gpus-$phase.json"
  rc=${PIPESTATUS[0]}
  echo "===== phase $phase: exit $rc"
  python3 -c 'import sys; from ddtreectl.cli.main import main; main()' -i "$work/hosts.yaml" gpus local \
    --samples 3 --interval 1 > "$OUT/gpus-$phase.txt" 2>&1
  cat "$OUT/gpus-$phase.txt"
  [ "$rc" = "$expected" ] || { echo "UNEXPECTED: phase $phase exited $rc, expected $expected"; failed=1; }
}

failed=0
gpus idle-before 0

# A PyTorch process that holds ~16 GiB and keeps the GPU computing until told to stop.
cat > "$work/hold.py" <<'PY'
import os, sys, time, torch
stop, ready = sys.argv[1], sys.argv[2]
x = torch.empty(16 << 30, dtype=torch.uint8, device="cuda")  # held memory
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
open(ready, "w").write(str(os.getpid()))
deadline = time.time() + 120  # never outlive the call
while not os.path.exists(stop) and time.time() < deadline:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PY
python3 "$work/hold.py" "$work/stop" "$work/ready" > "$OUT/holder.log" 2>&1 &
holder=$!
for _ in $(seq 120); do [ -s "$work/ready" ] && break; sleep 0.5; done
echo "PyTorch holder pid $holder (ready: $(cat "$work/ready" 2>/dev/null || echo no))"
[ -s "$work/ready" ] || { echo "the PyTorch holder did not start:"; cat "$OUT/holder.log"; }
sleep 2
gpus busy-torch 7

touch "$work/stop"
wait "$holder"
echo "PyTorch holder exited with $?"
sleep 3  # utilization is a duty cycle over the last sample period
gpus idle-after 0

rm -rf "$work"
echo "device_gpus_check: $([ $failed = 0 ] && echo PASS || echo FAIL) (outputs and raw nvidia-smi captures in $OUT)"
exit $failed
