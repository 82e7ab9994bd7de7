//! The agent's command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::family::{self, Family};
use sticky_primitives::args::{ArgsError, Spec};

pub const HELP: &str = "\
sticky-vxlan-agent: keep this node's peers file and data path current.

  sticky-vxlan-agent --config <file.conflist> [--segment-config <file>]... [options]
  sticky-vxlan-agent --version
  sticky-vxlan-agent rotate-key --config <file.conflist> [--key-dir <dir>]

Learns the peers from the Kubernetes API's Node objects when it answers (list + watch), writes
them to the conflist's peersFile when they change, and reconciles this node (as
`sticky-vxlan reconcile` does) after every change of that file, its own or by hand, and
periodically. Offline, the last good file stays and the node is programmed from it. A Node
that is not a valid peer, or claims what another Node's accepted entry holds, is left out
(logged, counted); the file written is always one this node's plugin accepts.

Where the API is (the first that applies):
  --kubeconfig <file>           kubectl's format: server, CA, token/tokenFile or client cert
  --server <url>                e.g. http://127.0.0.1:10261 (YurtHub); with https, --ca-file
      [--ca-file <pem>] [--token-file <file>]
  in a pod                      KUBERNETES_SERVICE_HOST/PORT and the service account
  --no-api                      no API: only watch the peers file (edited by hand)

Options:
  --segment-config <file>       a segment network's conflist (\"mode\": \"segment\"):
                                reconciled after the main network on the same triggers, and
                                when its own peersFile changes; repeat for each segment. One
                                that fails is logged, counted and retried, and never stops the
                                main network
  --node-name <name>            this node's Node name (default: $NODE_NAME)
  --resync <seconds>            reconcile in full this often, to heal drift (default 60);
                                past 1/400 of the node's time (about 0.15 s a round)
                                the resyncs are spaced by their own cost
  --max-remove-fraction <f>     refuse changes that would remove or move more than this
                                fraction of the peers the plugin accepted within 10 minutes
                                (default 0.5; 1 turns it off). Accept a refused change once:
                                touch <stateDir>/<network>.accept-changes
  --max-nodes <n>               the most Nodes a list or the watch may bring (default 10000,
                                up to 1000000): more is refused (a list) or ignored until the
                                next list (new Nodes of a watch). The Nodes of a list cost the
                                agent up to 3.5 KB each while it is read (docs/agent.md):
                                above the default, raise its memory limit with this
  --watch-timeout <seconds>     how long the API server keeps one watch open (its
                                timeoutSeconds; default 300 to 600, spread); a watch with no
                                end 30 s past it is dropped and the Nodes listed again
  --metrics-addr <addr:port>    serve /metrics and /healthz (default: off), e.g.
                                127.0.0.1:9767: a loopback address unless
                                --metrics-allow-remote
  --metrics-allow-remote        allow a --metrics-addr other machines can reach (0.0.0.0:9767,
                                a node address): the endpoints need no credentials; a warning
                                is logged at start
  --doctor-every <seconds>      run `sticky-vxlan doctor`'s checks this often (1 to 86400;
                                default: off) and export each peer's path state and cause
                                on /metrics (sticky_vxlan_agent_path_cause)
  --publish-flannel-annotations set flannel's annotations on this node's Node object
                                (needs --node-name and patch on nodes/status)
  --key-dir <dir>               where a site gateway keeps its WireGuard private key (made
                                once, root-only 0600, never logged or published; default
                                /var/lib/sticky-cni/wireguard): only with a \"sites\" config
  --wg-socket-dir <dir>         where sticky-wg serves the tunnel's WireGuard socket (default
                                /var/run/wireguard, where `wg` looks)
  --underlay-family ipv4|ipv6   the family of the network's underlay: which InternalIP and
                                which of flannel's annotations a Node's underlay address is
                                taken from (default: that of the config's localIp, else of
                                its peers, else ipv4; one against the config is refused)

