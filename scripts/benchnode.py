"""The netns node that scripts/bench-vxlan.py and scripts/ab-vxlan.py measure on: one shared
piece so that the two benchmarks time plugins on the same node."""

import os
import shutil
import subprocess

CNI_DIR = "/usr/lib/cni"


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def cni_bin_dir(bindir, ipam, plugins=("host-local",)):
    """Fills `bindir` (the calls' CNI_PATH) with links to Debian's `plugins` and to `ipam` under
    its own name; returns the IPAM type to put in the config."""
    os.mkdir(bindir)
    for plugin in plugins:
        os.symlink(os.path.join(CNI_DIR, plugin), os.path.join(bindir, plugin))
    ipam_type = os.path.basename(ipam)
    if ipam_type not in plugins:
        os.symlink(os.path.abspath(ipam), os.path.join(bindir, ipam_type))
    return ipam_type


def cni_env(command, cid, netns, cni_path):
    """A CNI call's environment as kubelet's runtimes (containerd, CRI-O) set it, CNI_ARGS
    included: sticky-ipam finds a pod's lease by its name, and a call without one takes
    host-local's full scan (docs: runtimes that matter send it). `IgnoreUnknown=1` lets
    host-local accept the Kubernetes keys, as it does under kubelet."""
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": cni_path,
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=%s;"
                    "K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=uid-%s" % (cid, cid, cid),
    }


def make_node(node, namespaces, underlay="192.0.2.1/24"):
    """Network namespace `node` with its underlay: eth0 at `underlay` (TEST-NET-1 by default; an
    IPv6 one, e.g. 2001:db8::1/64, without duplicate address detection, so it is usable at once)
    on a veth whose peer stays in the node too, so nothing leaves it. Appended to `namespaces`
    (the caller removes them) as soon as it exists."""
    sh("ip", "netns", "add", node)
    namespaces.append(node)
    sh("ip", "-n", node, "link", "set", "lo", "up")
    sh("ip", "-n", node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
    nodad = ("nodad",) if ":" in underlay else ()
    sh("ip", "-n", node, "addr", "add", underlay, "dev", "eth0", *nodad)
    sh("ip", "-n", node, "link", "set", "eth0", "up")
    sh("ip", "-n", node, "link", "set", "eth0p", "up")


def clean_up(namespaces, tmp):
    """Removes the namespaces a run made (newest first) and its temp dir, whatever failed."""
    for ns in reversed(namespaces):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
    shutil.rmtree(tmp, ignore_errors=True)
