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
//! [`files`] the files it writes,
//! [`reconcile`] programs the node, [`state`] and [`serve`] are the metrics, `/healthz` and the
//! status file, and [`publish`] sets flannel's annotations on the agent's own Node.

mod api;
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
            Some(ApiSide {
                keeper,
                own: None,
                publisher,
                refused_at: None,
                last_good: files::PeersCache::default(),
                observed: false,
                key_error: None,
            })
        }
    };
    main_loop(&opts, &cfg, &peers_file, &shared, &rx, api, sites.as_mut());
    Ok(())
}

/// The API's half of the main loop: the Nodes as the reflector sends them, turned into the
/// peers file; and the publisher of this node's flannel annotations.
struct ApiSide {
    keeper: sync::Keeper,
    /// This node's own Node as last seen (for what it publishes).
    own: Option<objects::Node>,
    publisher: Option<(publish::Publishing, kube::Kube)>,
    /// When the guard last refused (the change is tried again every [`RETRY`]).
    refused_at: Option<Instant>,
    /// The plugin's last-good copy of the peers file, read again only when it changed.
    last_good: files::PeersCache,
    /// What this node observes of its site changed: the plan is made again.
    observed: bool,
    /// Why this node's gateway key cannot be used, as last logged (a standing error is logged
    /// once, and again when it changes or clears).
    key_error: Option<String>,
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

/// This node's plugin's own check of a peer list ([`sticky_overlay::node::accepts_here`]).
fn plugin_accepts(
    cfg: &Config,
    list: &[sticky_overlay::peers::Peer],
) -> Result<(), table::Refusal> {
    sticky_overlay::node::accepts_here(cfg, list).map_err(|e| match e {
        sticky_overlay::Error::Peers(p) => table::Refusal::Peers(p),
        sticky_overlay::Error::Socket(e) => table::Refusal::Other(format!("netlink: {e}")),
        other => table::Refusal::Other(other.to_string()),
    })
}

impl ApiSide {
    /// Applies a burst of updates; writes the peers file when the peers changed (or a
    /// refused change is due to be tried again). True when the file was written.
    fn apply(&mut self, updates: Vec<sync::Update>, cfg: &Config, shared: &Shared) -> bool {
        let mut dirty = false;
        let mut own = None;
        for u in updates {
            match u {
                sync::Update::State(s) => {
                    if let Some(line) = sync::record_state(shared, &s) {
                        log(&line);
                    }
                }
                sync::Update::Own(n) => own = Some(n),
                u => dirty |= self.keeper.apply(u),
            }
        }
        if let Some(n) = &own {
            self.own = Some((**n).clone());
        }
        if let Some((p, kube)) = &mut self.publisher {
            if let Some(n) = own {
                p.offer(*n);
            }
            let attempt = p.run(kube, Instant::now());
            let node = &p.publisher.node_name;
            match attempt {
                publish::Attempt::Idle => {}
                publish::Attempt::Published => {
                    log(&format!("published flannel annotations on Node {node}"));
                }
                publish::Attempt::Unknown(e) => {
                    log(&format!(
                        "publishing flannel annotations: {e}; tried again when the Node changes"
                    ));
                }
                publish::Attempt::Failed { error, retry_in } => {
                    shared.lock().counters.publish_failures += 1;
                    log(&format!(
                        "publishing flannel annotations on Node {node}: {error}; trying again in {:.1} s",
                        retry_in.as_secs_f64()
                    ));
                }
            }
        }
        let accepted = self.take_accept_file(cfg, shared);
        let retry = self.refused_at.is_some_and(|t| t.elapsed() >= RETRY);
        dirty |= std::mem::take(&mut self.observed);
        if !dirty && !retry && !accepted {
            return false;
        }
        let copy = self
            .last_good
            .get(&cfg.last_good_peers_path(), |p| {
                Some(sticky_overlay::peers::last_good(p))
            })
            .unwrap_or_default()
            .to_vec();
        let held = if copy.is_empty() {
            files::current_peers(&self.keeper.peers_file).unwrap_or_default()
        } else {
            copy
        };
        let (outcome, lines) = self
            .keeper
            .write(Instant::now(), &held, |list| plugin_accepts(cfg, list));
        for l in lines {
            log(&l);
        }
        let mut s = shared.lock();
        s.status.left_out = self.keeper.left_out().len();
        let refused = match outcome {
            sync::Outcome::Written { lines, peers } => {
                for l in lines {
                    log(&l);
                }
                s.status.peers = peers;
                s.counters.file_writes += 1;
                s.own_write = files::fingerprint(&self.keeper.peers_file);
                self.refused_at = None;
                s.status.refused = None;
                return true;
            }
            sync::Outcome::Unchanged => None,
            sync::Outcome::Refused(r) => {
                s.counters.removals_refused += 1;
                Some(r)
            }
            sync::Outcome::Unusable(why) => Some(format!(
                "no peer list this node's plugin accepts can be made from the Nodes: {why}; keeping the peers file as it is"
            )),
            sync::Outcome::Failed(why) => {
                log(&why);
                None
            }
        };
        self.refused_at = refused.as_ref().map(|_| Instant::now());
        if refused != s.status.refused {
            if let Some(r) = &refused {
                log(&format!("REFUSED: {r}"));
            }
            s.status.refused = refused;
        }
        false
    }
}

impl ApiSide {
    /// The operator's `accept-changes` file, if it appeared: removed, and the change the
    /// guard refuses now accepted (said in the log and the status); with no refusal of the
    /// guard standing it accepts nothing, and the log says so. True when a change was
    /// accepted.
    fn take_accept_file(&mut self, cfg: &Config, shared: &Shared) -> bool {
        let path = accept_changes_path(cfg);
        if std::fs::symlink_metadata(&path).is_err() {
            return false;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            log(&format!("{}: {e}; it is not taken", path.display()));
            return false;
        }
        let Some(refused) = self.keeper.guard.accept(Instant::now()) else {
            log(&format!(
                "{}: the guard refuses no change, so the file accepts nothing; removed",
                path.display()
            ));
            return false;
        };
        let what = refused.what();
        log(&format!(
            "{}: the operator accepts the change the guard refused: {what}; it is written once if it comes within {} minutes",
            path.display(),
            guard::ACCEPT_FOR.as_secs() / 60
        ));
        let mut s = shared.lock();
        s.status.accepted = Some(status::Accepted {
            at: status::now_unix(),
            change: what,
        });
        true
    }
}

impl ApiSide {
    /// Keeps the key this node publishes as its gateway key file says (made when its Node is
    /// first labelled a gateway; a rotated one is taken here): when it changes, the own Node
    /// is offered to the publisher again.
    fn publish_key(&mut self, run: &mut sites::run::SitesRun) {
        let (Some(own), Some((p, _))) = (&self.own, &mut self.publisher) else {
            return;
        };
        let key = match run.public_key(own) {
            None => None,
            Some(Ok(k)) => Some(k),
            Some(Err(e)) => {
                if self.key_error.as_ref() != Some(&e) {
                    log(&format!("sites: this node's gateway key: {e}"));
                    self.key_error = Some(e);
                }
                return;
            }
        };
        if self.key_error.take().is_some() {
            log("sites: this node's gateway key is usable again");
        }
        if p.publisher.public_key != key {
            if let Some(k) = &key {
                log(&format!(
                    "sites: this node's gateway public key is {}",
                    k.to_base64()
                ));
            }
            p.publisher.public_key = key;
            p.offer(own.clone());
            run.key_changed();
        } else if let Some(line) = key.and_then(|k| run.confirm_published(own, &k)) {
            log(&line);
        }
    }
}

impl ApiSide {
    /// Keeps the NAT discovery annotation this node publishes as its tunnel shows it: when it
    /// changes, the own Node is offered to the publisher again (patched only if it differs).
    fn publish_observed(&mut self, run: &sites::run::SitesRun) {
        let (Some(own), Some((p, _))) = (&self.own, &mut self.publisher) else {
            return;
        };
        let now = run.observed_endpoints();
        if now.is_some() && p.publisher.observed_endpoints != now {
            log(&format!(
                "sites: peers behind NAT come from {}",
                now.as_deref().unwrap_or_default()
            ));
            p.publisher.observed_endpoints = now;
            p.offer(own.clone());
        }
    }
}

/// Takes what the probes saw: when it changed, the plan is made again in one place, the
/// keeper's (with the Nodes it holds, API or not), or from the cache when it has none yet.
fn observe(run: &mut sites::run::SitesRun, api: Option<&mut ApiSide>) {
    let (seen, lines) = run.observe();
    for l in lines {
        log(&l);
    }
    let Some(seen) = seen else {
        return;
    };
    match api {
        Some(api) if api.keeper.listed() => {
            if let Some(shaper) = &mut api.keeper.sites {
                shaper.observation = seen;
            }
            api.observed = true;
        }
        _ => {
            for l in run.recompute() {
                log(&l);
            }
        }
    }
}

/// The file whose existence accepts the change the guard refuses, once.
fn accept_changes_path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(format!("{}.accept-changes", cfg.name))
}

/// A refused change is tried again this often (the window may have passed).
const RETRY: Duration = Duration::from_secs(5);

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
                api.publish_key(run);
                api.publish_observed(run);
            }
            observe(run, api.as_mut());
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
