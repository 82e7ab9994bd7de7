#!/usr/bin/env bash
# Builds the sticky-cni .deb and .rpm and checks them on this machine.
#
#   sudo bash scripts/test-packages.sh        (CI runs it as root: bash scripts/test-packages.sh)
#
# .deb: built with cargo-deb, installed with `dpkg -i`, /opt/cni/bin/sticky-ipam must answer
#       CNI VERSION, /usr/sbin/sticky-vxlan-agent must run (and `sticky-vxlan agent`, its
#       deprecated alias), and /usr/sbin/sticky-wg (--help), then `dpkg --purge` must leave an existing lease data dir untouched.
# .rpm: built with cargo-generate-rpm, checked without installing (`rpm -qlp`, `rpm -qp
#       --scripts`): this is not an RPM system.
#
# Safe on a CI machine: it refuses to run if sticky-cni is already installed or its binaries are
# already in /opt/cni/bin or /usr/sbin, purges the package and removes the test data dir (and
# any of /var/lib/cni, /opt/cni it created) on every exit. Build tools it installs when missing
# (cargo-deb, cargo-generate-rpm with `cargo install --locked`; rpm with apt-get) are kept.
#
# Prints one line per check and, last, "N passed, M failed"; exits non-zero on any failure.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
repo=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
out_dir="$CARGO_TARGET_DIR/packages"
pkg=sticky-cni
test_net="sticky-pkg-test-$$"
data_root=/var/lib/cni
data_dir="$data_root/networks/$test_net"
record="$data_dir/10.244.1.5_default_web"
unit=/usr/lib/systemd/system/sticky-vxlan-reconcile.service
agent_unit=/usr/lib/systemd/system/sticky-vxlan-agent.service
# sticky-wg's unit is a template (sticky-wg@stickywg0.service runs `sticky-wg stickywg0`).
wg_unit=/usr/lib/systemd/system/sticky-wg@.service
# The plugins (/opt/cni/bin) and the daemons (/usr/sbin): the agent and the sites gateway's
# WireGuard data path. Every binary is built and checked alike.
plugins=(sticky-ipam sticky-vxlan)
agent=sticky-vxlan-agent
agent_path=/usr/sbin/$agent
wg=sticky-wg
wg_path=/usr/sbin/$wg
binaries=("${plugins[@]}" "$agent" "$wg")
# Where each binary is installed.
installed_path() { case $1 in "$agent" | "$wg") echo "/usr/sbin/$1" ;; *) echo "/opt/cni/bin/$1" ;; esac; }
# The highest systemd-analyze security exposure the units may have (docs/agent.md: 1.8 and 1.6).
max_exposure=2.5

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }
# check DESCRIPTION COMMAND...: one counted check.
check() {
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}
die() {
    fail "$1"
    finish
}
now() { date +%s; }
# quiet COMMAND...: run it, show its output only if it fails.
quiet() {
    local log
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then rm -f "$log"; else cat "$log"; rm -f "$log"; return 1; fi
}

[ "$(id -u)" -eq 0 ] || { echo "run as root: it installs and purges a .deb" >&2; exit 1; }
command -v dpkg >/dev/null || { echo "needs dpkg (a Debian-based CI machine)" >&2; exit 1; }

# --- never clobber a real installation -------------------------------------------------------
# dpkg-query prints e.g. "install ok installed", "deinstall ok config-files", "unknown ok not-installed".
pkg_state() { dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | awk '{print $3}'; }
if [ -n "$(pkg_state)" ] && [ "$(pkg_state)" != not-installed ]; then
    echo "$pkg is installed on this machine: refusing to test packages over it" >&2
    exit 1
fi
for b in "${binaries[@]}"; do
    f=$(installed_path "$b")
    if [ -e "$f" ]; then
        echo "$f exists (not from the $pkg package): refusing to overwrite it" >&2
        exit 1
    fi
done

# Remember what existed, to remove exactly what this run created.
created_dirs=()
for d in /var/lib/cni/networks /var/lib/cni /opt/cni/bin /opt/cni; do
    [ -e "$d" ] || created_dirs+=("$d")
done
net_d_before=$(ls -la /etc/cni/net.d 2>&1)

cleanup() {
    if [ -n "$(pkg_state)" ] && [ "$(pkg_state)" != not-installed ]; then
        dpkg --purge "$pkg" >/dev/null 2>&1 || echo "cleanup: dpkg --purge $pkg failed" >&2
    fi
    rm -rf "$data_dir"
    # Listed deepest first; rmdir only removes them if nothing else was put there meanwhile.
    for d in "${created_dirs[@]}"; do
        rmdir "$d" 2>/dev/null || true
    done
}
trap cleanup EXIT

