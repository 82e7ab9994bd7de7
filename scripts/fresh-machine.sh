#!/usr/bin/env bash
# Runs a command in a bare Debian bookworm root that holds only what a new machine has, on a fresh
# clone of this repository's committed HEAD: the check that the README's commands work for a
# newcomer, not only on a machine where something was installed by hand.
#
#   scripts/fresh-machine.sh 'scripts/demo.sh'
#   scripts/fresh-machine.sh 'CI=true bash .ci/run'
#
# What the root holds (and nothing else):
#   - Debian bookworm `--variant=minbase` from debootstrap, plus gcc, libc6-dev, git, python3,
#     python3-pip, ca-certificates, iproute2 and procps. Bootstrapped once into
#     $STICKY_FRESH_CACHE (default /var/cache/sticky-cni/fresh-root), outside the checkout, and
#     never written to: every run works on an overlay of it that is thrown away.
#   - The host's Rust toolchain (/root/.rustup, /root/.cargo) through throw-away overlays, with
#     what a new machine lacks removed inside the root: rustup targets other than the host's,
#     binaries `cargo install` put next to rustup's proxies, cargo's registry cache. Plus
#     /usr/local/bin/cargo-nextest.
#   - The host's CA certificates, apt sources and apt settings, DNS and hosts files, and
#     /lib/modules read-only: every machine of this kind is given them.
#   - The kernel's /proc (a new PID namespace), /sys and /dev; a fresh tmpfs on /run.
# The root is entered with pivot_root, not chroot, so the mount namespaces the tests make with
# `unshare -m`/`nsenter` see the root's files, not the host's. The host's network is shared (the
# package registries); the command runs as root, with no stdin, with the host's certificate and
# proxy variables, PATH, HOME, and CI when set. STICKY_FRESH_MACHINE=1 tells .ci/run it is
# inside (so it does not start another bare root).
#
# Every mount lives in a private mount namespace and dies with it; the per-run temp dir under
# /var/tmp is removed on exit, also on failure or Ctrl-C. Needs root and debootstrap (installed
# with apt-get when missing). Exit status: the command's; 2 when the script itself refuses.
#
# It cannot hurt its host:
#   - The inner stages (--in-namespace, --in-root) check where they are before they mount or
#     delete anything: PID 1 of a PID namespace that is not the host's, a mount namespace that
#     is not the host's, and (--in-root) a / that is the bootstrapped root, not the host's (the
#     marker /.sticky-fresh-root that stage 1 writes into the root names the host's namespaces
#     and /). Run by hand on a host, they refuse.
#   - SIGINT and SIGTERM are passed to the command (as SIGTERM), which is waited for; a second
#     signal kills it. The run's temp dir is removed only once the command's mount namespace is
#     gone (no process left in it), so never from under a live overlay.
#   - The mirror is read from the apt sources in either format: /etc/apt/sources.list and
#     sources.list.d/*.list one-line entries, sources.list.d/*.sources deb822 stanzas.
#   - Every failure says what failed: a refusal says why, any other failing command is named
#     with its line.
# The host paths it reads or overlays come from STICKY_FRESH_CARGO_HOME (/root/.cargo),
# STICKY_FRESH_RUSTUP_HOME (/root/.rustup), STICKY_FRESH_APT_DIR (/etc/apt), STICKY_FRESH_TMPDIR
# (/var/tmp) and STICKY_FRESH_CACHE, so tests/product/fresh_machine.rs runs it on a throw-away layout.
set -Eeuo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
base_packages=gcc,libc6-dev,git,python3,python3-pip,ca-certificates,iproute2,procps
suite=bookworm
# The host's paths this script reads or overlays, from the environment so a test can point them
# at a throw-away layout; the defaults are the real ones.
cargo_home=${STICKY_FRESH_CARGO_HOME:-/root/.cargo}
rustup_home=${STICKY_FRESH_RUSTUP_HOME:-/root/.rustup}
apt_dir=${STICKY_FRESH_APT_DIR:-/etc/apt}
tmp_dir=${STICKY_FRESH_TMPDIR:-/var/tmp}
# Written by stage 1 into the root (through the overlay's upper layer): the host's namespaces
# and /, which the inner stages must not be in.
marker=.sticky-fresh-root

die() {
    echo "fresh-machine.sh: $*" >&2
    exit 2
}

# No silent exit under `set -e`: a failing command is named.
trap 'echo "fresh-machine.sh: line $LINENO: \`$BASH_COMMAND\` failed (exit $?)" >&2' ERR

# The identity of a namespace of this process (`pid:[4026531836]`).
own_ns() {
    readlink "/proc/self/ns/$1"
}

