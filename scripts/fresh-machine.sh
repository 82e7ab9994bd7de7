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
# with apt-get when missing). Exit status: the command's.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
base_packages=gcc,libc6-dev,git,python3,python3-pip,ca-certificates,iproute2,procps
suite=bookworm
# The host's paths this script reads or overlays, from the environment so a test can point them
# at a throw-away layout; the defaults are the real ones.
cargo_home=${STICKY_FRESH_CARGO_HOME:-/root/.cargo}
rustup_home=${STICKY_FRESH_RUSTUP_HOME:-/root/.rustup}
apt_dir=${STICKY_FRESH_APT_DIR:-/etc/apt}
tmp_dir=${STICKY_FRESH_TMPDIR:-/var/tmp}

die() {
    echo "fresh-machine.sh: $*" >&2
    exit 2
}

# --- stage 3: inside the root, after pivot_root -------------------------------------------------
if [[ ${1:-} == --in-root ]]; then
    shift
    # What a new machine does not have, removed here where /root/.rustup and /root/.cargo are the
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
    exec bash -c "$*" </dev/null
fi

# --- stage 2: in a private mount and PID namespace: build the root and enter it ------------------
if [[ ${1:-} == --in-namespace ]]; then
    run=$2
    shift 2
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
    [[ -f $apt_dir/sources.list ]] && cp -a "$apt_dir"/sources.list "$root/etc/apt/"
    cp -a "$apt_dir"/apt.conf.d/. "$root/etc/apt/apt.conf.d/"
    cp -a "$apt_dir"/trusted.gpg.d/. "$root/etc/apt/trusted.gpg.d/"
    [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/"
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
repo=$(git -C "$(dirname "$self")" rev-parse --show-toplevel)

if ! command -v debootstrap >/dev/null; then
    echo "fresh-machine.sh: installing debootstrap (apt-get)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >&2 ||
        die "apt-get install debootstrap failed"
fi

# The bootstrapped root, made once per package list: a changed list gets a new one.
cache_top=${STICKY_FRESH_CACHE:-/var/cache/sticky-cni/fresh-root}
cache=$cache_top/$suite-$(printf '%s' "$base_packages" | sha256sum | cut -c1-12)
if [[ ! -x $cache/bin/bash ]]; then
    mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' "$apt_dir"/sources.list.d/debian.sources 2>/dev/null | grep -v -- -security | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    mkdir -p "$cache_top"
    tmp_root=$(mktemp -d "$cache_top/.bootstrap.XXXXXX")
    echo "fresh-machine.sh: bootstrapping $suite (minbase + $base_packages) from $mirror into $cache" >&2
    start=$SECONDS
    if ! debootstrap --variant=minbase --include="$base_packages" "$suite" "$tmp_root" "$mirror" >"$tmp_root.log" 2>&1; then
        tail -20 "$tmp_root.log" >&2
        rm -rf --one-file-system "$tmp_root" "$tmp_root.log"
        die "debootstrap failed"
    fi
    rm -f "$tmp_root.log"
    rm -rf "$cache"
    mv "$tmp_root" "$cache"
    echo "fresh-machine.sh: bootstrapped in $((SECONDS - start)) s" >&2
fi

run=$(mktemp -d "$tmp_dir/sticky-fresh.XXXXXX")
cleanup() {
    # The namespace's mounts died with it; if any is still visible here, do not delete through it.
    if findmnt -rn -o TARGET | grep -q "^$run"; then
        echo "fresh-machine.sh: mounts left under $run: not removing it" >&2
        return
    fi
    rm -rf --one-file-system "$run"
}
trap cleanup EXIT
printf '%s' "$cache" >"$run/cache"
mkdir -p "$run/clone"
git clone --quiet --no-hardlinks "$repo" "$run/clone/sticky-cni"
# The clone goes into the root's overlay in stage 2 through its upper layer.
mkdir -p "$run/up/work"
mv "$run/clone/sticky-cni" "$run/up/work/sticky-cni"

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

status=0
env -i "${envs[@]}" unshare --mount --pid --fork --propagation private \
    /bin/bash "$self" --in-namespace "$run" "$1" </dev/null || status=$?
echo "fresh-machine.sh: '$1' exited $status" >&2
exit "$status"