mkdir -p "$CARGO_TARGET_DIR"

# --- tools --------------------------------------------------------------------------------------
for tool in cargo-deb cargo-generate-rpm; do
    if ! command -v "$tool" >/dev/null && [ ! -x "$HOME/.cargo/bin/$tool" ]; then
        t0=$(now)
        echo "installing $tool (cargo install --locked) ..."
        cargo install --locked "$tool" >"$CARGO_TARGET_DIR/install-$tool.log" 2>&1 ||
            { tail -20 "$CARGO_TARGET_DIR/install-$tool.log"; die "cargo install $tool"; }
        echo "installed $tool in $(($(now) - t0)) s"
    fi
done
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v rpm >/dev/null; then
    echo "installing rpm (apt-get) ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q rpm >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rpm >/dev/null; } ||
        die "apt-get install rpm"
fi

# --- build --------------------------------------------------------------------------------------
# Release profile, default features only: the test-only `crash-points` must never ship.
# Every package of the workspace: none may turn crash points on by default.
default_features=$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json,sys; m=json.load(sys.stdin); print(" ".join(f for p in m["packages"] for f in p["features"].get("default", [])))')
check "crash-points is not a default feature (default: '${default_features}')" \
    test "${default_features/crash-points/}" = "$default_features"

t0=$(now)
scripts/build-release.sh || die "scripts/build-release.sh"
echo "release build: $(($(now) - t0)) s"
musl_target=$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-musl
for b in "${binaries[@]}"; do
    check "$b is statically linked, not PIE (runs on any x86_64 Linux, no start-up relocation)" \
        bash -c "file -b '$CARGO_TARGET_DIR/release/$b' | grep -q 'LSB executable.*statically linked'"
    # build-release.sh falls back to glibc only when the musl target cannot be had.
    if [[ -d $musl_target ]]; then
        check "$b is built against musl (no glibc start-up: 0.5 ms less per call)" \
            bash -c "! grep -aq GLIBC_TUNABLES '$CARGO_TARGET_DIR/release/$b'"
    else
        echo "note: no x86_64-unknown-linux-musl target here: the binaries are glibc builds"
    fi
    # crash.rs reads STICKY_CRASH_AT only when the feature is on.
    check "$b built without crash points" \
        bash -c "! grep -q STICKY_CRASH_AT '$CARGO_TARGET_DIR/release/$b'"
done

rm -rf "$out_dir" && mkdir -p "$out_dir"
t0=$(now)
cargo deb -p sticky-cni --no-build --output "$out_dir/" >"$out_dir/cargo-deb.log" 2>&1 ||
    { cat "$out_dir/cargo-deb.log"; die "cargo deb"; }
cargo generate-rpm --output "$out_dir/" >"$out_dir/cargo-generate-rpm.log" 2>&1 ||
    { cat "$out_dir/cargo-generate-rpm.log"; die "cargo generate-rpm"; }
echo "packaging (cargo deb + cargo generate-rpm): $(($(now) - t0)) s"
deb=$(ls "$out_dir"/*.deb 2>/dev/null | head -1)
rpm_file=$(ls "$out_dir"/*.rpm 2>/dev/null | head -1)
check ".deb built ($deb)" test -f "$deb"
check ".rpm built ($rpm_file)" test -f "$rpm_file"
[ -f "$deb" ] && [ -f "$rpm_file" ] || finish

# Scripts must neither remove lease data nor enable/start a unit (comments stripped first); the
# restarts allowed are `try-restart sticky-vxlan-agent.service` and `try-restart
# 'sticky-wg@*.service'` (on upgrade: they start nothing that was not running).
scripts_are_safe() { # FILE...
    local code
    code=$(sed -e 's/#.*//' "$@")
    ! grep -q '/var/lib/cni' <<<"$code" &&
        ! grep -Eq 'systemctl[^;|&]*[[:space:]](enable|start|restart|reload-or-restart|try-reload-or-restart)[[:space:]]' <<<"$code" &&
        ! grep -Eq 'try-restart' <<<"$(grep -Ev "systemctl try-restart (sticky-vxlan-agent\.service|'sticky-wg@\*\.service')" <<<"$code")" &&
        ! grep -Eq 'deb-systemd-(helper|invoke)[^;|&]*[[:space:]](enable|start)' <<<"$code"
}
# The upgrade path restarts a running agent: FILE... hold the try-restart.
restarts_agent_on_upgrade() { # FILE...
    sed -e 's/#.*//' "$@" | grep -q 'systemctl try-restart sticky-vxlan-agent\.service'
}