# One field of a marker file.
marker_field() {
    sed -n "s/^$2=//p" "$1"
}

# Refuses (exit 2) unless this process is PID 1 of a PID namespace and in a mount namespace
# that are not the host's as `marker_file` names them, and, for stage 3, unless / is not the
# host's /. $1: the stage's flag, for the message.
check_not_host() {
    local stage=$1 marker_file=$2 why=
    if [[ ! -f $marker_file ]]; then
        why="no marker $marker_file (stage 1 writes it): not started by fresh-machine.sh"
    elif (($$ != 1)); then
        why="PID $$, not PID 1 of its own PID namespace: this is not the namespace fresh-machine.sh makes"
    elif [[ $(own_ns pid) == "$(marker_field "$marker_file" host_pid_ns)" ]]; then
        why="in the host's PID namespace $(own_ns pid)"
    elif [[ $(own_ns mnt) == "$(marker_field "$marker_file" host_mnt_ns)" ]]; then
        why="in the host's mount namespace $(own_ns mnt)"
    elif [[ $stage == --in-root && $(stat -Lc %d:%i /) == "$(marker_field "$marker_file" host_root)" ]]; then
        why="/ is the host's /"
    fi
    [[ -z $why ]] || die "$stage: refusing to run: $why. This stage mounts and deletes; it runs only inside the root scripts/fresh-machine.sh 'COMMAND' builds."
}

# --- stage 3: inside the root, after pivot_root -------------------------------------------------
if [[ ${1:-} == --in-root ]]; then
    shift
    check_not_host --in-root "/$marker"
    # What a new machine does not have, removed here where the rustup and cargo homes are the
    # throw-away overlays (before pivot_root these paths were the host's own).
    host_triple=$(rustc -vV | sed -n 's/^host: //p')
    for toolchain in $(rustup toolchain list | awk '{print $1}'); do
        for target in $(rustup +"$toolchain" target list --installed 2>/dev/null); do
            [[ $target == "$host_triple" ]] && continue
            rustup +"$toolchain" target remove "$target" >/dev/null 2>&1 ||
                echo "fresh-machine.sh: could not remove $target from $toolchain" >&2
        done
    done
    for f in "$cargo_home"/bin/*; do
        [[ $(basename "$f") == rustup || $(readlink "$f") == rustup ]] || rm -f "$f"
    done
    rm -rf "$cargo_home"/registry "$cargo_home"/git "$cargo_home"/.crates.toml "$cargo_home"/.crates2.json
    cd /work/sticky-cni
    echo "fresh-machine.sh: running '$*' in a bare $suite root ($(git log -1 --format='%h %s'))" >&2
    # The command runs as this PID 1's child: PID 1 ignores signals it has no handler for, so
    # this shell holds the handler and passes SIGTERM on (a background job ignores SIGINT).
    bash -c "$*" </dev/null &
    command_pid=$!
    trap 'kill -TERM "$command_pid" 2>/dev/null || true' TERM INT
    while kill -0 "$command_pid" 2>/dev/null; do
        wait "$command_pid" || true
    done
    status=0
    wait "$command_pid" || status=$?
    exit "$status"
fi

# --- stage 2: in a private mount and PID namespace: build the root and enter it ------------------
if [[ ${1:-} == --in-namespace ]]; then
    (($# >= 3)) || die "--in-namespace: usage: --in-namespace RUN_DIR COMMAND (stage 1 runs it)"
    run=$2
    shift 2
    check_not_host --in-namespace "$run/up/$marker"
    # Stage 1 waits for this namespace to be gone before it removes the run's files.
    own_ns mnt >"$run/mnt-ns"
    cache=$(cat "$run/cache")
    root=$run/root
    mount -t proc proc /proc # this PID namespace's own /proc, for the mounts below
    mkdir -p "$run"/{up,work,root}
    mount -t overlay overlay -o "lowerdir=$cache,upperdir=$run/up,workdir=$run/work" "$root"
    for d in "$rustup_home" "$cargo_home"; do
        [[ -d $d ]] || continue
        layer=$run/$(basename "$d")
        mkdir -p "$layer-up" "$layer-work" "$root$d"
        mount -t overlay overlay -o "lowerdir=$d,upperdir=$layer-up,workdir=$layer-work,redirect_dir=on" "$root$d"
    done
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$root/run"
    if [[ -d /lib/modules ]]; then
        mkdir -p "$root/lib/modules"
        mount --bind /lib/modules "$root/lib/modules"
        mount -o remount,bind,ro "$root/lib/modules"
    fi
    # What every machine of this kind is given, copied into the overlay's upper layer.
    install -m 0755 /usr/local/bin/cargo-nextest "$root/usr/local/bin/cargo-nextest"
    cp -a /etc/ssl/certs/. "$root/etc/ssl/certs/"
    if [[ -d /usr/local/share/ca-certificates ]]; then
        cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    rm -f "$root/etc/apt/sources.list"
    cp -a "$apt_dir"/sources.list.d/. "$root/etc/apt/sources.list.d/"
    if [[ -f $apt_dir/sources.list ]]; then
        cp -a "$apt_dir"/sources.list "$root/etc/apt/"
    fi
    cp -a "$apt_dir"/apt.conf.d/. "$root/etc/apt/apt.conf.d/"
    cp -a "$apt_dir"/trusted.gpg.d/. "$root/etc/apt/trusted.gpg.d/"
    if [[ -f /etc/pip.conf ]]; then
        cp /etc/pip.conf "$root/etc/"
    fi
    cp -L /etc/resolv.conf /etc/hosts /etc/hostname "$root/etc/" 2>/dev/null || true
    install -m 0755 "$self" "$root/.fresh-machine.sh"

    cd "$root"
    mkdir -p .oldroot
    pivot_root . .oldroot
    cd /
    umount -l /.oldroot
    rmdir /.oldroot
    exec /bin/bash /.fresh-machine.sh --in-root "$@"
fi

# --- stage 1: on the host ------------------------------------------------------------------------
(($# == 1)) || die "usage: scripts/fresh-machine.sh 'COMMAND'  (runs COMMAND in a bare root; see the script's header)"
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mounts, pivot_root)"
repo=$(git -C "$(dirname "$self")" rev-parse --show-toplevel) || die "$self is not in a git checkout"

# The URIs of the `deb` entries of one-line (classic) sources files: `deb [opts] URI suite ...`.
classic_uris() {
    awk '$1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if (i <= NF) print $i
    }' "$@"
}

# The first URI of each enabled deb822 stanza (`Types:` with `deb`, `URIs:`, `Enabled:`).
deb822_uris() {
    awk 'BEGIN { RS = "" }
    {
        types = ""; uris = ""; enabled = "yes"
        n = split($0, lines, "\n")
        for (j = 1; j <= n; j++) {
            line = lines[j]
            if (line ~ /^#/) continue
            key = tolower(line); sub(/:.*/, "", key)
            value = line; sub(/^[^:]*:[ \t]*/, "", value)
            if (key == "types") types = value
            else if (key == "uris") uris = value
            else if (key == "enabled") enabled = tolower(value)
        }
        if (enabled != "no" && (" " types " ") ~ /[ \t]deb[ \t]/) { split(uris, u, /[ \t]+/); print u[1] }
    }' "$@"
}

