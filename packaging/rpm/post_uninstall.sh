# shellcheck shell=sh
# sticky-cni %postun ($1: 0 = erase, 1 = upgrade).
# Tell a running systemd the unit file changed or is gone. Lease data is kept:
# leases must survive erase, upgrade and reinstall (see install.md).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload || :
fi
