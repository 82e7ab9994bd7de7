# shellcheck shell=sh
# sticky-cni %preun ($1: 0 = erase, 1 = upgrade).
# On erase only, drop the operator's enablement of the reconcile unit so no
# dangling symlink is left; do not stop it (oneshot, no ExecStop). Lease data
# is never touched by any scriptlet of this package.
if [ "$1" -eq 0 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload disable sticky-vxlan-reconcile.service >/dev/null 2>&1 || :
    systemctl stop sticky-vxlan-agent.service >/dev/null 2>&1 || :
    systemctl --no-reload disable sticky-vxlan-agent.service >/dev/null 2>&1 || :
    # Every running sticky-wg@ instance too, before its binary goes (TUNs stay).
    systemctl stop 'sticky-wg@*.service' >/dev/null 2>&1 || :
fi
