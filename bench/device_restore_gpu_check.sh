#!/usr/bin/env bash
# Issue 7 on a real GPU: `ddtreectl restore-service` must refuse (exit 7, naming the PID and command)
# while a process other than the service holds the GPU, and get past the GPU check once it exits.
# The GPU machine runs no systemd, so the release and the rendered unit are laid out as deploy leaves
# them (files only); past the GPU check, starting the unit then fails there (exit 5), which is expected.
# Run from the repository root on the device (carry build/wheels): bash bench/device_restore_gpu_check.sh
set -u
export PYTHONUNBUFFERED=1
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site build/wheels/typer-*.whl \
  build/wheels/rich-*.whl build/wheels/shellingham-*.whl build/wheels/annotated_doc-*.whl \
  build/wheels/markdown_it_py-*.whl build/wheels/mdurl-*.whl build/wheels/pygments-*.whl \
  build/wheels/typing_extensions-*.whl build/wheels/pyyaml-*-$py-*.whl > /tmp/pip.log 2>&1
export PYTHONPATH="/tmp/site:$PWD"
work=$(mktemp -d /tmp/restore-gpu.XXXXXX)
root=$work/root
mkdir -p "$root/releases/r1"
echo '{"id": "r1"}' > "$root/releases/r1/.build-stamp"
ln -s releases/r1 "$root/current"
cp -r templates "$work/templates"
cat > "$work/hosts.yaml" <<YAML
services:
  ref:
    template: sglang-ddtree.service.j2
    python: $(command -v python3)
    module: ddtree_engine.serve
    unit_name: ref-ddtree
    port: 30000
    model_path: /models/tiny
    served_model_name: tiny
hosts:
  gpu:
    transport: local
    gpus: 1
    role: prod
    service: ref
    remote_root: $root
YAML
python3 - "$work/hosts.yaml" <<'PY'
import sys
from pathlib import Path
from ddtreectl.inventory.loader import load
from ddtreectl.render.units import render_service
inv = load(Path(sys.argv[1]))
rendered = render_service(inv, inv.host("gpu"))
for f in rendered.files:  # what deploy's install_units writes
    Path(f.path).parent.mkdir(parents=True, exist_ok=True)
    Path(f.path).write_text(f.content)
    print("installed", f.path)
PY
ddt() { python3 -c 'import sys; from ddtreectl.cli.main import main; sys.argv[0] = "ddtreectl"; main()' \
          -i "$work/hosts.yaml" "$@"; }
python3 -c "
import time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda')
print('holder: 4 GiB on the GPU', flush=True)
time.sleep(120)" &
holder=$!
for _ in $(seq 60); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$holder" && break; sleep 0.5
done
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader
echo "===== restore-service while pid $holder holds the GPU (expect exit 7)"
ddt restore-service gpu; rc1=$?
echo "===== exit $rc1"
kill "$holder"; wait "$holder" 2>/dev/null
sleep 1
echo "===== restore-service after it exited (expect the GPU check to pass; no systemd here: exit 5)"
ddt restore-service gpu; rc2=$?
echo "===== exit $rc2"
rm -f /etc/systemd/system/ref-ddtree.service
[ "$rc1" = 7 ] && [ "$rc2" != 7 ] && echo "RESTORE GPU CHECK: PASS" || echo "RESTORE GPU CHECK: FAIL"
