//! `sticky-vxlan-agent`: a long-running node agent that learns the peers from the
//! Kubernetes API's Node objects when it answers, writes them to the peers file the plugin
//! reads, and reconciles the node whenever that file changes.
//!
//! The exec path (ADD/DEL/CHECK/GC/STATUS, `reconcile`) never talks to an API server: it reads
//! the peers file. The agent only writes that file, so the data path survives any outage of
//! the control plane: offline, the last good file stays and the node is programmed from it.
//!
//! It is a program of its own (`src/bin/sticky-vxlan-agent.rs`): the plugin binary kubelet
//! executes for every pod links no TLS, HTTP or YAML.
//!
//! [`flags`] is the command line, [`endpoint`] finds the API and its credentials ([`proxy`]
//! the proxy to it, by client-go's rules), [`api`] is
//! what the agent asks of the API (a trait), [`kube`] its HTTP implementation, [`objects`] the
//! typed subset of the Node object, [`reflector`] the list/watch state machine over the
//! [`api`] and [`clock`] traits, [`family`] decides the network's underlay family,
//! [`mapping`] turns one Node into its peer entry on that family, [`table`]
//! places the Nodes by the plugin's whole-list rules (one bad Node is left out alone, no
//! takeover), [`guard`] refuses changes that would stop traffic on many peers at once,
//! [`sync`] carries the Nodes from the reflector to the peers file (one write per burst),
//! [`api_side`] is the API's half of the main loop (the keeper, the publisher, the operator's
//! `accept-changes` file), [`files`] the files it writes, [`sites`] the sites room,
//! [`reconcile`] programs the node, [`state`] and [`serve`] are the metrics, `/healthz` and the
//! status file, and [`publish`] sets flannel's annotations on the agent's own Node.

