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
//! [`flags`] is the command line, [`endpoint`] finds the API and its credentials, [`api`] is
//! what the agent asks of the API (a trait), [`kube`] its HTTP implementation, [`objects`] the
//! typed subset of the Node object, [`reflector`] the list/watch state machine over the
//! [`api`] and [`clock`] traits, [`mapping`] turns nodes into peers and guards removals,
//! [`sync`] keeps the nodes and writes the peers file, [`files`] the files it writes,
//! [`reconcile`] programs the node, [`state`] and [`serve`] are the metrics, `/healthz` and the
//! status file, and [`publish`] sets flannel's annotations on the agent's own Node.

pub mod api;
pub mod clock;
pub mod endpoint;
pub mod files;
pub mod flags;
pub mod kube;
pub mod mapping;
pub mod objects;
pub mod publish;
pub mod reconcile;
pub mod reflector;
pub mod serve;
pub mod state;
pub mod sync;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flags::{Options, Source};
use state::{Shared, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command-line mistake (exit code 2).
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Config(#[from] crate::vxlan::Error),
    /// `--config` unreadable or not a sticky-vxlan config (the operator tools' loader).
    #[error(transparent)]
    ConfigFile(#[from] crate::vxlan::cli::CliError),
    #[error("{path}: the agent needs \"peersFile\" in the sticky-vxlan config (the file it keeps)")]
    NoPeersFile { path: PathBuf },
    #[error(transparent)]
    Endpoint(#[from] endpoint::Error),
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
/// Exit codes as the tools' other verbs: 2 for a command-line mistake, 1 at run time.
pub fn main(args: &[String]) -> ExitCode {
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "--help" | "-h" | "help"))
    {
        print!("{}", flags::HELP);
        return ExitCode::SUCCESS;
    }
    let result = flags::parse(args, |k| std::env::var(k).ok())
        .map_err(Error::Usage)
        .and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Usage(e)) => {
            eprintln!("sticky-vxlan-agent: {e}\nRun `sticky-vxlan-agent --help` for the options.");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("sticky-vxlan-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: Options) -> Result<(), Error> {
    let cfg = crate::vxlan::cli::load(&opts.config)?;
    let peers_file = cfg.peers_file.clone().ok_or_else(|| Error::NoPeersFile {
        path: opts.config.clone(),
    })?;
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
    let (tx, rx) = mpsc::channel();
    match endpoint {
        None => log(&format!(
            "no API: watching {} for hand edits",
            peers_file.display()
        )),
        Some(e) => {
            log(&format!(
                "peers from the Kubernetes API at {}, kept in {}",
                e.url,
                peers_file.display()
            ));
            let publisher = match (&opts.node_name, opts.publish) {
                (Some(name), true) => Some((
                    publish::Publisher {
                        node_name: name.clone(),
                        vni: cfg.vni,
                    },
                    kube::Kube::new(e.clone()),
                )),
                _ => None,
            };
            let sync = sync::NodeSync::new(
                peers_file.clone(),
                opts.max_remove_fraction,
                shared.clone(),
                tx,
                publisher,
            );
            let reflector = reflector::Reflector::new(
                kube::Kube::new(e),
                clock::SystemClock,
                sync,
                clock::Backoff::new(),
            );
            std::thread::spawn(move || reflector.run());
        }
    }
    main_loop(&opts, &cfg.state_dir, &peers_file, &shared, &rx);
    Ok(())
}

/// Reconciles at once (from the file as it is: offline, that is the last good one), then
/// after every change of the peers file and every `--resync`: the main network, then each
/// `--segment-config`. A network whose reconcile failed is retried alone every 5 s (or every
/// `--resync`, if shorter). Writes the status file.
fn main_loop(
    opts: &Options,
    state_dir: &Path,
    peers_file: &Path,
    shared: &Shared,
    rx: &mpsc::Receiver<()>,
) {
    const POLL: Duration = Duration::from_millis(500);
    const RETRY: Duration = Duration::from_secs(5);
    let retry = RETRY.min(opts.resync);
    let mut seen = files::fingerprint(peers_file);
    // Segments with a peers file of their own are reconciled when it changes, too.
    let segment_files: Vec<PathBuf> = opts
        .segment_configs
        .iter()
        .filter_map(|c| crate::vxlan::cli::segment_peers_file(c))
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
                &mut reconcile::Live,
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
        let told = rx.recv_timeout(POLL).is_ok();
        while rx.try_recv().is_ok() {}
        let now = files::fingerprint(peers_file);
        if now != seen || told {
            seen = now;
            let own = shared.lock().own_write == now;
            why = if own {
                "the agent wrote the peers file"
            } else {
                "the peers file was changed by hand"
            };
            shared.lock().status.peers = files::current_peers(peers_file).map_or(0, |p| p.len());
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
