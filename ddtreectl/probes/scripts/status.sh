# ddtreectl status probe: everything `ddtreectl status` shows, gathered in ONE round trip.
# Run as: sh -c "$(cat status.sh)" ddtree-probe UNIT REMOTE_ROOT GPU_TIMEOUT_S [PORT]
#   UNIT         systemd unit file name, or "" when the host runs no service
#   REMOTE_ROOT  ddtree root (releases/, current, state/); a leading "~/" means $HOME
#   PORT         the service's HTTP port on this host ("" or absent: it serves none here)
# Output: sections "@@ddtree-begin NAME" ... "@@ddtree-end NAME rc=N ms=N [missing=1]", parsed by
# ddtreectl/probes/parse.py. Every part is bounded and tolerant: a missing tool or file is reported,
# never fatal, so one broken fact cannot hide the others. POSIX sh only (dash, busybox, bash).

unit=$1
root=$2
gpu_timeout=${3:-10}
port=${4:-}
case $root in "~/"*) root="$HOME/${root#"~/"}" ;; "~") root=$HOME ;; esac
# Parsers expect C-locale number and date formats whatever the login locale is.
LC_ALL=C
export LC_ALL
PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"

# Forks are the probe's main cost on a loaded host, so builtins (read, case, ${x%/*}) do the small
# jobs and only the tools that must run are run.

# now_ms: set $now to milliseconds since boot from /proc/uptime (centiseconds, read without a fork;
# two `date` processes cost more than the rest of the timing), else to date's epoch milliseconds.
# Only differences are used (nvidia-smi's time).
now_ms() {
  first_line /proc/uptime
  now=${line%% *}
  case $now in
    *[0-9].[0-9][0-9])
      now=${now%.*}${now#*.}0
      while case $now in 0?*) true ;; *) false ;; esac; do now=${now#0}; done ;;  # not octal
    *)
      now=$(date +%s%3N 2>/dev/null)
      case $now in *N*|"") now=$(( $(date +%s) * 1000 )) ;; esac ;;
  esac
}

# listening_on PORT: set $listening to 1 when a LISTEN (0A) socket has local port PORT in
# /proc/net/tcp{,6}, 0 when not, "" when neither file is readable. Builtins only, but one printf.
listening_on() {
  hex=$(printf '%04X' "$1" 2>/dev/null)
  listening=
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    [ -z "$listening" ] && listening=0
    while read -r _ addr _ st _; do
      case $st:$addr in 0A:*:"$hex") listening=1; break ;; esac
    done <"$f"
    [ "$listening" = 1 ] && break
  done
}

# health PORT: serving, or still loading? systemd calls a unit running as soon as its process started;
# a large model then loads for minutes with its port closed or /health answering 503 (SGLang, the
# reference server). Is the port open, and one GET of /health on 127.0.0.1, never through a proxy (curl,
# else python3; "tool=" when neither is installed), bounded at 5 s (SGLang answers it with a one-token
# generation, about 1 s), or at GPU_TIMEOUT_S when that is shorter (a short --timeout).
health() {
  echo "@@ddtree-begin health"
  listening_on "$1"
  echo "port=$1 listening=$listening"
  if [ "$listening" != 0 ]; then
    url=http://127.0.0.1:$1/health
    bound=5
    case $gpu_timeout in [1-4]) bound=$gpu_timeout ;; esac
    if command -v curl >/dev/null 2>&1; then
      code=$(curl -s --noproxy '*' -o /dev/null -m "$bound" -w '%{http_code}' "$url" 2>/dev/null)
      echo "tool=curl code=${code:-000}"
    elif command -v python3 >/dev/null 2>&1; then
      code=$(python3 -c '
import sys, urllib.error as e, urllib.request as r
try:
    print(r.build_opener(r.ProxyHandler({})).open(sys.argv[1], timeout=float(sys.argv[2])).status)
except e.HTTPError as x:
    print(x.code)
except Exception:
    print("000")' "$url" "$bound" 2>/dev/null)
      echo "tool=python3 code=${code:-000}"
    else
      echo "tool="
    fi
  fi
  echo "@@ddtree-end health rc=0"
}

# first_line FILE: set $line to the first line of FILE (empty if unreadable); no fork at all.
first_line() {
  line=
  { IFS= read -r line; } 2>/dev/null <"$1"
}

