//! The netns topology of the sites tests (issue 28): a cloud site and two edge sites behind
//! NAT routers, joined by an "internet", documentation ranges only.
//!
//! ```text
//!                        internet: bridge br0, 203.0.113.0/24
//!        ┌──────────────────────────┼───────────────────────────┐
//!  cloud router .1            router A .10                router B .20
//!  routes, no NAT             masquerade out of wan       masquerade out of wan
//!  lan0 198.51.100.254/24     lan0 192.0.2.126/25         lan0 192.0.2.254/25
//!  c1 .1 (gateway, endpoint)  a1 .1 (gateway)             b1 .129 (gateway)
//!  c2 .2, API server .100     a2 .2                       b2 .130
//! ```
//!
//! Each LAN is a bridge in its router's namespace (the bridge's address is the router's LAN
//! address); each node is a namespace joined to it by a veth whose router end is named after
//! the node (what [`Sites::cut`] sets down). Node `k`'s pod subnet is `198.18.<k>.0/24`
//! (c1 1, c2 2, a1 11, a2 12, b1 21, b2 22). Edge routers forward only what their LAN opened
//! (a NAT router's firewall) and have no route to the other edge LAN; the cloud router routes
//! its public LAN. The namespaces are a [`Topo`]'s (its underlay is the internet), so
//! everything is deleted on drop, also when the test panics; the daemons are killed first.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sticky_netlink::netns;

use crate::kube_support::*;
use crate::vxlan_support::*;

/// A node of the topology.
#[derive(Debug)]
pub struct SiteNode {
    pub name: &'static str,
    /// The node's number: its namespace is [`Topo::node_ns`]`(k)`, its pod subnet
    /// `198.18.<k>.0/24`.
    pub k: u8,
    /// The value of its site label.
    pub site: &'static str,
    /// Its LAN address (the Node's InternalIP).
    pub ip: &'static str,
    /// Labelled `sticky-cni.io/gateway: "true"`.
    pub gateway: bool,
}

/// The six nodes: two per site, the first of each a gateway.
pub const NODES: [SiteNode; 6] = [
    SiteNode {
        name: "c1",
        k: 1,
        site: "cloud",
        ip: "198.51.100.1",
        gateway: true,
    },
    SiteNode {
        name: "c2",
        k: 2,
        site: "cloud",
        ip: "198.51.100.2",
        gateway: false,
    },
    SiteNode {
        name: "a1",
        k: 11,
        site: "site-a",
        ip: "192.0.2.1",
        gateway: true,
    },
    SiteNode {
        name: "a2",
        k: 12,
        site: "site-a",
        ip: "192.0.2.2",
        gateway: false,
    },
    SiteNode {
        name: "b1",
        k: 21,
        site: "site-b",
        ip: "192.0.2.129",
        gateway: true,
    },
    SiteNode {
        name: "b2",
        k: 22,
        site: "site-b",
        ip: "192.0.2.130",
        gateway: false,
    },
];

/// The non-gateway nodes whose pods talk across sites, in the order [`Sites::running`] makes
/// their pods.
pub const PLAIN: [&str; 3] = ["c2", "a2", "b2"];

/// The pod of plain node `name` among [`Sites::running`]'s.
pub fn pod_of<'a>(pods: &'a [(Pod, String)], name: &str) -> &'a (Pod, String) {
    let i = PLAIN.iter().position(|n| *n == name).expect("a plain node");
    &pods[i]
}

/// Site A's standby gateway, in the topology only when a test adds it
/// (`crate::sites_standby_support`).
pub const STANDBY: SiteNode = SiteNode {
    name: "a3",
    k: 13,
    site: "site-a",
    ip: "192.0.2.3",
    gateway: true,
};

/// A site's router: its WAN address on the internet, its LAN, whether it masquerades.
#[derive(Debug)]
pub struct SiteRouter {
    pub site: &'static str,
    pub wan: &'static str,
    /// The router's LAN address with the LAN's prefix length.
    pub lan: &'static str,
    pub nat: bool,
}

/// The three routers.
pub const ROUTERS: [SiteRouter; 3] = [
    SiteRouter {
        site: "cloud",
        wan: "203.0.113.1",
        lan: "198.51.100.254/24",
        nat: false,
    },
    SiteRouter {
        site: "site-a",
        wan: "203.0.113.10",
        lan: "192.0.2.126/25",
        nat: true,
    },
    SiteRouter {
        site: "site-b",
        wan: "203.0.113.20",
        lan: "192.0.2.254/25",
        nat: true,
    },
];