mod api;
mod api_side;
mod clock;
mod doctor;
mod endpoint;
mod family;
mod files;
mod flags;
mod guard;
mod kube;
mod mapping;
mod objects;
mod proxy;
mod publish;
mod reconcile;
mod reflector;
mod serve;
mod sites;
mod state;
mod sync;
mod table;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use api_side::{ApiSide, RETRY};
use flags::{Options, Source};
use state::Shared;
use sticky_overlay::config::Config;
use sticky_primitives::program;
use sticky_vxlan::status::{self, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command-line mistake (exit code 2).
    #[error(transparent)]
    Usage(flags::Error),
    #[error(transparent)]
    Config(#[from] sticky_overlay::Error),
    /// `--config` unreadable or not a sticky-vxlan config (the operator tools' loader).
    #[error(transparent)]
    ConfigFile(#[from] sticky_vxlan::networks::Error),
    #[error("{path}: the agent needs \"peersFile\" in the sticky-vxlan config (the file it keeps)")]
    NoPeersFile { path: PathBuf },
    #[error(transparent)]
    Endpoint(#[from] endpoint::Error),
    #[error("writing output: {0}")]
    Output(std::io::Error),
    #[error(
        "{path}: the network has \"sites\": the agent needs this node's Node name (--node-name or NODE_NAME)"
    )]
    SitesNeedNodeName { path: PathBuf },
    #[error("{path}: rotate-key needs a network with \"sites\" (docs/sites.md)")]
    NoSites { path: PathBuf },
    #[error(transparent)]
    Keys(#[from] sites::keys::Error),
    #[error("--metrics-addr {addr}: {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

fn log(msg: &str) {
    eprintln!("sticky-vxlan-agent: {msg}");
}

/// `sticky-vxlan-agent ...`: runs until killed; returns only on a mistake or a fatal error.
/// Exit codes as the tools' other verbs ([`program::main`]): 2 for a command-line mistake, 1
/// at run time.
pub fn main(args: &[String]) -> ExitCode {
    program::main("sticky-vxlan-agent", |out| {
        if args
            .iter()
            .any(|a| matches!(a.as_str(), "--help" | "-h" | "help"))
        {
            return out.write_all(flags::HELP.as_bytes()).map_err(Error::Output);
        }
        if args.first().is_some_and(|a| a == "--version") {
            let version = env!("CARGO_PKG_VERSION");
            return writeln!(out, "sticky-vxlan-agent {version}").map_err(Error::Output);
        }
        if args.first().is_some_and(|a| a == "rotate-key") {
            let r = flags::parse_rotate_key(&args[1..]).map_err(Error::Usage)?;
            let line = rotate_key(&r)?;
            return writeln!(out, "{line}").map_err(Error::Output);
        }
        flags::parse(args, |k| std::env::var(k).ok())
            .map_err(Error::Usage)
            .and_then(run)
    })
}

impl program::Failure for Error {
    fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
    fn is_usage(&self) -> bool {
        matches!(self, Error::Usage(_))
    }
}

/// `rotate-key`: a new key pair for this node's site gateway; the old private key is kept as
/// `.previous`. The running agent takes the new one at its next round, and publishes it.
fn rotate_key(r: &flags::RotateKey) -> Result<String, Error> {
    let cfg = sticky_vxlan::networks::load(&r.config)?;
    let Some(sites) = &cfg.sites else {
        return Err(Error::NoSites {
            path: r.config.clone(),
        });
    };
    let keys = sites::keys::KeyDir::new(&r.key_dir, nix::unistd::geteuid().as_raw());
    let rotated = keys.rotate(&sites::side::key_name(&sites.interface))?;
    Ok(format!(
        "new WireGuard key for {} in {}/{}: public key {} (was {}); the running agent uses and publishes it within seconds, and other sites take it from the API (until they do, their tunnels to this gateway are down)",
        sites.interface,
        r.key_dir.display(),
        sites::side::key_name(&sites.interface),
        rotated.new.public_key().to_base64(),
        rotated.previous.to_base64()
    ))
}

fn run(opts: Options) -> Result<(), Error> {
    let cfg = sticky_vxlan::networks::load(&opts.config)?;
    let peers_file = cfg.peers_file.clone().ok_or_else(|| Error::NoPeersFile {
        path: opts.config.clone(),
    })?;
    let (family, decided_by) = family::decide(cfg.local_ip, &cfg.peers, opts.underlay_family)
        .map_err(|e| Error::Usage(e.into()))?;
    let endpoint = match &opts.source {
        Source::None => None,
        Source::Kubeconfig(p) => Some(endpoint::from_kubeconfig(p)?),
        Source::Server {
            url,
            ca_file,
            token_file,
        } => Some(endpoint::from_server(
            url,
            ca_file.as_deref(),
            token_file.as_deref(),
        )?),
        Source::InCluster { host, port } => Some(endpoint::in_cluster(host, port)?),
    };
    let shared = Shared::new(Status {
        network: cfg.name.clone(),
        peers_file: peers_file.clone(),
        source: match &endpoint {
            None => "the peers file only (--no-api)".into(),
            Some(e) => format!("the Kubernetes API at {}", e.url),
        },
        peers: files::current_peers(&peers_file).map_or(0, |p| p.len()),
        pid: std::process::id(),
        ..Status::default()
    });
    if let Some(addr) = opts.metrics_addr {
        let bound =
            serve::start(addr, shared.clone()).map_err(|source| Error::Metrics { addr, source })?;
        log(&format!("serving /metrics and /healthz on {bound}"));
    }
    if let Some(every) = opts.doctor_every {
        let keep = shared.clone();
        doctor::start(opts.config.clone(), every, move |paths| {
            keep.lock().paths = Some(paths);
        });
    }
    let mut sites = match &cfg.sites {
        None => None,
        Some(s) => {
            let Some(me) = opts.node_name.as_deref() else {
                return Err(Error::SitesNeedNodeName {
                    path: opts.config.clone(),
                });
            };
            let (run, lines) = sites::run::SitesRun::start(
                &cfg,
                s,
                me,
                family,
                opts.key_dir.clone(),
                opts.wg_socket_dir.clone(),
            );
            for l in lines {
                log(&l);
            }
            Some(run)
        }
    };
    let (tx, rx) = mpsc::channel();
    files::remove_stale_temps(&peers_file);
    files::remove_stale_temps(&status::status_path(&cfg.state_dir, &cfg.name));
    let api = match endpoint {
        None => {
            log(&format!(
                "no API: watching {} for hand edits",
                peers_file.display()
            ));
            None
        }
        Some(e) => {
            log(&format!(
                "peers from the Kubernetes API at {} ({}), kept in {}; the underlay is {family} (from {decided_by})",
                e.url,
                e.proxy.as_ref().map_or("directly".to_string(), |p| format!(
                    "through the proxy {}",
                    p.shown
                )),
                peers_file.display()
            ));
            let publisher = match (&opts.node_name, opts.publish || sites.is_some()) {
                (Some(name), true) => Some((
                    publish::Publishing::new(
                        publish::Publisher {
                            node_name: name.clone(),
                            vni: cfg.vni,
                            family,
                            flannel: opts.publish,
                            public_key: None,
                            observed_endpoints: None,
                        },
                        clock::Backoff::new(),
                    ),
                    kube::Kube::new(e.clone()),
                )),
                _ => None,
            };
            let feed = sync::Feed::new(tx, opts.node_name.clone(), family);
            let feed = match sites {
                Some(_) => feed.with_sites(),
                None => feed,
            };
            let reflector = reflector::Reflector::new(
                kube::Kube::new(e),
                clock::SystemClock,
                feed,
                clock::Backoff::new(),
            )
            .with_watch_timeout(opts.watch_timeout);
            std::thread::spawn(move || reflector.run());
            let mut keeper = sync::Keeper::new(
                peers_file.clone(),
                opts.node_name.clone(),
                cfg.vni,
                guard::Guard::new(opts.max_remove_fraction),
            );
            if let Some(run) = &sites {
                keeper.sites = Some(run.shaper());
                keeper.start_from(run.cached_peers());
            }
            Some(ApiSide::new(keeper, publisher))
        }
    };
    main_loop(&opts, &cfg, &peers_file, &shared, &rx, api, sites.as_mut());
    Ok(())
}

/// How long the main loop keeps collecting a burst of updates once the first arrived.
const BURST: Duration = Duration::from_millis(10);
const MAX_BURST: Duration = Duration::from_millis(200);

/// Waits up to `poll` for the first update, then takes the whole burst.
fn take_burst(rx: &mpsc::Receiver<sync::Update>, poll: Duration) -> Vec<sync::Update> {
    let mut got = Vec::new();
    let Ok(first) = rx.recv_timeout(poll) else {
        return got;
    };
    got.push(first);
    let start = Instant::now();
    loop {
        got.extend(rx.try_iter());
        if start.elapsed() >= MAX_BURST {
            return got;
        }
        match rx.recv_timeout(BURST) {
            Ok(u) => got.push(u),
            Err(_) => return got,
        }
    }
}

/// Reconciles at once (from the file as it is: offline, that is the last good one), then
/// after every change of the peers file and every `--resync`: the main network, then each
/// `--segment-config`. A network whose reconcile failed is retried alone every 5 s (or every
/// `--resync`, if shorter). Writes the status file.
fn main_loop(
    opts: &Options,
    cfg: &Config,
    peers_file: &Path,
    shared: &Shared,
    rx: &mpsc::Receiver<sync::Update>,
    mut api: Option<ApiSide>,
    mut sites: Option<&mut sites::run::SitesRun>,
) {
    let state_dir = &cfg.state_dir;
    const POLL: Duration = Duration::from_millis(500);
    let retry = RETRY.min(opts.resync);
    let mut seen = files::fingerprint(peers_file);
    // Segments with a peers file of their own are reconciled when it changes, too.
    let segment_files: Vec<PathBuf> = opts
        .segment_configs
        .iter()
        .filter_map(|c| sticky_vxlan::networks::segment_peers_file(c))
        .filter(|f| f != peers_file)
        .collect();
    let fingerprints = |files: &[PathBuf]| files.iter().map(|f| files::fingerprint(f)).collect();
    let mut segments_seen: Vec<_> = fingerprints(&segment_files);
    // The last round of every network, and the last round of any kind.
    let mut last_full: Option<Instant> = None;
    let mut last_try: Option<Instant> = None;
    let mut outcomes = reconcile::Outcomes::new(opts.segment_configs.len());
    let mut written_status = None;
    let mut why = "start";
    loop {
        let full_due = last_full.is_none_or(|t| t.elapsed() >= opts.resync);
        let retry_due = outcomes.failing() && last_try.is_none_or(|t| t.elapsed() >= retry);
        if seen.is_none() && (!why.is_empty() || full_due) {
            // Nothing to program from yet (a first start with the API away): wait for the
            // agent's first write or an operator's file.
            if last_full.is_none() {
                log(&format!(
                    "{} does not exist yet: waiting for the API or a hand-written file",
                    peers_file.display()
                ));
            }
            last_full = Some(Instant::now());
            last_try = last_full;
        } else if !why.is_empty() || full_due || retry_due {
            let only_failed = why.is_empty() && !full_due;
            if why.is_empty() {
                why = if only_failed {
                    "retry"
                } else {
                    "periodic resync"
                };
            }
            for line in reconcile::round(
                &mut reconcile::LiveNetworks,
                &opts.config,
                &opts.segment_configs,
                only_failed,
                why,
                &mut outcomes,
                shared,
            ) {
                log(&line);
            }
            last_try = Some(Instant::now());
            if !only_failed {
                last_full = last_try;
            }
        }
        if let Some(run) = sites.as_deref_mut() {
            // What this node publishes reads the key file and the tunnel: once a round, not on
            // every pass of the loop.
            if let Some(api) = api.as_mut().filter(|_| run.round_due()) {
                api.publish_sites(run);
            }
            let (lines, replan) = sites::publish::observe(run, api.as_mut().map(|a| &mut a.keeper));
            for l in lines {
                log(&l);
            }
            if let Some(api) = api.as_mut().filter(|_| replan) {
                api.observed = true;
            }
            for line in run.round_if_due(shared) {
                log(&line);
            }
        }
        let status = {
            let mut s = shared.lock();
            s.alive = Instant::now();
            s.status.clone()
        };
        if written_status.as_ref() != Some(&status) {
            if let Err(e) = files::write_status(state_dir, &status) {
                log(&format!("status file: {e}"));
            }
            written_status = Some(status);
        }
        why = "";
        let burst = take_burst(rx, POLL);
        let told = match &mut api {
            Some(api) => {
                let told = api.apply(burst, cfg, shared);
                if let (Some(run), Some(shaped)) = (sites.as_deref_mut(), api.keeper.take_shaped())
                {
                    for line in run.adopt(shaped) {
                        log(&line);
                    }
                }
                told
            }
            None => false,
        };
        let now = files::fingerprint(peers_file);
        if now != seen || told {
            seen = now;
            let own = shared.lock().own_write == now;
            why = if own {
                "the agent wrote the peers file"
            } else {
                "the peers file was changed by hand"
            };
            if !own {
                shared.lock().status.peers =
                    files::current_peers(peers_file).map_or(0, |p| p.len());
            }
        }
        let segments_now: Vec<_> = fingerprints(&segment_files);
        if segments_now != segments_seen {
            segments_seen = segments_now;
            if why.is_empty() {
                why = "a segment's peers file changed";
            }
        }
    }
}