With a \"sites\" object in the config (docs/sites.md), it also keeps this node's site: the
peers file holds the site's own nodes, its active gateway's entry carries the other sites'
pod subnets, and on the active gateway it configures the tunnel (sticky-wg's device) from the
Nodes or, with the API away, from <stateDir>/<network>.sites.json. It needs --node-name.
`rotate-key` makes a new key for this node's gateway (the old one is kept as .previous); the
running agent uses and publishes it within seconds, and other sites learn it from the API.

Exit codes: it runs until stopped; 2 for a usage error, 1 when it cannot start (the config
has no peersFile, credentials cannot be read, the metrics address is taken).
";

/// A command-line mistake (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("--doctor-every {0:?}: expected whole seconds from 1 to 86400")]
    DoctorEvery(String),
    #[error("--resync {0:?}: expected seconds from 0.1 to 86400")]
    Resync(String),
    #[error("--max-nodes {0:?}: expected a whole number from 1000 to 1000000")]
    MaxNodes(String),
    #[error("--watch-timeout {0:?}: expected whole seconds from 1 to 3600")]
    WatchTimeout(String),
    #[error("--max-remove-fraction {0:?}: expected a number from 0 to 1")]
    MaxRemoveFraction(String),
    #[error("--metrics-addr {0:?}: expected an address:port like 127.0.0.1:9767")]
    MetricsAddr(String),
    #[error(
        "--metrics-addr {0}: other machines could reach /metrics and /healthz, which need \
         no credentials; use a loopback address like 127.0.0.1:9767, or add \
         --metrics-allow-remote if that is what you want"
    )]
    MetricsRemote(SocketAddr),
    #[error("agent needs --config <file.conflist>")]
    NoConfig,
    #[error("--no-api excludes --kubeconfig and --server")]
    NoApiWithSource,
    #[error("give --kubeconfig or --server, not both")]
    TwoSources,
    #[error(
        "no API given: use --kubeconfig, --server, run in a pod, or --no-api to only watch the peers file"
    )]
    NoApi,
    #[error(
        "--publish-flannel-annotations needs the API and this node's name (--node-name or NODE_NAME)"
    )]
    PublishNeeds,
    /// `--underlay-family` not a family, or against the config (found at start).
    #[error(transparent)]
    UnderlayFamily(#[from] family::Error),
    #[error("{0} {1:?}: expected an absolute directory path")]
    NotAbsolute(&'static str, PathBuf),
}

/// `rotate-key`'s command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotateKey {
    pub config: PathBuf,
    pub key_dir: PathBuf,
}

const ROTATE_SPEC: Spec = Spec {
    verb: "rotate-key",
    flags: &[],
    values: &["--config", "--key-dir"],
    repeatable: &[],
    positionals: &[],
};

/// Parses the arguments after `rotate-key`.
pub fn parse_rotate_key(args: &[String]) -> Result<RotateKey, Error> {
    let p = sticky_primitives::args::parse(args, &[], &ROTATE_SPEC)?;
    let config = p
        .value("--config")
        .map(PathBuf::from)
        .ok_or(Error::NoConfig)?;
    let key_dir = p
        .value("--key-dir")
        .map_or_else(|| PathBuf::from(DEFAULT_KEY_DIR), PathBuf::from);
    if !key_dir.is_absolute() {
        return Err(Error::NotAbsolute("--key-dir", key_dir));
    }
    Ok(RotateKey { config, key_dir })
}

#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Kubeconfig(PathBuf),
    Server {
        url: String,
        ca_file: Option<PathBuf>,
        token_file: Option<PathBuf>,
    },
    InCluster {
        host: String,
        port: String,
    },
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub config: PathBuf,
    /// `--segment-config`, in the order given.
    pub segment_configs: Vec<PathBuf>,
    pub source: Source,
    pub node_name: Option<String>,
    pub resync: Duration,
    pub max_remove_fraction: f64,
    /// `--watch-timeout`: `None` for the default, 5 to 10 minutes spread over the fleet.
    pub watch_timeout: Option<Duration>,
    /// `--max-nodes`: the most Nodes a list or the watch may bring.
    pub max_nodes: usize,
    pub metrics_addr: Option<SocketAddr>,
    /// `--doctor-every`: how often the doctor's checks run; `None`: never.
    pub doctor_every: Option<Duration>,
    pub publish: bool,
    /// `--underlay-family`: `None` lets the config decide ([`super::family::decide`]).
    pub underlay_family: Option<Family>,
    /// `--key-dir`: the gateway's key directory.
    pub key_dir: PathBuf,
    /// `--wg-socket-dir`: where the tunnel's WireGuard socket is.
    pub wg_socket_dir: PathBuf,
}