/// The test API server's address, on the cloud LAN.
pub const API_IP: &str = "198.51.100.100";
/// The cloud gateway's endpoint annotation (c1 has a public address).
pub const CLOUD_ENDPOINT: &str = "198.51.100.1:51820";
/// WireGuard's port, the only UDP port that may cross the internet.
pub const WG_PORT: u16 = 51820;
/// The tunnel's interface name (the plan's default).
pub const WG_IF: &str = "stickywg0";
/// Where every node's agent serves its metrics, in the node's namespace.
pub const METRICS_ADDR: &str = "127.0.0.1:9767";
/// The site label's key, the gateway label's (the shipped, admin-only defaults), the endpoint
/// annotation's.
pub const SITE_LABEL: &str = "node-restriction.kubernetes.io/sticky-cni-site";
pub const GATEWAY_LABEL: &str = "node-restriction.kubernetes.io/sticky-cni-gateway";
pub const ENDPOINT_ANNOTATION: &str = "sticky-cni.io/gateway-endpoint";

/// How the edge routers translate addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nat {
    /// `masquerade` out of the WAN: source ports kept where free (a port-preserving NAT).
    Masquerade,
    /// Router A as [`Nat::Masquerade`], router B `masquerade random`: a new random source
    /// port per mapping (per destination), the NAT hole punching cannot cross.
    RandomOnB,
}

impl Nat {
    fn statement(self, site: &str) -> &'static str {
        match (self, site) {
            (Nat::RandomOnB, "site-b") => "masquerade random",
            _ => "masquerade",
        }
    }
}

/// The node named `name` (panics on an unknown name: a test's typo); the standby gateway
/// a3 ([`STANDBY`]) is one when a test adds it.
pub fn site_node(name: &str) -> &'static SiteNode {
    NODES
        .iter()
        .chain([&STANDBY])
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name:?} in the sites topology"))
}

/// Node `name`'s pod subnet, `198.18.<k>.0/24`.
pub fn pod_subnet(name: &str) -> String {
    format!("198.18.{}.0/24", site_node(name).k)
}