# run_section NAME TOOL TIMED CMD...: run CMD (stderr folded in, so error text reaches the parser),
# then close the section with its exit status (and duration when TIMED=1); missing=1 when TOOL is
# not installed.
run_section() {
  name=$1
  tool=$2
  timed=$3
  shift 3
  echo "@@ddtree-begin $name"
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "@@ddtree-end $name rc=127 ms=0 missing=1"
    return
  fi
  [ "$timed" = 1 ] && { now_ms; t0=$now; }
  "$@" 2>&1
  rc=$?
  echo
  ms=
  [ "$timed" = 1 ] && { now_ms; ms=" ms=$(( now - t0 ))"; }
  echo "@@ddtree-end $name rc=$rc$ms"
}

# `timeout` bounds nvidia-smi, which can hang for tens of seconds with persistence mode off.
bounded() {
  if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$gpu_timeout" "$@"; else "$@"; fi
}

echo "@@ddtree-begin meta"
first_line /proc/sys/kernel/hostname; echo "hostname=$line"
first_line /etc/machine-id; echo "machine_id=$line"
first_line /proc/sys/kernel/random/boot_id; echo "boot_id=$line"
first_line /proc/uptime; echo "uptime=${line%% *}"
first_line /proc/sys/kernel/osrelease; echo "kernel=$line"
echo "user=${USER:-$(id -un 2>/dev/null)}"
first_line /proc/1/comm; echo "pid1=$line"
echo "@@ddtree-end meta rc=0"

# The host's public host keys (builtins only): a client that came in over a connection
# authenticated earlier (an OpenSSH master kept warm) checks the pinned key is still among them.
echo "@@ddtree-begin hostkeys"
for f in /etc/ssh/ssh_host_*_key.pub; do
  [ -f "$f" ] || continue
  first_line "$f"; [ -n "$line" ] && echo "$line"
done
echo "@@ddtree-end hostkeys rc=0"

# Whether the sshd we came in through still accepts new connections: stopping sshd closes its
# listener but keeps the connections it accepted, so a client on a master opened earlier still gets
# answers from a host nobody can log in to any more. $SSH_CONNECTION's 4th word is the local port
# of this session's connection; a LISTEN (0A) socket on that port in /proc/net/tcp{,6} means
# something (sshd, or systemd's ssh.socket) still accepts there. Builtins only; no section when not
# reached over SSH or /proc/net is unreadable.
if [ -n "${SSH_CONNECTION:-}" ] && [ -r /proc/net/tcp ]; then
  set -- $SSH_CONNECTION
  case ${4:-x} in *[!0-9]*) ;; *)
    listening_on "$4"
    echo "@@ddtree-begin sshlisten"
    echo "port=$4 listening=$listening"
    echo "@@ddtree-end sshlisten rc=0" ;;
  esac
fi

run_section gpus nvidia-smi 1 bounded nvidia-smi \
  --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,persistence_mode,compute_cap \
  --format=csv,noheader,nounits
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  # A hung driver would hang the second query too: do not spend the deadline twice.
  printf '@@ddtree-begin apps\nskipped: the GPU query timed out\n@@ddtree-end apps rc=124\n'
else
  run_section apps nvidia-smi 0 bounded nvidia-smi \
    --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits
fi

