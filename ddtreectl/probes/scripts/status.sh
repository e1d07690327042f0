# ddtreectl status probe: everything `ddtreectl status` shows, gathered in ONE round trip.
# Run as: sh -c "$(cat status.sh)" ddtree-probe UNIT REMOTE_ROOT GPU_TIMEOUT_S
#   UNIT         systemd unit file name, or "" when the host runs no service
#   REMOTE_ROOT  ddtree root (releases/, current, state/); a leading "~/" means $HOME
# Output: sections "@@ddtree-begin NAME" ... "@@ddtree-end NAME rc=N ms=N [missing=1]", parsed by
# ddtreectl/probes/parse.py. Every part is bounded and tolerant: a missing tool or file is reported,
# never fatal, so one broken fact cannot hide the others. POSIX sh only (dash, busybox, bash).

unit=$1
root=$2
gpu_timeout=${3:-10}
case $root in "~/"*) root="$HOME/${root#"~/"}" ;; "~") root=$HOME ;; esac
# Parsers expect C-locale number and date formats whatever the login locale is.
LC_ALL=C
export LC_ALL
PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"

now_ms() {
  # GNU date knows %N; elsewhere fall back to whole seconds (the durations are only advisory).
  t=$(date +%s%3N 2>/dev/null)
  case $t in *N*|"") t=$(( $(date +%s) * 1000 )) ;; esac
  echo "$t"
}

# run_section NAME TOOL CMD...: run CMD (stderr folded in, so error text reaches the parser), then
# close the section with its exit status and duration; missing=1 when TOOL is not installed.
run_section() {
  name=$1
  tool=$2
  shift 2
  echo "@@ddtree-begin $name"
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "@@ddtree-end $name rc=127 ms=0 missing=1"
    return
  fi
  t0=$(now_ms)
  "$@" 2>&1
  rc=$?
  echo
  echo "@@ddtree-end $name rc=$rc ms=$(( $(now_ms) - t0 ))"
}

# `timeout` bounds nvidia-smi, which can hang for tens of seconds with persistence mode off.
bounded() {
  if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$gpu_timeout" "$@"; else "$@"; fi
}

echo "@@ddtree-begin meta"
echo "hostname=$(cat /proc/sys/kernel/hostname 2>/dev/null || hostname 2>/dev/null)"
echo "machine_id=$(cat /etc/machine-id 2>/dev/null)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
echo "uptime=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)"
echo "kernel=$(uname -r 2>/dev/null)"
echo "user=$(id -un 2>/dev/null)"
echo "now=$(date +%s 2>/dev/null)"
echo "pid1=$(cat /proc/1/comm 2>/dev/null)"
echo "@@ddtree-end meta rc=0 ms=0"

run_section gpus nvidia-smi bounded nvidia-smi \
  --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,persistence_mode,compute_cap \
  --format=csv,noheader,nounits
run_section apps nvidia-smi bounded nvidia-smi \
  --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits

main_pid=0
if [ -n "$unit" ]; then
  props=LoadState,ActiveState,SubState,UnitFileState,Result,ExecMainStatus,NRestarts,ActiveEnterTimestamp,NeedDaemonReload,MainPID
  # --timestamp=unix (systemd >= 247) gives locale-free timestamps; older systemd rejects the flag.
  show() {
    systemctl show --timestamp=unix -p "$props" -- "$unit" 2>/dev/null \
      || systemctl show -p "$props" -- "$unit"
  }
  run_section service systemctl show
  if command -v systemctl >/dev/null 2>&1; then
    main_pid=$(systemctl show -p MainPID --value -- "$unit" 2>/dev/null)
  fi
fi

echo "@@ddtree-begin release"
echo "root=$root"
if [ -d "$root" ]; then echo "root_exists=1"; else echo "root_exists=0"; fi
if [ -L "$root/current" ]; then
  echo "current_link=$(readlink "$root/current")"
  target=$(readlink -f "$root/current" 2>/dev/null)
  echo "current_path=$target"
  if [ -d "$target" ]; then echo "current_exists=1"; else echo "current_exists=0"; fi
  if [ -f "$target/.build-stamp" ]; then echo "stamp=1"; else echo "stamp=0"; fi
fi
if [ -d "$root/releases" ]; then
  for r in "$root/releases"/*; do [ -d "$r" ] && echo "release=${r##*/}"; done
fi
# The running release: where the service's main process was started from (exe/cwd resolve the
# `current` symlink at exec time), to tell "restart pending" after a switch.
case $main_pid in ''|0|*[!0-9]*) ;; *)
  echo "main_pid=$main_pid"
  echo "main_exe=$(readlink "/proc/$main_pid/exe" 2>/dev/null)"
  echo "main_cwd=$(readlink "/proc/$main_pid/cwd" 2>/dev/null)"
  ;;
esac
echo "@@ddtree-end release rc=0 ms=0"

if [ -d "$root/current/" ] && [ -f "$root/current/.build-stamp" ]; then
  echo "@@ddtree-begin stamp"
  head -c 4096 "$root/current/.build-stamp" 2>/dev/null
  echo
  echo "@@ddtree-end stamp rc=0 ms=0"
fi

# Lock and mode-lease files of later commands, passed through raw (small files only; the audit
# log grows without bound and is not a status fact).
if [ -d "$root/state" ]; then
  for f in "$root/state"/* "$root/state"/*/*; do
    [ -f "$f" ] || continue
    case $f in *.log) continue ;; esac
    size=$(wc -c <"$f" 2>/dev/null)
    [ "${size:-0}" -le 65536 ] || continue
    echo "@@ddtree-begin file ${f#"$root/"}"
    cat "$f" 2>/dev/null
    echo
    echo "@@ddtree-end file rc=0 ms=0"
  done
fi

# Free space where releases go; before the first deploy, on the nearest existing parent.
dir=$root
while [ ! -d "$dir" ] && [ "$dir" != "/" ] && [ -n "$dir" ]; do dir=$(dirname "$dir"); done
run_section disk df df -P -k "$dir"
