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
mod placement;
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
use sticky_vxlan::main_mode::change::FileChange;
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
    let endpoint = find_endpoint(&opts.source)?;
    let shared = start_status(&opts, &cfg, &peers_file, endpoint.as_ref())?;
    let mut sites = start_sites(&opts, &cfg, family)?;
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
            let publisher = publisher(&opts, &cfg, family, sites.is_some(), &e);
            start_reflector(&opts, family, sites.is_some(), e, tx);
            let keeper = keeper(&opts, &cfg, &peers_file, sites.as_ref());
            Some(ApiSide::new(keeper, publisher))
        }
    };
    main_loop(&opts, &cfg, &peers_file, &shared, &rx, api, sites.as_mut());
    Ok(())
}

/// The API server the options name, with its credentials; `None` with `--no-api`.
fn find_endpoint(source: &Source) -> Result<Option<endpoint::Endpoint>, Error> {
    Ok(match source {
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
    })
}

/// The status the metrics, `/healthz` and the status file show, and the threads that serve
/// and fill it: the metrics server (`--metrics-addr`) and the doctor (`--doctor-every`).
fn start_status(
    opts: &Options,
    cfg: &Config,
    peers_file: &Path,
    endpoint: Option<&endpoint::Endpoint>,
) -> Result<Shared, Error> {
    let shared = Shared::new(Status {
        network: cfg.name.clone(),
        peers_file: peers_file.to_path_buf(),
        source: match endpoint {
            None => "the peers file only (--no-api)".into(),
            Some(e) => format!("the Kubernetes API at {}", e.url),
        },
        peers: files::current_peers(peers_file).map_or(0, |p| p.len()),
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
    Ok(shared)
}

/// The sites run when the network has `"sites"` (from its cache, if any); it needs this
/// node's Node name.
fn start_sites(
    opts: &Options,
    cfg: &Config,
    family: family::Family,
) -> Result<Option<sites::run::SitesRun>, Error> {
    let Some(s) = &cfg.sites else {
        return Ok(None);
    };
    let Some(me) = opts.node_name.as_deref() else {
        return Err(Error::SitesNeedNodeName {
            path: opts.config.clone(),
        });
    };
    let (run, lines) = sites::run::SitesRun::start(
        cfg,
        s,
        me,
        family,
        opts.key_dir.clone(),
        opts.wg_socket_dir.clone(),
    );
    for l in lines {
        log(&l);
    }
    Ok(Some(run))
}

/// The publisher of this node's annotations on its own Node: with its Node name, when it
/// publishes flannel's (`--publish-flannel-annotations`) or the network has sites.
fn publisher(
    opts: &Options,
    cfg: &Config,
    family: family::Family,
    sites: bool,
    e: &endpoint::Endpoint,
) -> Option<(publish::Publishing, kube::Kube)> {
    let name = opts.node_name.as_ref().filter(|_| opts.publish || sites)?;
    Some((
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
    ))
}

/// The reflector's thread: it lists and watches the Nodes at `e` and sends them on `tx`.
fn start_reflector(
    opts: &Options,
    family: family::Family,
    sites: bool,
    e: endpoint::Endpoint,
    tx: mpsc::Sender<sync::Update>,
) {
    let kube = kube::Kube::new(e).with_max_nodes(opts.max_nodes);
    let feed = sync::Feed::new(tx, opts.node_name.clone(), family)
        .with_max_nodes(opts.max_nodes)
        .with_hurry(kube.hurry());
    let feed = if sites { feed.with_sites() } else { feed };
    let reflector =
        reflector::Reflector::new(kube, clock::SystemClock, feed, clock::Backoff::new())
            .with_watch_timeout(opts.watch_timeout)
            .with_max_nodes(opts.max_nodes);
    std::thread::spawn(move || reflector.run());
}

/// The keeper of the peers file, behind the guard; with sites, it plans as the sites run
/// does and starts from the peers the cache gives.
fn keeper(
    opts: &Options,
    cfg: &Config,
    peers_file: &Path,
    sites: Option<&sites::run::SitesRun>,
) -> sync::Keeper {
    let mut keeper = sync::Keeper::new(
        peers_file.to_path_buf(),
        opts.node_name.clone(),
        cfg.vni,
        guard::Guard::new(opts.max_remove_fraction),
    );
    if let Some(run) = sites {
        keeper.sites = true;
        keeper.start_from(run.cached_peers());
    }
    keeper
}

/// How long the main loop keeps collecting a burst of updates once the first arrived.
const BURST: Duration = Duration::from_millis(20);
const MAX_BURST: Duration = Duration::from_millis(200);
// After a read that brought a change the watch's socket is read again within `WINDOW`: a
// second event the API sent just after a first reaches the burst within it, so that window must
// stay well inside the burst window.
const _: () = assert!(kube::paced::WINDOW.as_millis() * 2 <= BURST.as_millis());

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

/// How long the main loop waits for the reflector's updates before it looks again.
const POLL: Duration = Duration::from_millis(500);

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
    let mut rounds = Rounds::new(opts, peers_file);
    loop {
        rounds.reconcile_if_due(opts, peers_file, shared);
        if let Some(run) = sites.as_deref_mut() {
            sites_pass(run, api.as_mut(), shared);
        }
        rounds.write_status(&cfg.state_dir, shared);
        // Never wait past the next sites round: a punched path's death is read within a round
        // of it, and rounds run every second (`sites::side::period`).
        let wait = sites.as_deref().map_or(POLL, |r| r.until_round().min(POLL));
        let burst = take_burst(rx, wait);
        let told = match &mut api {
            Some(api) => apply_burst(api, sites.as_deref_mut(), burst, cfg, shared),
            None => false,
        };
        let change = api.as_mut().and_then(|a| a.change.take());
        rounds.note_changes(peers_file, told, change, shared);
    }
}

/// The sites part of a pass: once a round, what this node publishes (it reads the key file
/// and the tunnel: not on every pass); what the probes saw; the round when due.
fn sites_pass(run: &mut sites::run::SitesRun, mut api: Option<&mut ApiSide>, shared: &Shared) {
    if let Some(api) = api.as_deref_mut().filter(|_| run.round_due()) {
        api.publish_sites(run);
    }
    let keeper = api.as_deref_mut().map(|a| &mut a.keeper);
    let (lines, replan) = sites::publish::observe(run, keeper);
    for l in lines {
        log(&l);
    }
    if let Some(api) = api.filter(|_| replan) {
        api.observed = true;
    }
    for line in run.round_if_due(shared) {
        log(&line);
    }
}

/// Applies a burst of the reflector's updates (the peers file written when its peers
/// changed), then hands the plan the keeper made to the sites run. True when the file was
/// written.
fn apply_burst(
    api: &mut ApiSide,
    sites: Option<&mut sites::run::SitesRun>,
    burst: Vec<sync::Update>,
    cfg: &Config,
    shared: &Shared,
) -> bool {
    let shaper = sites.as_deref().map(sites::run::SitesRun::shaper);
    let told = api.apply(burst, cfg, shared, shaper);
    if let (Some(run), Some(shaped)) = (sites, api.keeper.take_shaped()) {
        for line in run.adopt(shaped) {
            log(&line);
        }
    }
    told
}

/// What the main loop keeps between passes: the peers files as last seen, when the networks
/// were last reconciled and how that went, the status last written, and why the next round
/// is due (empty: only if the resync or a retry is).
struct Rounds {
    retry: Duration,
    resync: Duration,
    seen: Option<files::Fingerprint>,
    /// Segments with a peers file of their own are reconciled when it changes, too.
    segment_files: Vec<PathBuf>,
    segments_seen: Vec<Option<files::Fingerprint>>,
    /// The last round of every network, and the last round of any kind.
    last_full: Option<Instant>,
    /// What the last periodic resync took: it spaces the resyncs ([`reconcile::resync_every`]).
    full_took: Duration,
    last_try: Option<Instant>,
    outcomes: reconcile::Outcomes,
    written_status: Option<Status>,
    why: &'static str,
    /// The agent's write of the peers file that the next round programs, as a change.
    change: Option<Box<FileChange>>,
}

impl Rounds {
    fn new(opts: &Options, peers_file: &Path) -> Self {
        let segment_files: Vec<PathBuf> = opts
            .segment_configs
            .iter()
            .filter_map(|c| sticky_vxlan::networks::segment_peers_file(c))
            .filter(|f| f != peers_file)
            .collect();
        Self {
            retry: RETRY.min(opts.resync),
            resync: opts.resync,
            seen: files::fingerprint(peers_file),
            segments_seen: fingerprints(&segment_files),
            segment_files,
            last_full: None,
            full_took: Duration::ZERO,
            last_try: None,
            outcomes: reconcile::Outcomes::new(opts.segment_configs.len()),
            written_status: None,
            why: "start",
            change: None,
        }
    }

    /// A round when one is due: for a reason, the periodic resync, or a retry of the networks
    /// that failed; none while there is no peers file to program from.
    fn reconcile_if_due(&mut self, opts: &Options, peers_file: &Path, shared: &Shared) {
        let every = reconcile::resync_every(self.resync, self.full_took);
        let full_due = self.last_full.is_none_or(|t| t.elapsed() >= every);
        let retry_due =
            self.outcomes.failing() && self.last_try.is_none_or(|t| t.elapsed() >= self.retry);
        if self.seen.is_none() && (!self.why.is_empty() || full_due) {
            // Nothing to program from yet (a first start with the API away): wait for the
            // agent's first write or an operator's file.
            if self.last_full.is_none() {
                log(&format!(
                    "{} does not exist yet: waiting for the API or a hand-written file",
                    peers_file.display()
                ));
            }
            self.last_full = Some(Instant::now());
            self.last_try = self.last_full;
        } else if !self.why.is_empty() || full_due || retry_due {
            let only_failed = self.why.is_empty() && !full_due;
            // Only a resync's own cost spaces the resyncs (a first programming costs more).
            let periodic = self.why.is_empty() && full_due;
            if self.why.is_empty() {
                self.why = if only_failed {
                    "retry"
                } else {
                    "periodic resync"
                };
            }
            // The agent's own write, since the last round, is programmed as a change; the
            // periodic resync and anything else, in full.
            let change = self.change.take().filter(|_| !full_due && !only_failed);
            let started = Instant::now();
            for line in reconcile::round(
                &mut reconcile::LiveNetworks,
                reconcile::Main {
                    config: &opts.config,
                    change: change.as_deref(),
                },
                &opts.segment_configs,
                only_failed,
                self.why,
                &mut self.outcomes,
                shared,
            ) {
                log(&line);
            }
            self.last_try = Some(Instant::now());
            // A change programmed as one is no resync: a steady stream of them must not put
            // off the next (drift is repaired only by a full reconcile).
            if !only_failed && change.is_none() {
                self.last_full = self.last_try;
            }
            if periodic {
                self.full_took = started.elapsed();
                let next = reconcile::resync_every(self.resync, self.full_took);
                if next > self.resync {
                    log(&format!(
                        "the periodic resync took {:.2} s: the next in {:.0} s, not {:.1} s (a \
                         resync takes at most 1/{} of the node's time)",
                        self.full_took.as_secs_f64(),
                        next.as_secs_f64(),
                        self.resync.as_secs_f64(),
                        reconcile::RESYNC_SHARE
                    ));
                }
            }
        }
    }

    /// Marks the loop alive and writes the status file when the status changed.
    fn write_status(&mut self, state_dir: &Path, shared: &Shared) {
        // Cloned only when it changed: a hub's status holds thousands of sites.
        let status = {
            let mut s = shared.lock();
            s.alive = Instant::now();
            (self.written_status.as_ref() != Some(&s.status)).then(|| s.status.clone())
        };
        if let Some(status) = status {
            if let Err(e) = files::write_status(state_dir, &status) {
                log(&format!("status file: {e}"));
            }
            self.written_status = Some(status);
        }
    }

    /// Why the next round is due: the agent wrote the peers file (`told`, and `change`: what
    /// it wrote, to program as a change), someone changed it by hand, or a segment's peers
    /// file changed; none of those, no reason.
    fn note_changes(
        &mut self,
        peers_file: &Path,
        told: bool,
        change: Option<Box<FileChange>>,
        shared: &Shared,
    ) {
        self.why = "";
        self.change = None;
        let now = files::fingerprint(peers_file);
        if now != self.seen || told {
            self.seen = now;
            let own = shared.lock().own_write == now;
            self.change = change.filter(|_| own);
            self.why = if own {
                "the agent wrote the peers file"
            } else {
                "the peers file was changed by hand"
            };
            if !own {
                shared.lock().status.peers =
                    files::current_peers(peers_file).map_or(0, |p| p.len());
            }
        }
        let segments_now = fingerprints(&self.segment_files);
        if segments_now != self.segments_seen {
            self.segments_seen = segments_now;
            if self.why.is_empty() {
                self.why = "a segment's peers file changed";
            }
        }
    }
}

fn fingerprints(files: &[PathBuf]) -> Vec<Option<files::Fingerprint>> {
    files.iter().map(|f| files::fingerprint(f)).collect()
}
