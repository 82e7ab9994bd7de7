# shellcheck shell=sh
# sticky-cni %post ($1: 1 = install, 2 = upgrade).
# Make a running systemd see the new or changed unit file. The unit is neither
# enabled nor started: installing a package must not change a running node's
# networking. rpm, like dpkg, writes each file under a temporary name and
# renames it into place, so /opt/cni/bin/sticky-* is never half-written.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload || :
fi
