# shellcheck shell=sh
# sticky-cni %post ($1: 1 = install, 2 = upgrade).
# Make a running systemd see new or changed unit files and, on an upgrade,
# restart the agent and every sticky-wg@ instance that is running, so they run
# the new binaries. No unit is
# enabled or started: installing a package must not change a running node's
# networking (try-restart starts nothing that was stopped). rpm, like dpkg,
# writes each file under a temporary name and renames it into place, so
# /opt/cni/bin/sticky-* and /usr/sbin/sticky-* are never half-written.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload || :
    if [ "$1" -ge 2 ]; then
        systemctl try-restart sticky-vxlan-agent.service || :
        systemctl try-restart 'sticky-wg@*.service' || :
    fi
fi
