#!/usr/bin/env bash
# sticky-cni in one minute: builds both plugins and shows their job end to end.
#
# With root: two "nodes" (network namespaces node-1-demo<pid>, node-2-demo<pid>) joined by an
# underlay on 192.0.2.0/24 that lives in a namespace of its own (underlay-demo<pid>); the
# plugins run inside the node namespaces exactly as a runtime runs them (CNI_* environment,
# network config on stdin, CNI_ARGS as kubelet sends them). Shown: pods get addresses and
# reach each other across nodes; a pod deleted and recreated gets its old IP back; a node's
# VTEP deleted (as a reboot would) comes back with the same MAC after one command on that node,
# and traffic recovers with nothing done on the other node.
# Without root (or with --ipam-only): the sticky-ipam part in a temp dir.
#
# The host's own interfaces, routes and firewall are never touched: every address lives in a
# namespace this script creates, and every namespace and the temp dir are removed on exit,
# also on error or Ctrl-C.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/demo.sh [--no-build] [--ipam-only] [-h|--help]

Builds sticky-cni (scripts/build-release.sh) and shows what it does:
  as root     two network-namespace "nodes" joined by a VXLAN overlay: pods get addresses,
              ping across nodes, a pod recreated keeps its IP, a node's VTEP deleted as a
              reboot would comes back with the same MAC and traffic recovers;
  not root    the sticky-ipam part in a temp dir (a recreated pod keeps its IP; a pod without
              a name behaves exactly like host-local), and says what it skipped.

Options:
  --no-build    do not build; use the binaries in $STICKY_BIN_DIR (default target/release)
  --ipam-only   run only the sticky-ipam part, even as root
  -h, --help    this help

Environment:
  STICKY_BIN_DIR  directory holding sticky-ipam and sticky-vxlan (default target/release;
                  the test suite points it at the binaries cargo test built)

Everything happens in namespaces and a temp dir the script creates and removes on exit
(also on error or Ctrl-C); the host's interfaces are never touched.
EOF
}

build=1
ipam_only=0
while (($#)); do
  case $1 in
    --no-build) build=0 ;;
    --ipam-only) ipam_only=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "demo.sh: unknown option '$1'" >&2
      usage >&2
      exit 2
      ;;
  esac
  shift
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# ---------------------------------------------------------------------------------------------
# Output helpers

if [[ -t 1 ]]; then
  B=$'\e[1m' D=$'\e[2m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'
else
  B='' D='' G='' R='' N=''
fi
step_no=0
step() {
  step_no=$((step_no + 1))
  printf '\n%s[%d] %s%s\n' "$B" "$step_no" "$*" "$N"
}
say() { printf '    %s\n' "$@"; }
# A command as the reader would type it, prefixed with where it runs.
cmd() { printf '    %s%s$ %s%s\n' "$D" "$1" "$2" "$N"; }
# A continuation line of the command above.
cont() { printf '    %s%*s  %s%s\n' "$D" "${#1}" '' "$2" "$N"; }
good() { printf '    %s✔ %s%s\n' "$G" "$*" "$N"; }
bad() { printf '    %s✘ %s%s\n' "$R" "$*" "$N"; }
die() {
  printf '\n%sdemo.sh: %s%s\n' "$R" "$*" "$N" >&2
  exit 1
}
indent() { sed 's/^/      /'; }

# Seconds since $1 (from date +%s%N), one decimal.
since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}'; }

# ---------------------------------------------------------------------------------------------
# Cleanup: every namespace named *-demo<pid> and the temp dir, whatever happened.