# --- .deb: contents -------------------------------------------------------------------------
deb_list=$(dpkg-deb -c "$deb")
for b in "${binaries[@]}"; do
    f=.$(installed_path "$b")
    check "deb ships $f mode 755" grep -Eq "^-rwxr-xr-x .* ${f}\$" <<<"$deb_list"
done
for d in "$agent" "$wg"; do
    check "deb ships no $d in /opt/cni/bin (it is not a plugin)" \
        bash -c "! grep -q ' ./opt/cni/bin/$d\$' <<<\"\$1\"" _ "$deb_list"
done
for f in README.md install.md ipam.md sites.md sticky-cni.default conf-examples/10-sticky-vxlan.conflist; do
    check "deb ships /usr/share/doc/$pkg/$f" grep -q " ./usr/share/doc/$pkg/$f\$" <<<"$deb_list"
done
for u in "$unit" "$agent_unit" "$wg_unit"; do
    check "deb ships the unit in $u" grep -q " .${u}\$" <<<"$deb_list"
done
check "deb writes nothing under /etc" bash -c "! grep -q ' ./etc/' <<<\"\$1\"" _ "$deb_list"
check "deb ships nothing under /var/lib/cni" bash -c "! grep -q ' ./var/lib/cni' <<<\"\$1\"" _ "$deb_list"
ctrl=$(mktemp -d)
dpkg-deb -e "$deb" "$ctrl/DEBIAN"
check "deb maintainer scripts present (postinst prerm postrm)" \
    test -x "$ctrl/DEBIAN/postinst" -a -x "$ctrl/DEBIAN/prerm" -a -x "$ctrl/DEBIAN/postrm"
check "deb maintainer scripts never touch /var/lib/cni nor enable/start a unit" \
    scripts_are_safe "$ctrl"/DEBIAN/postinst "$ctrl"/DEBIAN/prerm "$ctrl"/DEBIAN/postrm
check "deb postinst try-restarts a running agent on upgrade" \
    restarts_agent_on_upgrade "$ctrl/DEBIAN/postinst"
check "deb has no conffiles (nothing in /etc)" test ! -s "$ctrl/DEBIAN/conffiles"
rm -rf "$ctrl"

# --- .deb: install, answer VERSION, purge keeps the data dir ------------------------------------
check "dpkg -i installs the .deb" quiet dpkg -i "$deb"
for b in "${binaries[@]}"; do
    f=$(installed_path "$b")
    check "$f installed, mode 755" \
        bash -c "[ -f $f ] && [ \"\$(stat -c %a $f)\" = 755 ]"
done
agent_help=$("$agent_path" --help 2>&1)
check "$agent_path --help runs" grep -q -- '--metrics-addr' <<<"$agent_help"
wg_help=$("$wg_path" --help 2>&1)
check "$wg_path --help runs" grep -q -- '--socket-dir' <<<"$wg_help"
# The deprecated alias finds the agent on $PATH (not beside /opt/cni/bin/sticky-vxlan) and says so.
alias_out=$(env PATH=/usr/sbin:/usr/bin:/sbin:/bin /opt/cni/bin/sticky-vxlan agent --help 2>&1)
check "sticky-vxlan agent --help (deprecated) runs $agent_path and says it is deprecated" \
    bash -c 'grep -q -- --metrics-addr <<<"$1" && grep -q deprecated <<<"$1"' _ "$alias_out"