main_pid=0
if [ -n "$unit" ]; then
  props=LoadState,ActiveState,SubState,UnitFileState,Result,ExecMainStatus,NRestarts,ActiveEnterTimestamp,NeedDaemonReload,MainPID
  # --timestamp=unix (systemd >= 247) gives locale-free timestamps; older systemd rejects the flag.
  show() {
    systemctl show --timestamp=unix -p "$props" -- "$unit" 2>/dev/null \
      || systemctl show -p "$props" -- "$unit"
  }
  echo "@@ddtree-begin service"
  if command -v systemctl >/dev/null 2>&1; then
    out=$(show 2>&1)
    rc=$?
    printf '%s\n' "$out"
    echo "@@ddtree-end service rc=$rc"
    # MainPID for the running-release check below, read from the same output (no second call).
    case $out in *MainPID=*) main_pid=${out#*MainPID=}; main_pid=${main_pid%%[!0-9]*} ;; esac
    case $out in *ActiveState=active*) [ -n "$port" ] && health "$port" ;; esac
  else
    echo "@@ddtree-end service rc=127 missing=1"
  fi
  # The installed unit's content hash and its drop-ins: status compares them with what ddtreectl
  # renders, so a hand edit or an override shows up as drift without a second round trip.
  echo "@@ddtree-begin unitfile"
  f=/etc/systemd/system/$unit
  if [ -f "$f" ] && command -v sha256sum >/dev/null 2>&1; then
    printf 'sha256='; sha256sum < "$f"  # "HEX  -": the parser takes the first word
  fi
  for d in "/etc/systemd/system/$unit.d" "/run/systemd/system/$unit.d"; do
    for c in "$d"/*.conf; do [ -f "$c" ] && echo "dropin=$c"; done
  done
  echo "@@ddtree-end unitfile rc=0"
fi

# Units ddtreectl installed that the inventory no longer renders (a profile whose unit name changed,
# a host whose service was removed): listed in state/units.list by deploy, or, for units installed
# before that record existed, known by the header line every rendered unit starts with. Such a unit
# stays enabled and running (its port, its GPUs) until a deploy removes it: status and deploy say so.
# systemctl runs only for those units (normally none).
echo "@@ddtree-begin otherunits"
seen=" "
other_unit() {
  case $1 in "$unit"|""|*/*) return ;; esac
  case $seen in *" $1 "*) return ;; esac
  seen="$seen$1 "
  if [ -f "/etc/systemd/system/$1" ]; then file=1; else file=0; fi
  active=unknown
  enabled=unknown
  if command -v systemctl >/dev/null 2>&1; then
    active=$(systemctl is-active -- "$1" 2>/dev/null)
    enabled=$(systemctl is-enabled -- "$1" 2>/dev/null)
  fi
  echo "unit=$1 file=$file active=${active:-unknown} enabled=${enabled:-unknown}"
}
if [ -f "$root/state/units.list" ]; then
  while read -r recorded rest; do other_unit "$recorded"; done < "$root/state/units.list"
fi
for f in /etc/systemd/system/*.service; do
  [ -f "$f" ] || continue
  first_line "$f"
  case $line in "# Rendered by ddtreectl "*) other_unit "${f##*/}" ;; esac
done
echo "@@ddtree-end otherunits rc=0"

echo "@@ddtree-begin release"
echo "root=$root"
if [ -d "$root" ]; then echo "root_exists=1"; else echo "root_exists=0"; fi
if [ -L "$root/current" ]; then
  echo "current_link=$(readlink "$root/current")"
  # cd -P resolves the whole link chain in a subshell: no readlink -f (missing on some systems).
  target=$(cd -P "$root/current" 2>/dev/null && pwd)
  echo "current_path=$target"
  if [ -n "$target" ]; then echo "current_exists=1"; else echo "current_exists=0"; fi
  if [ -n "$target" ] && [ -f "$target/.build-stamp" ]; then echo "stamp=1"; else echo "stamp=0"; fi
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
echo "@@ddtree-end release rc=0"

if [ -d "$root/current/" ] && [ -f "$root/current/.build-stamp" ]; then
  echo "@@ddtree-begin stamp"
  head -c 4096 "$root/current/.build-stamp" 2>/dev/null
  echo
  echo "@@ddtree-end stamp rc=0"
fi

# Lock owner records (state/locks/NAME.lock/owner.json) and mode-lease files, passed through raw (first 64 KiB; the audit log
# grows without bound and is not a status fact).
if [ -d "$root/state" ]; then
  for f in "$root/state"/* "$root/state"/*/* "$root/state"/locks/*.lock/owner.json; do
    [ -f "$f" ] || continue
    case $f in *.log) continue ;; esac
    echo "@@ddtree-begin file ${f#"$root/"}"
    head -c 65536 "$f" 2>/dev/null
    echo
    echo "@@ddtree-end file rc=0"
  done
fi

# Free space where releases go; before the first deploy, on the nearest existing parent.
dir=$root
while [ ! -d "$dir" ] && [ -n "$dir" ]; do dir=${dir%/*}; done
run_section disk df 0 df -P -k "${dir:-/}"