tag="demo$$"
tmp=''
cleanup() {
  local rc=$? ns gone=()
  set +e
  trap - EXIT INT TERM
  while read -r ns _; do
    [[ $ns == *-"$tag" ]] || continue
    ip netns del "$ns" 2>/dev/null && gone+=("$ns")
  done < <(ip netns list 2>/dev/null | tac)
  [[ -n $tmp && -d $tmp ]] && rm -rf -- "$tmp"
  if ((${#gone[@]})); then
    printf '\ncleaned up: namespaces %s and the temp dir\n' "${gone[*]}"
  elif [[ -n $tmp ]]; then
    printf '\ncleaned up: the temp dir\n'
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Build

bin=${STICKY_BIN_DIR:-target/release}
if ((build)); then
  build_ns=$(date +%s%N)
  printf '%sBuilding sticky-cni (scripts/build-release.sh; the first build takes a few minutes)…%s\n' "$B" "$N"
  cargo_cmd=(scripts/build-release.sh --quiet)
  if [[ $EUID -eq 0 && -n ${SUDO_USER:-} && $SUDO_USER != root ]] && command -v sudo >/dev/null &&
    { [[ ! -e target ]] || [[ $(stat -c %U target) == "$SUDO_USER" ]]; }; then
    # Under sudo, build as the user who ran it, with their toolchain, so target/ stays theirs.
    user_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    sudo -H -u "$SUDO_USER" env PATH="$user_home/.cargo/bin:$PATH" "${cargo_cmd[@]}"
  else
    command -v cargo >/dev/null || PATH="${HOME:-/root}/.cargo/bin:$PATH"
    command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs) or use --no-build"
    "${cargo_cmd[@]}"
  fi
  printf 'built in %s s\n' "$(since "$build_ns")"
fi
start_ns=$(date +%s%N)
bin=$(cd "$bin" 2>/dev/null && pwd) || die "no binary dir '${STICKY_BIN_DIR:-target/release}': build first (run without --no-build)"
for b in sticky-ipam sticky-vxlan; do
  [[ -x $bin/$b ]] || die "$bin/$b is missing: build first (run without --no-build)"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sticky-demo.XXXXXX")
chmod 755 "$tmp"

# Random ids shaped like the runtime's: a 64-hex container id, a pod UID.
new_id() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
new_uid() { cat /proc/sys/kernel/random/uuid; }
# CNI_ARGS exactly as kubelet (containerd) sends them.
kube_args() { # namespace name container-id uid
  printf 'IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s' "$@"
}
# The first IPv4 address (with prefix) of a CNI result.
result_ip() { grep -oE '"address" *: *"[0-9.]+/[0-9]+"' <<<"$1" | head -n1 | grep -oE '[0-9.]+/[0-9]+' || true; }

# Runs a plugin as a runtime does: clean environment, CNI_* variables, config on stdin, one
# JSON object on stdout. $1 is the namespace to run in ("" = here).
# cni <where> <plugin> <command> <container id> <netns path> <CNI_ARGS> <stdin file>
cni() {
  local where=$1 plugin=$2 command=$3 id=$4 netns=$5 args=$6 conf=$7
  local -a in_ns=()
  [[ -n $where ]] && in_ns=(ip netns exec "$where")
  "${in_ns[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    CNI_COMMAND="$command" CNI_CONTAINERID="$id" CNI_NETNS="$netns" CNI_IFNAME=eth0 \
    CNI_PATH="$tmp/cni-bin" CNI_ARGS="$args" "$tmp/cni-bin/$plugin" <"$conf"
}
mkdir "$tmp/cni-bin"
ln -s "$bin/sticky-ipam" "$tmp/cni-bin/sticky-ipam"
ln -s "$bin/sticky-vxlan" "$tmp/cni-bin/sticky-vxlan"

summary=()
# tests/product/demo.rs reads this script's output: the "<pod> (...) got <ip>" lines, the
# "node-2 VTEP sticky.1 MAC..." lines, the "reply from"/"no reply" lines and the one
# "skipped:" line. Keep their wording, or change the test with them.

# =============================================================================================
# Without root: sticky-ipam alone, in a temp dir.

ipam_demo() {
  local why=$1
  printf '\n%ssticky-ipam: a recreated pod gets its old IP back, decided on the node alone%s\n' "$B" "$N"
  say "Files only, in $tmp; no network is touched."

  step "A host-local config with one word changed"
  cat >"$tmp/stdin.json" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "demo",
  "type": "bridge",
  "ipam": {
    "type": "sticky-ipam",
    "dataDir": "$tmp/cni-networks",
    "ranges": [[{ "subnet": "10.244.1.0/24" }]]
  }
}
EOF
  indent <"$tmp/stdin.json"
  say "This is what the runtime sends the IPAM plugin on stdin (from a bridge conflist)."

  local id1 id2 uid1 uid2 out ip1 ip2 nsp=/run/netns/not-needed-for-ipam
  id1=$(new_id) uid1=$(new_uid)
  step "kubelet starts pod default/web-0: ADD"
  cmd "" "CNI_COMMAND=ADD CNI_CONTAINERID=${id1:0:12}… CNI_IFNAME=eth0 CNI_ARGS='$(kube_args default web-0 "${id1:0:12}…" "${uid1:0:8}…")' sticky-ipam < config"
  out=$(cni "" sticky-ipam ADD "$id1" "$nsp" "$(kube_args default web-0 "$id1" "$uid1")" "$tmp/stdin.json") ||
    die "ADD failed: $out"
  ip1=$(result_ip "$out")
  say "result: $out"
  say "web-0 got $ip1"

  step "The pod is deleted (node reboot, eviction, rollout): DEL"
  out=$(cni "" sticky-ipam DEL "$id1" "$nsp" "$(kube_args default web-0 "$id1" "$uid1")" "$tmp/stdin.json") ||
    die "DEL failed: $out"
  say "The address is kept for default/web-0 as a released lease:"
  cmd "" "sticky-ipam --data-dir $tmp/cni-networks list"
  "$bin/sticky-ipam" --data-dir "$tmp/cni-networks" list | indent

  id2=$(new_id) uid2=$(new_uid)
  step "web-0 is recreated: a new sandbox, new container id, new pod UID, same namespace/name"
  out=$(cni "" sticky-ipam ADD "$id2" "$nsp" "$(kube_args default web-0 "$id2" "$uid2")" "$tmp/stdin.json") ||
    die "ADD failed: $out"
  ip2=$(result_ip "$out")
  say "web-0 (recreated) got $ip2"
  if [[ $ip1 == "$ip2" ]]; then
    good "same IP: $ip1 → $ip2 (host-local would have given the next free address)"
    summary+=("✔ web-0 recreated (new container id, new UID) kept its IP: $ip1 → $ip2")
  else
    bad "different IP: $ip1 → $ip2"
    die "the recreated pod did not get its IP back"
  fi
  cmd "" "sticky-ipam --data-dir $tmp/cni-networks list"
  "$bin/sticky-ipam" --data-dir "$tmp/cni-networks" list | indent

  step "A pod without a name (ctr run --cni sends no K8S_POD_NAME) is treated exactly as host-local"
  local id3 id4 ip3 ip4 file
  id3=$(new_id) id4=$(new_id)
  out=$(cni "" sticky-ipam ADD "$id3" "$nsp" "" "$tmp/stdin.json") || die "ADD failed: $out"
  ip3=$(result_ip "$out")
  file="$tmp/cni-networks/demo/${ip3%/*}"
  say "ADD got $ip3; its file is host-local's, byte for byte (<container id>\r\n<ifname>):"
  printf '      %s: %q\n' "${ip3%/*}" "$(<"$file")"
  [[ $(<"$file") == "$id3"$'\r\n'eth0 ]] || die "$file is not in host-local's format"
  out=$(cni "" sticky-ipam DEL "$id3" "$nsp" "" "$tmp/stdin.json") || die "DEL failed: $out"
  [[ ! -e $file ]] && say "DEL removed the file, as host-local does (nothing to be sticky about)."
  out=$(cni "" sticky-ipam ADD "$id4" "$nsp" "" "$tmp/stdin.json") || die "ADD failed: $out"
  ip4=$(result_ip "$out")
  say "the next ADD got $ip4: the next address round-robin, as host-local — no identity, no stickiness."
  summary+=("✔ a pod without a name behaved as host-local: $ip3, then $ip4 after DEL + ADD")
  summary+=("skipped: the two-node VXLAN part (pods pinging across nodes, a VTEP deleted and recreated with the same MAC): $why")
}

if [[ $EUID -ne 0 || $ipam_only -eq 1 ]]; then
  if ((ipam_only)); then
    ipam_demo "--ipam-only was given"
  else
    ipam_demo "network namespaces need root; run scripts/demo.sh as root"
  fi
  printf '\n%sSummary%s\n' "$B" "$N"
  printf '    %s\n' "${summary[@]}"
  printf '    (the demo ran in %s s)\n' "$(since "$start_ns")"
  exit 0
fi

# =============================================================================================
# With root: two nodes, a VXLAN overlay, sticky-vxlan + sticky-ipam.

# A fresh Debian box may lack ping (and has no sudo): install what is missing, as root.
missing=()
for tool in ip:iproute2 ping:iputils-ping od:coreutils awk:mawk; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "needed: ${missing[*]} (install them, then run again)"
  say "Installing ${missing[*]} (apt-get)."
  { apt-get install -y --no-install-recommends "${missing[@]}" ||
      { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
  } >"$tmp/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed: see $tmp/apt.log"
fi

n1="node-1-$tag" n2="node-2-$tag" ul="underlay-$tag"
net=demo
vtep=sticky.1
printf '\n%ssticky-cni demo: two nodes, one VXLAN overlay, pods that keep their IP, a VTEP that keeps its MAC%s\n' "$B" "$N"
say "Namespaces $n1, $n2, $ul and pod namespaces *-$tag; files in $tmp."
say "Nothing on this host's own network is touched; all of it is removed on exit."

newns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
}

step "Two nodes joined by an underlay network (192.0.2.0/24)"
newns "$ul"
ip -n "$ul" link add br0 type bridge
ip -n "$ul" link set br0 up
for i in 1 2; do
  node="node-$i-$tag"
  newns "$node"
  ip -n "$ul" link add "n$i" type veth peer name eth0 netns "$node"
  ip -n "$ul" link set "n$i" master br0 up
  ip -n "$node" addr add "192.0.2.$i/24" dev eth0
  ip -n "$node" link set eth0 up
  mkdir -p "$tmp/node-$i/net.d"
done
say "node-1 = namespace $n1, eth0 192.0.2.1, pod subnet 10.244.1.0/24"
say "node-2 = namespace $n2, eth0 192.0.2.2, pod subnet 10.244.2.0/24"
say "(a switch between them: bridge br0 in namespace $ul)"

step "Configuration: one peers file for the whole cluster, one conflist per node"
peers="$tmp/peers.json"
cat >"$peers" <<'EOF'
[
  {"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
  {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]}
]
EOF
chmod 644 "$peers"
say "$peers (root-owned, not writable by others; no API server involved):"
indent <"$peers"

# The plugin object of node $1's conflist.
plugin_json() {
  cat <<EOF
{
      "type": "sticky-vxlan",
      "vni": 1,
      "isDefaultGateway": true,
      "peersFile": "$peers",
      "stateDir": "$tmp/node-$1/run",
      "ipam": {
        "type": "sticky-ipam",
        "dataDir": "$tmp/node-$1/cni-networks",
        "ranges": [[{ "subnet": "10.244.$1.0/24" }]]
      }
    }
EOF
}
for i in 1 2; do
  obj=$(plugin_json "$i")
  printf '{\n  "cniVersion": "1.0.0",\n  "name": "%s",\n  "plugins": [\n    %s\n  ]\n}\n' "$net" "$obj" \
    >"$tmp/node-$i/net.d/10-demo.conflist"
  # What the runtime puts on the plugin's stdin: the plugin object plus the list's name and
  # cniVersion (libcni's conflist handling).
  printf '{ "cniVersion": "1.0.0", "name": "%s", %s\n' "$net" "${obj#\{}" >"$tmp/node-$i/stdin.json"
done
say "node-1's $tmp/node-1/net.d/10-demo.conflist (node-2's differs only in its paths and subnet):"
indent <"$tmp/node-1/net.d/10-demo.conflist"

# A pod: its own network namespace (the runtime's job), then ADD inside the node.
# add_pod <node number> <pod name> <sandbox suffix>; sets pod_ip, pod_id, pod_uid, pod_ns.
add_pod() {
  local i=$1 name=$2 sandbox=$3 out
  pod_ns="$name-$sandbox-$tag" pod_id=$(new_id) pod_uid=$(new_uid)
  newns "$pod_ns"
  out=$(cni "node-$i-$tag" sticky-vxlan ADD "$pod_id" "/run/netns/$pod_ns" \
    "$(kube_args default "$name" "$pod_id" "$pod_uid")" "$tmp/node-$i/stdin.json") ||
    die "ADD of $name on node-$i failed: $out"
  pod_ip=$(result_ip "$out")
}
# reaches <pod netns> <ip>: up to ten pings of a second each (the first can be lost while
# neighbours resolve; a loaded machine answers late), done at the first reply.
reaches() {
  local _try
  for _try in 1 2 3 4 5 6 7 8 9 10; do
    if ip netns exec "$1" ping -c 1 -W 1 "$2" >"$tmp/ping.out" 2>&1; then
      return 0
    fi
  done
  return 1
}
rtt() { grep -oE 'time=[0-9.]+ ms' "$tmp/ping.out" | head -n1 || true; }

step "The runtime starts pod default/web-0 on node-1 and default/db-0 on node-2"
say "Each is an ADD run inside its node, as kubelet/containerd would run it:"
id_preview=$(new_id)
cmd "node-1" "CNI_COMMAND=ADD CNI_CONTAINERID=${id_preview:0:12}… CNI_NETNS=/run/netns/web-0-… CNI_IFNAME=eth0 \\"
cont "node-1" "  CNI_ARGS='IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=…;K8S_POD_UID=…' \\"
cont "node-1" "  CNI_PATH=<dir with sticky-vxlan and sticky-ipam> sticky-vxlan < stdin.json"
add_pod 1 web-0 a
web_ns=$pod_ns web_id=$pod_id web_uid=$pod_uid web_ip=$pod_ip
say "web-0 (node-1) got $web_ip"
add_pod 2 db-0 a
db_ip=${pod_ip%/*}
say "db-0 (node-2) got $pod_ip"
say "sticky-vxlan made the VTEP and bridge on each node, programmed the peer from the peers file,"
say "and asked sticky-ipam (from CNI_PATH, same stdin and CNI_ARGS) for the address."

step "web-0 (node-1) pings db-0 (node-2) across the VXLAN overlay"
cmd "web-0" "ping $db_ip"
if reaches "$web_ns" "$db_ip"; then
  good "reply from $db_ip $(rtt)"
else
  die "web-0 cannot reach db-0 before anything was broken (is UDP 8472 or forwarding blocked?)"
fi

step "web-0 is deleted and recreated (same namespace and name; new sandbox, container id, UID)"
out=$(cni "$n1" sticky-vxlan DEL "$web_id" "/run/netns/$web_ns" \
  "$(kube_args default web-0 "$web_id" "$web_uid")" "$tmp/node-1/stdin.json") || die "DEL of web-0 failed: $out"
ip netns del "$web_ns"
say "DEL ran and the old sandbox's namespace is gone. The address stays with default/web-0:"
cmd "node-1" "sticky-ipam --config 10-demo.conflist list"
ip netns exec "$n1" "$bin/sticky-ipam" --config "$tmp/node-1/net.d/10-demo.conflist" list | indent
say "Now the new sandbox's ADD (what kubelet does when it recreates the pod):"
add_pod 1 web-0 b
web2_ns=$pod_ns web2_ip=$pod_ip
say "web-0 (node-1, recreated) got $web2_ip  (container id ${pod_id:0:12}…, was ${web_id:0:12}…)"
if [[ $web_ip == "$web2_ip" ]]; then
  good "same IP: $web_ip → $web2_ip, with no API server (host-local would hand out the next address)"
  summary+=("✔ web-0 recreated (new sandbox, container id and UID) kept its IP: $web_ip → $web2_ip")
else
  bad "different IP: $web_ip → $web2_ip"
  die "the recreated pod did not get its IP back"
fi
cmd "node-1" "sticky-ipam --config 10-demo.conflist list"
ip netns exec "$n1" "$bin/sticky-ipam" --config "$tmp/node-1/net.d/10-demo.conflist" list | indent

mac_of() { ip -n "$1" -br link show dev "$vtep" 2>/dev/null | awk '{print $3}'; }

step "node-2's VTEP and its kept MAC"
mac_before=$(mac_of "$n2")
say "node-2 VTEP $vtep MAC: $mac_before"
cmd "anywhere" "sticky-vxlan mac --local 192.0.2.2 --vni 1"
offline=$("$bin/sticky-vxlan" mac --local 192.0.2.2 --vni 1)
say "$offline"
say "The MAC is a function of the node's underlay address and the VNI: every node works out"
say "every peer's MAC offline. node-1 already has it programmed:"
ip -n "$n1" neigh show dev "$vtep" | indent
bridge -n "$n1" fdb show dev "$vtep" 2>/dev/null | indent || true

step "node-2 \"reboots\": its VTEP is deleted, as a reboot (or a plugin upgrade) would"
cmd "node-2" "ip link del $vtep"
ip -n "$n2" link del "$vtep"
cmd "web-0" "ping $db_ip"
if ip netns exec "$web2_ns" ping -c 2 -i 0.2 -W 1 "$db_ip" >/dev/null 2>&1; then
  die "web-0 still reaches db-0 with node-2's VTEP deleted"
fi
bad "no reply: web-0 (node-1) can no longer reach db-0 (node-2)"
say "(flannel, restarted offline, would now recreate its VTEP with a random MAC; node-1, cut off"
say " from the API server, would keep sending to the old one and traffic would stay dead.)"

step "One command on node-2 (the boot-time unit runs it; any pod ADD does the same)"
cmd "node-2" "sticky-vxlan reconcile --config 10-demo.conflist"
ip netns exec "$n2" "$bin/sticky-vxlan" reconcile --config "$tmp/node-2/net.d/10-demo.conflist" 2>&1 | indent
mac_after=$(mac_of "$n2")
say "node-2 VTEP $vtep MAC after reconcile: $mac_after"
if [[ -n $mac_before && $mac_before == "$mac_after" ]]; then
  good "same MAC: $mac_before → $mac_after"
  summary+=("✔ node-2's VTEP deleted and recreated with the same MAC: $mac_before → $mac_after")
else
  bad "different MAC: $mac_before → $mac_after"
  die "the recreated VTEP did not get its MAC back"
fi
cmd "web-0" "ping $db_ip   # nothing was run on node-1"
if reaches "$web2_ns" "$db_ip"; then
  good "reply from $db_ip $(rtt): traffic is back, node-1 was never touched"
  summary+=("✔ web-0 (node-1) reaches db-0 (node-2) again; nothing was run on node-1")
else
  die "web-0 still cannot reach db-0 after reconcile on node-2"
fi
cmd "node-2" "sticky-vxlan show"
ip netns exec "$n2" "$bin/sticky-vxlan" show | indent

printf '\n%sSummary%s\n' "$B" "$N"
summary=("✔ pods on two nodes got addresses from sticky-ipam and reached each other over VXLAN" "${summary[@]}")
printf '    %s\n' "${summary[@]}"
say "All of it offline: peers from a local file, leases and MACs decided on each node."
printf '    (the demo ran in %s s)\n' "$(since "$start_ns")"
