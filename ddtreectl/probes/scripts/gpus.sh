# ddtreectl GPU sampler: everything `ddtreectl gpus` needs, gathered in ONE round trip.
# Run as: sh -c "$(cat gpus.sh)" ddtree-gpus SAMPLES INTERVAL_S GPU_TIMEOUT_S UNIT
#   SAMPLES        how many times to query nvidia-smi (utilization is a duty cycle: one sample proves little)
#   INTERVAL_S     seconds between samples (may be fractional where `sleep` allows it)
#   GPU_TIMEOUT_S  bound on each nvidia-smi call (it can hang for tens of seconds with persistence off)
#   UNIT           the host's serving unit, or "" when it runs none
# Output: "@@ddtree-begin gpus N" / "@@ddtree-begin apps N" per sample, then `holders` (the owner,
# cgroup and command line of every PID any sample listed) and `units` (the serving unit's state and
# any active ddtree-dev-* unit). Parsed by ddtreectl/probes/gpu_sample.py. POSIX sh only.
# The placeholder in holders() below is replaced by ddtreectl with probes/gpu_holders.py's script (one copy of it).

samples=${1:-3}
interval=${2:-1}
gpu_timeout=${3:-10}
unit=$4
LC_ALL=C
export LC_ALL
PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"

now_ms() {
  t=$(date +%s%3N 2>/dev/null)
  case $t in *N*|"") t=$(( $(date +%s) * 1000 )) ;; esac
  echo "$t"
}

bounded() {
  if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$gpu_timeout" "$@"; else "$@"; fi
}

holders() {
@@HOLDERS_FUNCTION@@
}

have_smi=1
command -v nvidia-smi >/dev/null 2>&1 || have_smi=0
pids=
i=0
while [ "$i" -lt "$samples" ]; do
  [ "$i" -gt 0 ] && sleep "$interval"
  echo "@@ddtree-begin gpus $i"
  if [ "$have_smi" = 0 ]; then
    echo "@@ddtree-end gpus rc=127 ms=0 missing=1"
    echo "@@ddtree-begin apps $i"
    echo "@@ddtree-end apps rc=127 ms=0 missing=1"
    break  # nothing will change between samples
  fi
  t0=$(now_ms)
  bounded nvidia-smi \
    --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,persistence_mode,compute_cap \
    --format=csv,noheader,nounits 2>&1
  rc=$?
  echo
  echo "@@ddtree-end gpus rc=$rc ms=$(( $(now_ms) - t0 ))"
  echo "@@ddtree-begin apps $i"
  out=$(bounded nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory \
    --format=csv,noheader,nounits 2>&1)
  rc=$?
  printf '%s\n' "$out"
  echo "@@ddtree-end apps rc=$rc"
  # The second CSV field is the PID; word splitting drops the blank after the comma.
  for p in $(printf '%s\n' "$out" | cut -s -d, -f2); do
    case $p in ''|*[!0-9]*) ;; *) pids="$pids $p" ;; esac
  done
  i=$((i + 1))
done

echo "@@ddtree-begin holders"
# shellcheck disable=SC2086  # one PID per word on purpose
[ -n "$pids" ] && holders $(printf '%s\n' $pids | sort -un)
echo "@@ddtree-end holders rc=0"

echo "@@ddtree-begin units"
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  [ -n "$unit" ] && echo "serving $(systemctl is-active -- "$unit" 2>/dev/null)"
  # Development jobs started under systemd (systemd-run --unit ddtree-dev-NAME) also claim GPUs.
  systemctl list-units --no-legend --plain --state=active,activating,reloading 'ddtree-dev-*' 2>/dev/null \
    | while read -r name _; do echo "dev $name"; done
  echo "@@ddtree-end units rc=0"
else
  echo "@@ddtree-end units rc=127 missing=1"
fi