/// The three sites, their nodes, the API server with every Node object, and the daemons
/// started so far. Fields drop in order: daemons first, then the API, then the namespaces.
pub struct Sites {
    daemons: BTreeMap<(String, &'static str), Agent>,
    /// How many times each daemon was started: each run logs to its own file.
    starts: BTreeMap<(String, &'static str), usize>,
    pub api: ApiServer,
    pub ca: PathBuf,
    pub token: PathBuf,
    pub confs: BTreeMap<&'static str, Value>,
    pub conf_files: BTreeMap<&'static str, PathBuf>,
    /// The namespace holding the API server (on the cloud LAN).
    pub api_ns: String,
    /// Namespaces, links and temp dir; its underlay namespace is the internet.
    pub topo: Topo,
}

impl Sites {
    /// The topology with edge routers of this NAT flavour, the API server up with the six
    /// Node objects; no daemon runs yet.
    pub fn new(nat: Nat) -> Sites {
        assert_can_run();
        let mut topo = Topo::new(1500);
        for r in &ROUTERS {
            add_router(&mut topo, r, nat);
        }
        for n in &NODES {
            let router = router_ns(&topo, n.site);
            let ns = topo.node_ns(n.k);
            let gw = router_of(n.site).lan.split('/').next().unwrap_or_default();
            join_lan(&mut topo, &router, n.name, &ns, &lan_addr(n.ip, n.site), gw);
        }
        let api_ns = format!("{}-api", topo.tag);
        let cloud = router_ns(&topo, "cloud");
        join_lan(
            &mut topo,
            &cloud,
            "api",
            &api_ns,
            &format!("{API_IP}/24"),
            "198.51.100.254",
        );
        let api = ApiServer::new(API_IP, Some(Path::new(&format!("/run/netns/{api_ns}"))));
        let (ca, token) = api.credentials(topo.dir.path());
        let mut confs = BTreeMap::new();
        let mut conf_files = BTreeMap::new();
        for n in &NODES {
            let conf = topo.conf(
                n.k,
                json!({
                    "peersFile": topo.dir.path().join(format!("peers-{}.json", n.name)),
                    "sites": {"wanMtu": 1500, "relays": ["cloud"]},
                    "ipam": {
                        "type": "host-local",
                        "dataDir": topo.dir.path().join(format!("ipam-{}", n.name)),
                        "ranges": [[{"subnet": pod_subnet(n.name)}]],
                    },
                }),
            );
            let file = topo.dir.path().join(format!("{}.conf", n.name));
            std::fs::write(&file, conf.to_string()).expect("write the node's config");
            confs.insert(n.name, conf);
            conf_files.insert(n.name, file);
            api.put_node(node_object(n));
        }
        Sites {
            daemons: BTreeMap::new(),
            starts: BTreeMap::new(),
            api,
            ca,
            token,
            confs,
            conf_files,
            api_ns,
            topo,
        }
    }

    /// Node `name`'s agent's metrics (`--metrics-addr` [`METRICS_ADDR`] in its namespace).
    pub fn metrics(&self, name: &str) -> String {
        let netns = PathBuf::from(format!("/run/netns/{}", self.ns(name)));
        get_in_netns(&netns, METRICS_ADDR, "/metrics")
            .unwrap_or_else(|| panic!("no metrics from {name}'s agent"))
    }

    /// Sets `sites.<key>` in every node's config (before the agents start).
    pub fn set_sites_setting(&mut self, key: &str, value: Value) {
        for n in &NODES {
            let conf = self.confs.get_mut(n.name).expect("every node has a config");
            conf["sites"][key] = value.clone();
            std::fs::write(&self.conf_files[n.name], conf.to_string())
                .expect("write the node's config");
        }
    }

    /// Sites read from these label keys (`sites.siteLabel`, `sites.gatewayLabel`), and every
    /// Node labelled with them instead of the defaults (before the agents start).
    pub fn use_labels(&mut self, site_key: &str, gateway_key: &str) {
        self.set_sites_setting("siteLabel", json!(site_key));
        self.set_sites_setting("gatewayLabel", json!(gateway_key));
        for n in &NODES {
            self.api
                .put_node(node_object_with(n, site_key, gateway_key));
        }
    }

    /// Every daemon running (after `setup`), a pod on each plain node (c2, a2, b2), and every
    /// ordered pair of them answering pings (waited for, 120 s each: a loaded machine).
    pub fn running(nat: Nat, setup: impl FnOnce(&mut Sites)) -> (Sites, Vec<(Pod, String)>) {
        let mut s = Sites::new(nat);
        setup(&mut s);
        s.start_all();
        let pods: Vec<(Pod, String)> = PLAIN.iter().map(|n| s.pod(n, &format!("p{n}"))).collect();
        for (from, _) in &pods {
            for (to, ip) in &pods {
                if from.ns == to.ns {
                    continue;
                }
                let took = first_reply(&from.ns, ip, Duration::from_secs(120));
                let took = took.unwrap_or_else(|| {
                    panic!(
                        "{} never reached {ip} ({}) in 120 s; logs: {:#?}",
                        from.ns,
                        to.ns,
                        s.logs()
                    )
                });
                eprintln!("{} -> {ip}: first reply after {took:?}", from.ns);
            }
        }
        (s, pods)
    }

    /// The log of node `name`'s agent (every run of it).
    pub fn agent_log(&self, name: &str) -> String {
        self.logs()
            .into_iter()
            .filter(|(file, _)| file.contains(name) && file.contains("agent"))
            .map(|(_, body)| body)
            .collect()
    }

    /// A host on the internet (namespace `<tag>-ih`, `203.0.113.66/24` on the internet's
    /// bridge, the cloud LAN routed via the cloud's router), made once: what a stranger sends
    /// from. Its namespace is removed with the topology.
    pub fn internet_host(&mut self) -> String {
        let ns = format!("{}-ih", self.topo.tag);
        if !Path::new(&format!("/run/netns/{ns}")).exists() {
            self.topo.add_ns(&ns);
            let inet = self.topo.underlay.clone();
            ok(&[
                "ip", "-n", &inet, "link", "add", "ih", "type", "veth", "peer", "name", "wan",
                "netns", &ns,
            ]);
            ok(&[
                "ip", "-n", &inet, "link", "set", "ih", "master", "br0", "up",
            ]);
            ok(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                "203.0.113.66/24",
                "dev",
                "wan",
            ]);
            ok(&["ip", "-n", &ns, "link", "set", "wan", "up"]);
            route_cloud_lan(&ns);
        }
        ns
    }

    /// Gives `site`'s router the WAN address `new` in place of its own, as a PPPoE reconnect
    /// does: the old address goes, and with it every NAT mapping made with it (masquerade
    /// forgets the connections of an address that is removed).
    pub fn renumber_wan(&self, site: &str, new: &str) {
        let r = self.router_ns(site);
        let old = format!("{}/24", router_of(site).wan);
        ok(&[
            "ip",
            "netns",
            "exec",
            &r,
            "sysctl",
            "-qw",
            "net.ipv4.conf.wan.promote_secondaries=1",
        ]);
        ok(&[
            "ip",
            "-n",
            &r,
            "addr",
            "add",
            &format!("{new}/24"),
            "dev",
            "wan",
        ]);
        ok(&["ip", "-n", &r, "addr", "del", &old, "dev", "wan"]);
        route_cloud_lan(&r);
    }

    /// The internet's namespace (its bridge is `br0`).
    pub fn internet(&self) -> &str {
        &self.topo.underlay
    }

    /// Node `name`'s namespace.
    pub fn ns(&self, name: &str) -> String {
        self.topo.node_ns(site_node(name).k)
    }

    /// The namespace of `site`'s router.
    pub fn router_ns(&self, site: &str) -> String {
        router_ns(&self.topo, site)
    }

    /// Node `name`'s private key directory (`--key-dir`).
    pub fn key_dir(&self, name: &str) -> PathBuf {
        self.topo.dir.path().join(format!("keys-{name}"))
    }

    /// The private key file the agent of gateway `name` keeps.
    pub fn key_file(&self, name: &str) -> PathBuf {
        self.key_dir(name).join(format!("{WG_IF}.key"))
    }

    /// Node `name`'s UAPI socket directory (`--wg-socket-dir`, sticky-wg's `--socket-dir`).
    pub fn wg_socket_dir(&self, name: &str) -> PathBuf {
        self.topo.dir.path().join(format!("wg-{name}"))
    }

    /// Starts node `name`'s agent (killing a running one first).
    pub fn start_agent(&mut self, name: &str) {
        let conf = &self.conf_files[site_node(name).name];
        let mut args = self.api.agent_args(conf, &self.ca, &self.token, name);
        for (flag, dir) in [
            ("--key-dir", self.key_dir(name)),
            ("--wg-socket-dir", self.wg_socket_dir(name)),
            ("--metrics-addr", PathBuf::from(METRICS_ADDR)),
        ] {
            args.push(flag.to_string());
            args.push(dir.to_string_lossy().into_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.start_daemon(name, "agent", agent_bin(), &args);
    }

    /// Starts sticky-wg on node `name` (killing a running one first).
    pub fn start_wg(&mut self, name: &str) {
        let socks = self.wg_socket_dir(name).to_string_lossy().into_owned();
        let bin = crate::support::bins::built("sticky-wg");
        self.start_daemon(name, "wg", bin, &["--socket-dir", &socks, WG_IF]);
    }

    fn start_daemon(&mut self, name: &str, what: &'static str, bin: &str, args: &[&str]) {
        self.stop(name, what);
        let key = (name.to_string(), what);
        let n = self.starts.entry(key.clone()).or_default();
        *n += 1;
        let log = self.topo.dir.path().join(format!("{what}-{name}-{n}.log"));
        let ns = self.ns(name);
        self.daemons.insert(key, Agent::start(bin, &ns, log, args));
    }

    /// Kills node `name`'s daemon `what` (`"agent"` or `"wg"`), if it runs.
    pub fn stop(&mut self, name: &str, what: &str) {
        if let Some(mut d) = self.daemons.remove(&(name.to_string(), what_key(what))) {
            d.kill();
        }
    }

    /// Kills node `name`'s agent.
    pub fn stop_agent(&mut self, name: &str) {
        self.stop(name, "agent");
    }

    /// Waits until the relay gateway c1's sites cache holds where a1 and b1 dial in from (its
    /// own NAT discovery annotation): what it dials first when it comes back, as in the field
    /// once the relay has run a while (docs/sites.md, "What survives the cloud").
    pub fn wait_relay_observed(&self) {
        let cache = self.sites_cache("c1");
        wait_for(
            "c1 to cache where a1 and b1 dial in from",
            Duration::from_secs(120),
            || {
                let text = std::fs::read_to_string(&cache).unwrap_or_default();
                text.contains("observed-endpoints")
                    && text.contains(r#"\"a1\""#)
                    && text.contains(r#"\"b1\""#)
            },
        );
    }

    /// Node `name`'s agent's sites cache (`<stateDir>/<network>.sites.json`).
    pub fn sites_cache(&self, name: &str) -> PathBuf {
        self.topo
            .state_dir(site_node(name).k)
            .join(format!("{}.sites.json", self.topo.net))
    }

    /// Kills node `name`'s sticky-wg.
    pub fn stop_wg(&mut self, name: &str) {
        self.stop(name, "wg");
    }

    /// The running daemon `what` of node `name`.
    pub fn daemon(&mut self, name: &str, what: &str) -> &mut Agent {
        self.daemons
            .get_mut(&(name.to_string(), what_key(what)))
            .unwrap_or_else(|| panic!("no {what} runs on {name}"))
    }

    /// sticky-wg on every gateway, then an agent on every node.
    pub fn start_all(&mut self) {
        for n in NODES.iter().filter(|n| n.gateway) {
            self.start_wg(n.name);
        }
        for n in &NODES {
            self.start_agent(n.name);
        }
    }

    /// Every log file any daemon wrote (every run of it), by file name.
    pub fn logs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(self.topo.dir.path())
            .expect("the temp dir")
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.ends_with(".log").then_some(name)
            })
            .map(|f| {
                let text =
                    std::fs::read_to_string(self.topo.dir.path().join(&f)).unwrap_or_default();
                (f, text)
            })
            .collect();
        out.sort();
        out
    }

    /// Cuts node `name`'s underlay link (its port on the LAN bridge goes down).
    pub fn cut(&self, name: &str) {
        let r = self.router_ns(site_node(name).site);
        ok(&["ip", "-n", &r, "link", "set", name, "down"]);
    }

    /// Restores what [`Sites::cut`] cut.
    pub fn restore(&self, name: &str) {
        let r = self.router_ns(site_node(name).site);
        ok(&["ip", "-n", &r, "link", "set", name, "up"]);
    }

    /// A pod `pod` on node `name`, added by the real plugin with the node's config: the pod
    /// and its IPv4 address.
    /// When node `name`'s agent runs, its peers file is waited for first (120 s): the plugin
    /// finds its underlay from its peers.
    pub fn pod(&mut self, name: &str, pod: &str) -> (Pod, String) {
        let node = site_node(name);
        if self.daemons.contains_key(&(name.to_string(), "agent")) {
            let peers = self.topo.dir.path().join(format!("peers-{name}.json"));
            wait_for(
                &format!("{name}'s agent to write {}", peers.display()),
                Duration::from_secs(120),
                || peers.exists(),
            );
        }
        let p = self.topo.new_pod(node.k, pod);
        let ip = ip_of(&self.topo.add(&p, &self.confs[node.name]), false);
        (p, ip)
    }

    /// A capture on the internet's bridge into a file in the temp dir.
    pub fn capture(&self, tag: &str) -> Capture {
        let file = self.topo.dir.path().join(format!("internet-{tag}.pcap"));
        Capture::start(self.internet(), "br0", file)
    }

    /// `wg <args>` (Debian's wireguard-tools) against node `name`'s tunnel: `wg` finds UAPI
    /// sockets only in `/var/run/wireguard`, so it runs in a mount namespace of its own where
    /// that is the node's socket directory (nothing outside changes; the namespace ends with
    /// it).
    pub fn wg(&self, name: &str, args: &[&str]) -> String {
        crate::support::bins::assert_installed("wg", "wireguard-tools");
        let dir = self.wg_socket_dir(name);
        let script = "mount -t tmpfs sticky-test /run && mkdir /run/wireguard && \
                      mount --bind \"$0\" /run/wireguard && exec wg \"$@\"";
        let ns = self.ns(name);
        let mut argv = vec![
            "ip",
            "netns",
            "exec",
            &ns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ];
        let dir = dir.to_string_lossy().into_owned();
        argv.push(&dir);
        argv.extend_from_slice(args);
        ok(&argv)
    }

    /// The public keys of node `name`'s WireGuard peers (`wg show stickywg0 peers`).
    pub fn wg_peers(&self, name: &str) -> Vec<String> {
        self.wg(name, &["show", WG_IF, "peers"])
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Node `name`'s tunnel's public key (`wg show stickywg0 public-key`).
    pub fn wg_public_key(&self, name: &str) -> String {
        self.wg(name, &["show", WG_IF, "public-key"])
            .trim()
            .to_string()
    }

    /// `Ip: FragCreates` of node `name`'s namespace: fragments it made.
    pub fn frag_creates(&self, name: &str) -> u64 {
        ip_counter(&self.ns(name), "FragCreates")
    }
}

fn what_key(what: &str) -> &'static str {
    match what {
        "agent" => "agent",
        "wg" => "wg",
        _ => panic!("no daemon {what:?}: agent or wg"),
    }
}

fn router_of(site: &str) -> &'static SiteRouter {
    ROUTERS
        .iter()
        .find(|r| r.site == site)
        .unwrap_or_else(|| panic!("no router for site {site:?}"))
}

fn router_ns_of(site: &str, tag: &str) -> String {
    let short = match site {
        "cloud" => "rc",
        "site-a" => "ra",
        "site-b" => "rb",
        _ => panic!("no router for site {site:?}"),
    };
    format!("{tag}-{short}")
}

fn router_ns(topo: &Topo, site: &str) -> String {
    router_ns_of(site, &topo.tag)
}

/// `ip` with the LAN's prefix length.
pub(crate) fn lan_addr(ip: &str, site: &str) -> String {
    let len = router_of(site).lan.split('/').nth(1).unwrap_or_default();
    format!("{ip}/{len}")
}

/// A router: WAN veth onto the internet's bridge, a LAN bridge, forwarding on; an edge router
/// masquerades out of its WAN, forwards only what its LAN opened, drops unsolicited inbound
/// on its WAN (an input firewall, as real routers have: without it a first punch reaching it
/// before its own side dialed leaves a conntrack entry that makes its masquerade pick another
/// port), and routes the cloud's public LAN through the cloud router.
/// In namespace `ns` (on the internet), the cloud LAN through the cloud's router.
fn route_cloud_lan(ns: &str) {
    ok(&[
        "ip",
        "-n",
        ns,
        "route",
        "replace",
        "198.51.100.0/24",
        "via",
        "203.0.113.1",
    ]);
}

fn add_router(topo: &mut Topo, r: &SiteRouter, nat: Nat) {
    let ns = router_ns(topo, r.site);
    topo.add_ns(&ns);
    let inet = topo.underlay.clone();
    let port = ns.rsplit('-').next().unwrap_or_default().to_string();
    ok(&[
        "ip", "-n", &inet, "link", "add", &port, "type", "veth", "peer", "name", "wan", "netns",
        &ns,
    ]);
    ok(&[
        "ip", "-n", &inet, "link", "set", &port, "master", "br0", "up",
    ]);
    let wan = format!("{}/24", r.wan);
    ok(&["ip", "-n", &ns, "addr", "add", &wan, "dev", "wan"]);
    ok(&["ip", "-n", &ns, "link", "set", "wan", "up"]);
    ok(&["ip", "-n", &ns, "link", "add", "lan0", "type", "bridge"]);
    ok(&["ip", "-n", &ns, "addr", "add", r.lan, "dev", "lan0"]);
    ok(&["ip", "-n", &ns, "link", "set", "lan0", "up"]);
    ok(&[
        "ip",
        "netns",
        "exec",
        &ns,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    if r.nat {
        route_cloud_lan(&ns);
        let script = format!(
            "table ip sticky_test_router {{\n\
             \x20 chain postrouting {{\n\
             \x20   type nat hook postrouting priority srcnat; policy accept;\n\
             \x20   oifname \"wan\" {}\n\
             \x20 }}\n\
             \x20 chain forward {{\n\
             \x20   type filter hook forward priority filter; policy drop;\n\
             \x20   iifname \"lan0\" accept\n\
             \x20   ct state established,related accept\n\
             \x20 }}\n\
             \x20 chain input {{\n\
             \x20   type filter hook input priority filter; policy accept;\n\
             \x20   iifname \"wan\" ct state established,related accept\n\
             \x20   iifname \"wan\" drop\n\
             \x20 }}\n\
             }}\n",
            nat.statement(r.site)
        );
        topo.load_nft(&ns, &format!("router-{}.nft", r.site), &script);
    }
}

/// Namespace `ns` (made here) on `router`'s LAN bridge: a veth named `port` on the router's
/// side, `eth0` inside with `addr`, default route via `gw`.
pub(crate) fn join_lan(topo: &mut Topo, router: &str, port: &str, ns: &str, addr: &str, gw: &str) {
    topo.add_ns(ns);
    ok(&[
        "ip", "-n", router, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
        ns,
    ]);
    ok(&[
        "ip", "-n", router, "link", "set", port, "master", "lan0", "up",
    ]);
    ok(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
    ok(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
    ok(&["ip", "-n", ns, "route", "add", "default", "via", gw]);
}

/// Node `n`'s Node object: its site label, the gateway label on gateways, the cloud
/// gateway's endpoint annotation (the edge gateways have none: they are behind NAT).
pub fn node_object(n: &SiteNode) -> Value {
    node_object_with(n, SITE_LABEL, GATEWAY_LABEL)
}

/// [`node_object`] with these label keys.
pub fn node_object_with(n: &SiteNode, site_key: &str, gateway_key: &str) -> Value {
    let annotations = if n.name == "c1" {
        json!({ENDPOINT_ANNOTATION: CLOUD_ENDPOINT})
    } else {
        json!({})
    };
    let mut node = node_json(n.name, n.ip, &[&pod_subnet(n.name)], annotations);
    node["metadata"]["labels"][site_key] = json!(n.site);
    if n.gateway {
        node["metadata"]["labels"][gateway_key] = json!("true");
    }
    node
}

/// A counter of the `Ip:` lines of `/proc/net/snmp` in namespace `ns`.
pub fn ip_counter(ns: &str, counter: &str) -> u64 {
    let snmp = ok(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]);
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (Some(names), Some(values)) = (ip.next(), ip.next()) else {
        panic!("no Ip: lines in /proc/net/snmp of {ns}: {snmp}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == counter)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Ip: {counter} in {ns}: {snmp}"))
}

/// Pings `to` from namespace `ns` (ten a second) until the first reply, within `deadline`:
/// how long that took, or `None`.
pub fn first_reply(ns: &str, to: &str, deadline: Duration) -> Option<Duration> {
    let start = Instant::now();
    let secs = deadline.as_secs().max(1).to_string();
    let out = sh(&[
        "ip", "netns", "exec", ns, "ping", "-4", "-n", "-q", "-c", "1", "-i", "0.1", "-w", &secs,
        to,
    ]);
    out.status.success().then(|| start.elapsed())
}

/// Pings `to` from namespace `ns` with `-M do` (no fragmenting) and `size` bytes of payload
/// until one answers, within 60 s; whether one did.
pub fn full_size_reply(ns: &str, to: &str, size: usize) -> bool {
    let size = size.to_string();
    let out = sh(&[
        "ip", "netns", "exec", ns, "ping", "-4", "-n", "-q", "-M", "do", "-s", &size, "-c", "1",
        "-i", "0.2", "-w", "60", to,
    ]);
    out.status.success()
}

/// An interface's MTU in namespace `ns`.
pub fn link_mtu(ns: &str, dev: &str) -> u32 {
    let out = ok(&["ip", "-n", ns, "-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&out).expect("ip -j");
    v[0]["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or_else(|| panic!("no MTU for {dev} in {ns}: {out}"))
}

/// A ping at 100 packets a second, running until [`Flood::finish`].
pub struct Flood {
    child: std::process::Child,
}

impl Flood {
    /// `count` pings at 100/s from namespace `ns` to `to`.
    pub fn start(ns: &str, to: &str, count: usize) -> Flood {
        let count = count.to_string();
        let child = std::process::Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-4", "-n", "-q", "-i", "0.01", "-W", "2",
            ])
            .args(["-c", &count, to])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run ping");
        Flood { child }
    }

    /// Waits for the last ping: (sent, received).
    pub fn finish(self) -> (u64, u64) {
        let out = self.child.wait_with_output().expect("wait for ping");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let stats = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("no statistics from ping: {text}"));
        let number = |what: &str| -> u64 {
            stats
                .split(',')
                .find(|p| p.contains(what))
                .and_then(|p| p.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {what:?} in {stats:?}"))
        };
        (number("transmitted"), number("received"))
    }
}

/// A TCP exchange from pod `from` to `to_ip` (in pod `to`'s namespace, where a listener is
/// bound for it), retried until it works within 60 s: the source address the listener saw.
/// Both directions carry a payload, checked.
pub fn tcp_exchange(from: &Pod, to: &Pod, to_ip: &str) -> IpAddr {
    use std::io::{BufRead, BufReader, Write};
    let bind: SocketAddr = format!("{to_ip}:0")
        .parse()
        .expect("the listener's address");
    let listener = netns::run_in(Path::new(&to.path()), || TcpListener::bind(bind))
        .expect("enter the pod's namespace")
        .expect("bind in the pod");
    let addr = listener.local_addr().expect("the listener's port");
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(60);
    let server = std::thread::spawn(move || -> Option<IpAddr> {
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((conn, peer)) => {
                    conn.set_nonblocking(false).ok()?;
                    conn.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
                    let mut line = String::new();
                    BufReader::new(&conn).read_line(&mut line).ok()?;
                    if line != "hello\n" {
                        continue;
                    }
                    (&conn)
                        .write_all(format!("seen {}\n", peer.ip()).as_bytes())
                        .ok()?;
                    return Some(peer.ip());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        None
    });
    let from_path = PathBuf::from(from.path());
    let mut answer = String::new();
    while Instant::now() < deadline && answer.is_empty() {
        answer = netns::run_in(&from_path, || -> Option<String> {
            let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            conn.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
            (&conn).write_all(b"hello\n").ok()?;
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).ok()?;
            Some(line)
        })
        .expect("enter the pod's namespace")
        .unwrap_or_default();
    }
    let seen = server.join().expect("the listener's thread");
    let seen = seen.unwrap_or_else(|| panic!("no TCP exchange {} -> {addr} in 60 s", from.ns));
    assert_eq!(answer, format!("seen {seen}\n"), "the listener's answer");
    seen
}

/// One IPv4 packet of a capture (tcpdump `-nn -e` text), or `None` for other frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub sport: Option<u16>,
    pub dst: IpAddr,
    pub dport: Option<u16>,
    pub tcp: bool,
    pub udp: bool,
    pub line: String,
}

impl Packet {
    /// To 224.0.0.0/24 (IGMP reports of an interface coming up): a link's housekeeping,
    /// never routed, no traffic of anyone's.
    pub fn link_local_multicast(&self) -> bool {
        matches!(self.dst, IpAddr::V4(d) if d.octets()[..3] == [224, 0, 0])
    }
}

/// `a.b.c.d.port` or `a.b.c.d` (with a trailing `:` or not): address and port.
fn endpoint(s: &str) -> Option<(IpAddr, Option<u16>)> {
    let s = s.trim_end_matches(':');
    if let Ok(ip) = s.parse() {
        return Some((ip, None));
    }
    let (ip, port) = s.rsplit_once('.')?;
    Some((ip.parse().ok()?, Some(port.parse().ok()?)))
}

/// The IPv4 packets of tcpdump's `-nn -e` text (an encapsulated frame's inner line, which
/// carries no timestamp, is one too).
pub fn ipv4_packets(frames: &str) -> Vec<Packet> {
    frames
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("ethertype IPv4 (0x0800), length ")?;
            let (_, body) = rest.split_once(": ")?;
            let mut words = body.split_whitespace();
            let (src, sport) = endpoint(words.next()?)?;
            (words.next()? == ">").then_some(())?;
            let (dst, dport) = endpoint(words.next()?)?;
            let tcp = body.contains(": Flags [");
            Some(Packet {
                src,
                sport,
                dst,
                dport,
                tcp,
                udp: !tcp && sport.is_some() && dport.is_some(),
                line: line.to_string(),
            })
        })
        .collect()
}

/// The lines of a capture that are neither IPv4, ARP, nor IPv6 link-local housekeeping
/// (neighbour discovery, MLD, router solicitations of a veth coming up).
pub fn foreign_frames(frames: &str) -> Vec<String> {
    frames
        .lines()
        .filter(|l| !l.contains("ethertype IPv4") && !l.contains("ethertype ARP"))
        .filter(|l| {
            let Some((_, rest)) = l.split_once("ethertype IPv6 (0x86dd), length ") else {
                return true;
            };
            let mut words = rest
                .split_once(": ")
                .map(|(_, b)| b)
                .unwrap_or("")
                .split_whitespace();
            let src = words.next().unwrap_or("");
            let dst = words.nth(1).unwrap_or("");
            let local = |a: &str| a.starts_with("fe80:") || a.starts_with("ff02:") || a == "::";
            !(local(src) && local(dst.trim_end_matches(':')))
        })
        .map(str::to_string)
        .collect()
}

/// Every address configured in namespace `ns` (both families, without prefix length).
pub fn addresses(ns: &str) -> Vec<IpAddr> {
    let out = ok(&["ip", "-n", ns, "-j", "addr", "show"]);
    let v: Value = serde_json::from_str(&out).expect("ip -j addr");
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect()
}

/// True for the documentation ranges, the benchmarking range 198.18.0.0/15 (pod subnets),
/// loopback and IPv6 link-local: what a test may use.
pub fn documentation_address(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || matches!(
                    (o[0], o[1], o[2]),
                    (192, 0, 2) | (198, 51, 100) | (203, 0, 113)
                )
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            v6.is_loopback() || (s[0] & 0xffc0) == 0xfe80 || (s[0] == 0x2001 && s[1] == 0xdb8)
        }
    }
}