# The Debian mirror the host's apt uses (not its security archive), from either format, in
# the order apt reads the files; empty when there is none.
apt_mirror() {
    local f
    for f in "$apt_dir"/sources.list "$apt_dir"/sources.list.d/*.list; do
        if [[ -f $f ]]; then classic_uris "$f"; fi
    done
    for f in "$apt_dir"/sources.list.d/*.sources; do
        if [[ -f $f ]]; then deb822_uris "$f"; fi
    done
}

if ! command -v debootstrap >/dev/null; then
    echo "fresh-machine.sh: installing debootstrap (apt-get)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >&2 ||
        die "apt-get install debootstrap failed"
fi

# The bootstrapped root, made once per package list: a changed list gets a new one.
cache_top=${STICKY_FRESH_CACHE:-/var/cache/sticky-cni/fresh-root}
cache=$cache_top/$suite-$(printf '%s' "$base_packages" | sha256sum | cut -c1-12)
if [[ ! -x $cache/bin/bash ]]; then
    mirror=$(apt_mirror | grep -v -- -security | head -1 || true)
    if [[ -z $mirror ]]; then
        mirror=http://deb.debian.org/debian
        echo "fresh-machine.sh: no Debian mirror in $apt_dir/sources.list or $apt_dir/sources.list.d: using $mirror" >&2
    fi
    mkdir -p "$cache_top"
    tmp_root=$(mktemp -d "$cache_top/.bootstrap.XXXXXX")
    echo "fresh-machine.sh: bootstrapping $suite (minbase + $base_packages) from $mirror into $cache" >&2
    start=$SECONDS
    if ! debootstrap --variant=minbase --include="$base_packages" "$suite" "$tmp_root" "$mirror" >"$tmp_root.log" 2>&1; then
        tail -20 "$tmp_root.log" >&2
        rm -rf --one-file-system "$tmp_root" "$tmp_root.log"
        die "debootstrap failed (the lines above are its last)"
    fi
    rm -f "$tmp_root.log"
    rm -rf "$cache"
    mv "$tmp_root" "$cache"
    echo "fresh-machine.sh: bootstrapped in $((SECONDS - start)) s" >&2
fi

run=$(mktemp -d "$tmp_dir/sticky-fresh.XXXXXX")
unshare_pid=
signalled=

# SIGINT/SIGTERM: the command (the root's PID 1, unshare's child) is asked to stop; a second
# signal kills the namespace (unshare --kill-child takes its child with it).
forward() {
    [[ -n $unshare_pid ]] || exit 130
    if [[ -n $signalled ]]; then
        echo "fresh-machine.sh: $1 again: killing the command" >&2
        kill -KILL "$unshare_pid" 2>/dev/null || true
        return
    fi
    signalled=$1
    local init
    init=$(pgrep -P "$unshare_pid" || true)
    echo "fresh-machine.sh: $1: stopping the command and waiting for it" >&2
    if [[ -n $init ]]; then
        kill -TERM "$init" 2>/dev/null || true
    else
        kill -KILL "$unshare_pid" 2>/dev/null || true
    fi
}

# Waits for unshare (and so its namespace's PID 1) to be gone, however `wait` is interrupted.
wait_unshare() {
    status=0
    while kill -0 "$unshare_pid" 2>/dev/null; do
        wait "$unshare_pid" || true
    done
    wait "$unshare_pid" || status=$?
}

# The PIDs of processes still in the mount namespace `$1`.
in_mount_ns() {
    local ns=$1 p
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
    done
    return 0
}

cleanup() {
    local code=$? ns='' pids deadline
    trap - ERR
    if [[ -n $unshare_pid ]] && kill -0 "$unshare_pid" 2>/dev/null; then
        # Exiting on an error while the command runs: stop it first.
        forward EXIT
        wait_unshare
    fi
    # The run's overlays live in the namespace's mount namespace: it must be gone (no process
    # left in it; its last ones may still be exiting after a kill) before the files go.
    [[ -f $run/mnt-ns ]] && ns=$(cat "$run/mnt-ns")
    if [[ -n $ns ]]; then
        deadline=$((SECONDS + 60))
        while pids=$(in_mount_ns "$ns") && [[ -n $pids ]]; do
            if ((SECONDS >= deadline)); then
                echo "fresh-machine.sh: processes $(echo "$pids" | tr '\n' ' ')still in the run's mount namespace $ns: not removing $run" >&2
                exit "$code"
            fi
            sleep 0.2
        done
    fi
    if findmnt -rn -o TARGET | grep -q "^$run"; then
        echo "fresh-machine.sh: mounts left under $run: not removing it" >&2
        exit "$code"
    fi
    rm -rf --one-file-system "$run"
    exit "$code"
}
trap cleanup EXIT
trap 'forward INT' INT
trap 'forward TERM' TERM

printf '%s' "$cache" >"$run/cache"
mkdir -p "$run/clone"
git clone --quiet --no-hardlinks "$repo" "$run/clone/sticky-cni"
# The clone goes into the root's overlay in stage 2 through its upper layer, with the marker
# that tells the inner stages what the host is.
mkdir -p "$run/up/work"
mv "$run/clone/sticky-cni" "$run/up/work/sticky-cni"
{
    echo "host_pid_ns=$(own_ns pid)"
    echo "host_mnt_ns=$(own_ns mnt)"
    echo "host_root=$(stat -Lc %d:%i /)"
} >"$run/up/$marker"

# The host's environment as CI has it: certificate and proxy settings, PATH, HOME, CI.
envs=(PATH="$PATH" HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" STICKY_FRESH_MACHINE=1
    CARGO_HOME="$cargo_home" RUSTUP_HOME="$rustup_home"
    STICKY_FRESH_CARGO_HOME="$cargo_home" STICKY_FRESH_RUSTUP_HOME="$rustup_home" STICKY_FRESH_APT_DIR="$apt_dir")
while IFS='=' read -r name value; do
    case $name in
        CI | RUSTUP_* | *_CA_* | *CA_BUNDLE* | *CA_CERTS* | SSL_CERT_* | *_proxy | *_PROXY | PIP_CERT)
            envs+=("$name=$value")
            ;;
    esac
done < <(env)

env -i "${envs[@]}" unshare --mount --pid --fork --kill-child --propagation private \
    /bin/bash "$self" --in-namespace "$run" "$1" </dev/null &
unshare_pid=$!
wait_unshare
echo "fresh-machine.sh: '$1' exited $status" >&2
exit "$status"
