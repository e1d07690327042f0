#!/bin/sh
# PID 1 of one test host's namespaces (started by fleet.py through
#   setpriv --pdeathsig KILL -- unshare --net --mount --pid --fork --kill-child=SIGKILL --cgroup --uts --ipc --propagation private)
# Usage: host-init.sh HOSTDIR NAME CGROUP_DIR [boot|check]
#   CGROUP_DIR: the host's pre-created child cgroup (/sys/fs/cgroup[/unified]/ddtreectl-testbed/slot0/h1)
#   check:      run only the safety checks and exit 0 (the tests of those checks; never boots)
# Exits 111 when a safety check fails, before anything is mounted or started.
set -eu
hostdir=$1 name=$2 cgroup_dir=$3 mode=${4:-boot}

die() { echo "host-init[$name]: REFUSING TO BOOT: $*" >&2; exit 111; }

# --- SAFETY: systemd started outside a child cgroup + cgroup namespace would move every process of
# --- the machine's root cgroup into its own scope. Check all of it before touching anything.
# (/proc/1/ns/* of the machine's init is unreadable on this VM, so no namespace-inode comparisons.)
[ "$$" = 1 ] || die "not PID 1 of a new PID namespace (pid $$)"
[ "$(stat -f -c %T "$cgroup_dir" 2>/dev/null)" = cgroup2fs ] || die "$cgroup_dir is not a cgroup2 directory"
[ "$(stat -f -c %T "$(dirname "$cgroup_dir")" 2>/dev/null)" = cgroup2fs ] \
  || die "$cgroup_dir is the cgroup2 root, not a child cgroup"
# cgroup.procs lists members as our PID namespace numbers them: "1" is this script.
grep -qx 1 "$cgroup_dir/cgroup.procs" || die "PID 1 is not a member of $cgroup_dir"
# Inside a cgroup namespace made in that cgroup, /proc/self/cgroup shows its root "/"; without a
# namespace of our own it would show the full path.
own_view=$(sed -n 's/^0:://p' /proc/self/cgroup)
[ "$own_view" = / ] || die "not in a cgroup namespace rooted at $cgroup_dir (/proc/self/cgroup says '$own_view')"
if [ "$mode" = check ]; then
  echo "host-init[$name]: safety checks passed ($cgroup_dir)"
  exit 0
fi

# --- wait until the runner has wired eth0 into our network namespace
read -r go < "$hostdir/go"
[ "$go" = go ] || die "runner aborted the boot ('$go')"

root=$hostdir/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$hostdir/upper,workdir=$hostdir/work" "$root"
mount -t proc proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,size=4m tmpfs "$root/dev"
for dev in null zero full random urandom tty; do
  : > "$root/dev/$dev"
  mount --bind "/dev/$dev" "$root/dev/$dev"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
# systemd writes status to /dev/console: make that the host's log file, not the VM's console.
: > "$root/dev/console"
mount --bind "$hostdir/console.log" "$root/dev/console"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
hostname "$name"

cd "$root"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
export container=ddtreectl-testbed
exec /lib/systemd/systemd