impl Sites {
    /// Every namespace of the topology but the pods': internet, routers, nodes, API.
    pub fn namespaces(&self) -> Vec<String> {
        let mut all = vec![self.internet().to_string(), self.api_ns.clone()];
        all.extend(ROUTERS.iter().map(|r| self.router_ns(r.site)));
        all.extend(NODES.iter().map(|n| self.ns(n.name)));
        all
    }
}

/// The default gateway of namespace `ns` (a pod's: its node's bridge address).
pub fn default_gateway(ns: &str) -> String {
    let out = ok(&["ip", "-n", ns, "-j", "-4", "route", "show", "default"]);
    let v: Value = serde_json::from_str(&out).expect("ip -j route");
    v[0]["gateway"]
        .as_str()
        .unwrap_or_else(|| panic!("no default gateway in {ns}: {out}"))
        .to_string()
}

/// How long a benchmark measures each case: `STICKY_BENCH_SECS` seconds, default 10.
pub fn bench_secs() -> u32 {
    std::env::var("STICKY_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// TCP throughput from namespace `from` (from `source` if given) to an iperf3 server on `to`
/// in namespace `to_ns`, over `secs` seconds: megabits a second received.
pub fn iperf3_mbps(from: &str, source: Option<&str>, to_ns: &str, to: &str, secs: u32) -> f64 {
    use std::io::BufRead;
    crate::support::bins::assert_installed("iperf3", "iperf3");
    let mut server = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            to_ns,
            "iperf3",
            "-s",
            "-1",
            "--forceflush",
            "-B",
            to,
            "-p",
            "5201",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run iperf3 -s");
    let mut line = String::new();
    let mut out = std::io::BufReader::new(server.stdout.take().expect("stdout"));
    while !line.contains("listening") {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("iperf3 -s output") > 0,
            "iperf3 -s ended"
        );
    }
    let secs = secs.to_string();
    let mut argv = vec![
        "ip", "netns", "exec", from, "iperf3", "-J", "-c", to, "-p", "5201", "-t", &secs,
    ];
    if let Some(src) = source {
        argv.extend_from_slice(&["-B", src]);
    }
    let report: Value = serde_json::from_str(&ok(&argv)).expect("iperf3 -J");
    let _ = server.kill();
    let _ = server.wait();
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("no throughput in iperf3's report: {report}"))
        / 1e6
}

/// The average round trip of `count` pings (100 a second) from namespace `from` (from
/// `source` if given) to `to`, in milliseconds.
pub fn rtt_ms(from: &str, source: Option<&str>, to: &str, count: u32) -> f64 {
    let count = count.to_string();
    let mut argv = vec![
        "ip", "netns", "exec", from, "ping", "-4", "-n", "-q", "-i", "0.01", "-c", &count,
    ];
    if let Some(src) = source {
        argv.extend_from_slice(&["-I", src]);
    }
    argv.push(to);
    let out = ok(&argv);
    out.lines()
        .find_map(|l| l.strip_prefix("rtt min/avg/max/mdev = "))
        .and_then(|v| v.split('/').nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no round trip in ping's output: {out}"))
}

/// Standard base64 (with padding) decoded; `None` when it is not.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in text.trim_end_matches('=').bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    Some(out)
}