version_reply=$(echo '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION /opt/cni/bin/sticky-ipam 2>/dev/null)
# VERSION reply per the CNI spec: {"cniVersion": ..., "supportedVersions": [...]}.
version_reply_ok() {
    python3 -c 'import json, sys; assert "1.0.0" in json.loads(sys.argv[1])["supportedVersions"]' \
        "$version_reply" 2>/dev/null
}
check "sticky-ipam answers VERSION with supportedVersions incl. 1.0.0 (got: ${version_reply:-nothing})" \
    version_reply_ok
# The installed binaries do the main job: two netns nodes, pods over VXLAN, a recreated pod
# keeps its IP, a recreated VTEP its MAC (the README's demo, on what the package installed).
check "the demo runs on the installed binaries (/opt/cni/bin)" \
    quiet env STICKY_BIN_DIR=/opt/cni/bin scripts/demo.sh --no-build
# The template is checked as the instance the docs name (systemd verifies instances, not templates).
wg_instance_dir=$(mktemp -d)
cp "$wg_unit" "$wg_instance_dir/sticky-wg@stickywg0.service" 2>/dev/null
for u in "$unit" "$agent_unit" "$wg_instance_dir/sticky-wg@stickywg0.service"; do
    check "unit installed at $u" test -f "$u"
    if command -v systemd-analyze >/dev/null; then
        check "systemd-analyze verify accepts $u" quiet systemd-analyze verify "$u"
        # The sandbox (docs/agent.md): an exposure above max_exposure means a setting was lost.
        exposure=$(systemd-analyze security --offline=yes "$u" 2>/dev/null |
            sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
        check "$(basename "$u") is sandboxed: systemd-analyze security exposure ${exposure:-?} <= $max_exposure" \
            awk -v e="${exposure:-99}" -v m="$max_exposure" 'BEGIN { exit !(e <= m) }'
    else
        echo "note: no systemd-analyze here, unit syntax not verified"
    fi
done
rm -rf "$wg_instance_dir"
for u in "$unit" "$agent_unit" /usr/lib/systemd/system/sticky-wg@stickywg0.service; do
    check "$(basename "$u") not enabled by the install" \
        bash -c "! ls /etc/systemd/system/*/$(basename "$u") >/dev/null 2>&1"
done
check "/etc/cni/net.d unchanged by the install" \
    test "$(ls -la /etc/cni/net.d 2>&1)" = "$net_d_before"

# Leases as sticky-ipam would leave them.
mkdir -p "$data_dir"
printf 'sticky-cni package test record\n' >"$record"
: >"$data_dir/lock"
record_sum=$(sha256sum "$record")
check "dpkg -i over the installed version (reinstall/upgrade path)" quiet dpkg -i "$deb"
check "dpkg --purge $pkg" quiet dpkg --purge "$pkg"
check "package gone after purge (state: $(pkg_state))" \
    bash -c '[ -z "$1" ] || [ "$1" = not-installed ]' _ "$(pkg_state)"
check "binaries gone after purge" \
    test ! -e /opt/cni/bin/sticky-ipam -a ! -e /opt/cni/bin/sticky-vxlan -a ! -e "$agent_path" -a ! -e "$wg_path"
check "data dir $data_dir survives purge" test -d "$data_dir" -a -f "$data_dir/lock"
check "lease record survives purge unchanged" \
    bash -c "[ \"\$(sha256sum '$record' 2>/dev/null)\" = '$record_sum' ]"

# --- .rpm: file list and scriptlets ---------------------------------------------------------
rpm_list=$(rpm -qlp "$rpm_file" 2>/dev/null)
for f in /opt/cni/bin/sticky-ipam /opt/cni/bin/sticky-vxlan "$agent_path" "$wg_path" "$unit" \
    "$agent_unit" "$wg_unit" "/usr/share/doc/$pkg/README.md" "/usr/share/doc/$pkg/sites.md" "/usr/share/doc/$pkg/install.md" "/usr/share/doc/$pkg/ipam.md" \
    "/usr/share/doc/$pkg/conf-examples/10-sticky-vxlan.conflist"; do
    check "rpm lists $f" grep -qx "$f" <<<"$rpm_list"
done
rpm_modes=$(rpm -qp --queryformat '[%{FILEMODES:perms} %{FILENAMES}\n]' "$rpm_file" 2>/dev/null)
for b in "${binaries[@]}"; do
    f=$(installed_path "$b")
    check "rpm installs $f mode 755" grep -qx -- "-rwxr-xr-x $f" <<<"$rpm_modes"
done
check "rpm writes nothing under /etc nor /var/lib/cni" \
    bash -c "! grep -Eq '^/(etc|var/lib/cni)(/|\$)' <<<\"\$1\"" _ "$rpm_list"
rpm_scripts=$(rpm -qp --scripts "$rpm_file" 2>/dev/null)
check "rpm has postinstall, preuninstall and postuninstall scriptlets" \
    bash -c 'grep -q "^postinstall scriptlet" <<<"$1" && grep -q "^preuninstall scriptlet" <<<"$1" && grep -q "^postuninstall scriptlet" <<<"$1"' _ "$rpm_scripts"
scripts_file=$(mktemp)
printf '%s\n' "$rpm_scripts" >"$scripts_file"
check "rpm scriptlets never touch /var/lib/cni nor enable/start a unit" scripts_are_safe "$scripts_file"
check "rpm %post try-restarts a running agent on upgrade" restarts_agent_on_upgrade "$scripts_file"
rm -f "$scripts_file"

finish