/// Where a gateway's key is kept unless `--key-dir` says.
pub const DEFAULT_KEY_DIR: &str = "/var/lib/sticky-cni/wireguard";
/// Where sticky-wg serves its socket unless `--wg-socket-dir` says (where `wg` looks).
pub const DEFAULT_WG_SOCKET_DIR: &str = "/var/run/wireguard";

const SPEC: Spec = Spec {
    verb: "agent",
    flags: &[
        "--no-api",
        "--publish-flannel-annotations",
        "--metrics-allow-remote",
    ],
    values: &[
        "--config",
        "--kubeconfig",
        "--server",
        "--ca-file",
        "--token-file",
        "--node-name",
        "--resync",
        "--max-remove-fraction",
        "--watch-timeout",
        "--max-nodes",
        "--metrics-addr",
        "--doctor-every",
        "--segment-config",
        "--underlay-family",
        "--key-dir",
        "--wg-socket-dir",
    ],
    repeatable: &["--segment-config"],
    positionals: &[],
};

/// Parses the arguments after `agent` (with the tools' shared parser); `env` looks up
/// environment variables.
pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Options, Error> {
    let p = sticky_primitives::args::parse(args, &[], &SPEC)?;
    let path = |name: &str| p.value(name).map(PathBuf::from);
    let config = path("--config");
    let (kubeconfig, server) = (path("--kubeconfig"), p.value("--server").map(String::from));
    let (ca_file, token_file) = (path("--ca-file"), path("--token-file"));
    let no_api = p.flag("--no-api");
    let publish = p.flag("--publish-flannel-annotations");
    let node_name = p
        .value("--node-name")
        .map(String::from)
        .or_else(|| env("NODE_NAME").filter(|n| !n.is_empty()));
    let resync = match p.value("--resync") {
        None => Duration::from_secs(60),
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|s| (0.1..=86400.0).contains(s))
            .map(Duration::from_secs_f64)
            .ok_or_else(|| Error::Resync(v.to_string()))?,
    };
    let doctor_every = p
        .value("--doctor-every")
        .map(|v| {
            v.parse::<u64>()
                .ok()
                .filter(|s| (1..=86400).contains(s))
                .map(Duration::from_secs)
                .ok_or_else(|| Error::DoctorEvery(v.to_string()))
        })
        .transpose()?;
    let max_remove_fraction = match p.value("--max-remove-fraction") {
        None => 0.5,
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|f| (0.0..=1.0).contains(f))
            .ok_or_else(|| Error::MaxRemoveFraction(v.to_string()))?,
    };
    let watch_timeout = p
        .value("--watch-timeout")
        .map(|v| {
            v.parse::<u64>()
                .ok()
                .filter(|s| (1..=3600).contains(s))
                .map(Duration::from_secs)
                .ok_or_else(|| Error::WatchTimeout(v.to_string()))
        })
        .transpose()?;
    let max_nodes = match p.value("--max-nodes") {
        None => super::kube::DEFAULT_MAX_NODES,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1_000..=1_000_000).contains(n))
            .ok_or_else(|| Error::MaxNodes(v.to_string()))?,
    };
    let underlay_family = p
        .value("--underlay-family")
        .map(Family::parse_flag)
        .transpose()?;
    let metrics_addr: Option<SocketAddr> = p
        .value("--metrics-addr")
        .map(|v| v.parse().map_err(|_| Error::MetricsAddr(v.to_string())))
        .transpose()?;
    if let Some(addr) = metrics_addr
        && !addr.ip().to_canonical().is_loopback()
        && !p.flag("--metrics-allow-remote")
    {
        return Err(Error::MetricsRemote(addr));
    }
    let config = config.ok_or(Error::NoConfig)?;
    let source = match (no_api, kubeconfig, server) {
        (true, None, None) => Source::None,
        (true, _, _) => return Err(Error::NoApiWithSource),
        (false, Some(_), Some(_)) => return Err(Error::TwoSources),
        (false, Some(k), None) => Source::Kubeconfig(k),
        (false, None, Some(url)) => Source::Server {
            url,
            ca_file,
            token_file,
        },
        (false, None, None) => match (
            env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty()),
            env("KUBERNETES_SERVICE_PORT").filter(|p| !p.is_empty()),
        ) {
            (Some(host), Some(port)) => Source::InCluster { host, port },
            _ => return Err(Error::NoApi),
        },
    };
    if publish && (node_name.is_none() || source == Source::None) {
        return Err(Error::PublishNeeds);
    }
    let segment_configs = p
        .values_of("--segment-config")
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let key_dir = path("--key-dir").unwrap_or_else(|| PathBuf::from(DEFAULT_KEY_DIR));
    let wg_socket_dir =
        path("--wg-socket-dir").unwrap_or_else(|| PathBuf::from(DEFAULT_WG_SOCKET_DIR));
    for (flag, dir) in [("--key-dir", &key_dir), ("--wg-socket-dir", &wg_socket_dir)] {
        if !dir.is_absolute() {
            return Err(Error::NotAbsolute(flag, dir.clone()));
        }
    }
    Ok(Options {
        key_dir,
        wg_socket_dir,
        config,
        segment_configs,
        source,
        node_name,
        resync,
        max_remove_fraction,
        watch_timeout,
        max_nodes,
        metrics_addr,
        doctor_every,
        publish,
        underlay_family,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn sources_and_defaults() {
        let none = |_: &str| None;
        let o = parse(&args(&["--config", "/c", "--no-api"]), none).unwrap();
        assert_eq!(
            (o.source, o.resync.as_secs(), o.max_remove_fraction),
            (Source::None, 60, 0.5)
        );
        assert_eq!(o.watch_timeout, None, "spread over 5 to 10 minutes");
        let o = parse(
            &args(&["--config", "/c", "--no-api", "--watch-timeout", "5"]),
            none,
        )
        .unwrap();
        assert_eq!(o.watch_timeout, Some(Duration::from_secs(5)));
        assert_eq!(o.max_nodes, 5_000 * 2, "the default bound");
        let o = parse(
            &args(&["--config", "/c", "--no-api", "--max-nodes", "120000"]),
            none,
        )
        .unwrap();
        assert_eq!(o.max_nodes, 120_000);
        let pod = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            "NODE_NAME" => Some("n1".to_string()),
            _ => None,
        };
        let o = parse(
            &args(&["--config", "/c", "--publish-flannel-annotations"]),
            pod,
        )
        .unwrap();
        assert!(matches!(o.source, Source::InCluster { .. }));
        assert_eq!(o.node_name.as_deref(), Some("n1"));
        assert!(o.segment_configs.is_empty());
        assert_eq!(o.underlay_family, None, "the config decides");
        let o = parse(
            &args(&["--config", "/c", "--no-api", "--underlay-family", "ipv6"]),
            none,
        )
        .unwrap();
        assert_eq!(o.underlay_family, Some(Family::V6));
        assert!(HELP.contains("--underlay-family ipv4|ipv6"));
        let o = parse(
            &args(&[
                "--config",
                "/c",
                "--no-api",
                "--segment-config",
                "/s2",
                "--segment-config=/s1",
            ]),
            none,
        )
        .unwrap();
        assert_eq!(
            o.segment_configs,
            [PathBuf::from("/s2"), PathBuf::from("/s1")]
        );
        let o = parse(
            &args(&["--config", "/c", "--server", "http://127.0.0.1:10261"]),
            pod,
        )
        .unwrap();
        assert!(
            matches!(o.source, Source::Server { .. }),
            "a flag beats the pod's env"
        );
        for bad in [
            &["--no-api"][..],
            &["--config", "/c"],
            &["--config", "/c", "--no-api", "--server", "http://x"],
            &[
                "--config",
                "/c",
                "--no-api",
                "--publish-flannel-annotations",
            ],
            &["--config", "/c", "--no-api", "--max-remove-fraction", "2"],
            &["--config", "/c", "--no-api", "--metrics-addr", "9767"],
            &["--config", "/c", "--no-api", "--frob"],
            &["--config", "/c", "--no-api", "--segment-config"],
            &["--config", "/c", "--no-api", "--underlay-family", "inet6"],
            &["--config", "/c", "--no-api", "--underlay-family"],
            &[
                "--config",
                "/c",
                "--no-api",
                "--segment-config",
                "/s",
                "--segment-config",
                "/s",
            ],
        ] {
            assert!(parse(&args(bad), none).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mistakes_say_what_was_expected() {
        let none = |_: &str| None;
        for (bad, says) in [
            (&["--no-api"][..], "agent needs --config <file.conflist>"),
            (
                &["--config", "/c"],
                "no API given: use --kubeconfig, --server, run in a pod, or --no-api to only watch the peers file",
            ),
            (
                &["--config", "/c", "--no-api", "--server", "http://x"],
                "--no-api excludes --kubeconfig and --server",
            ),
            (
                &[
                    "--config",
                    "/c",
                    "--kubeconfig",
                    "/k",
                    "--server",
                    "http://x",
                ],
                "give --kubeconfig or --server, not both",
            ),
            (
                &["--config", "/c", "--no-api", "--resync", "0"],
                r#"--resync "0": expected seconds from 0.1 to 86400"#,
            ),
            (
                &["--config", "/c", "--no-api", "--doctor-every", "0"],
                r#"--doctor-every "0": expected whole seconds from 1 to 86400"#,
            ),
            (
                &["--config", "/c", "--no-api", "--watch-timeout", "0.5"],
                r#"--watch-timeout "0.5": expected whole seconds from 1 to 3600"#,
            ),
            (
                &["--config", "/c", "--no-api", "--max-nodes", "999"],
                r#"--max-nodes "999": expected a whole number from 1000 to 1000000"#,
            ),
            (
                &["--config", "/c", "--no-api", "--max-remove-fraction", "2"],
                r#"--max-remove-fraction "2": expected a number from 0 to 1"#,
            ),
            (
                &["--config", "/c", "--no-api", "--metrics-addr", "9767"],
                r#"--metrics-addr "9767": expected an address:port like 127.0.0.1:9767"#,
            ),
            (
                &[
                    "--config",
                    "/c",
                    "--no-api",
                    "--metrics-addr",
                    "0.0.0.0:9767",
                ],
                "--metrics-addr 0.0.0.0:9767: other machines could reach /metrics and /healthz, \
                 which need no credentials; use a loopback address like 127.0.0.1:9767, or add \
                 --metrics-allow-remote if that is what you want",
            ),
            (
                &[
                    "--config",
                    "/c",
                    "--no-api",
                    "--publish-flannel-annotations",
                ],
                "--publish-flannel-annotations needs the API and this node's name (--node-name or NODE_NAME)",
            ),
        ] {
            let err = parse(&args(bad), none).unwrap_err();
            assert_eq!(err.to_string(), says, "{bad:?}");
        }
        assert!(matches!(
            parse(&args(&["--config", "/c", "--no-api", "--frob"]), none),
            Err(Error::Args(_))
        ));
    }

    #[test]
    fn a_metrics_address_other_machines_reach_must_be_asked_for() {
        let none = |_: &str| None;
        let with = |addr: &str, extra: &[&str]| {
            let mut list = args(&["--config", "/c", "--no-api", "--metrics-addr", addr]);
            list.extend(args(extra));
            parse(&list, none)
        };
        for local in [
            "127.0.0.1:9767",
            "127.1.2.3:0",
            "[::1]:9767",
            "[::ffff:127.0.0.1]:9767",
        ] {
            let o = with(local, &[]).unwrap();
            assert_eq!(o.metrics_addr, Some(local.parse().unwrap()));
        }
        for remote in [
            "0.0.0.0:9767",
            "10.0.0.5:9767",
            "[::]:9767",
            "[::ffff:10.0.0.5]:1",
        ] {
            let e = with(remote, &[]).unwrap_err().to_string();
            assert!(
                e.contains("--metrics-addr") && e.contains("--metrics-allow-remote"),
                "{e}"
            );
            let o = with(remote, &["--metrics-allow-remote"]).unwrap();
            assert_eq!(o.metrics_addr, Some(remote.parse().unwrap()));
        }
        assert!(HELP.contains("--metrics-allow-remote"));
    }
}
