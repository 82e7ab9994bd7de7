//! The operator's tool: `sticky-ipam` run without `CNI_COMMAND`.
//!
//! An operator on an edge node needs to see what the plugin holds and fix it without a
//! control plane. Every verb opens the network's data dir through [`DiskStore`], so it holds
//! the plugin's `flock` for its whole run: it never sees half of an ADD and never corrupts
//! state when run alongside ADD/DEL. Verbs that only look (`list`, `show`, `gc --dry-run`)
//! open it read-only ([`DiskStore::open_read_only`]: a shared lock, no `lock` created, temp
//! files left alone, works on a read-only filesystem) and work on a [`dryrun::DryRun`]
//! overlay, so not even crash leftovers are resolved behind the operator's back.
//!
//! One verb per file: [`list`], [`show`], [`forget`] (deprecated alias `release`), [`gc`],
//! [`downgrade`]. [`entry`] turns
//! record files into rows; [`args`] is the parser. Exit codes: see [`EXIT_CODES`].

pub mod args;
pub mod downgrade;
pub mod dryrun;
pub mod entry;
pub mod forget;
pub mod gc;
pub mod list;
pub mod show;

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::allocator::AllocError;
use crate::config::{ConfigError, DEFAULT_DATA_DIR, IpamConfig};
use crate::disk::DiskStore;
use crate::identity::Pod;
use crate::store::StoreError;
use cni_protocol::conflist;
use cni_protocol::netconf::is_network_name;
use cni_protocol::{Args, NetConf};
use sticky_primitives::program;

/// Success.
pub const EXIT_OK: u8 = 0;
/// Runtime error: the data dir or a file could not be read or written.
pub const EXIT_RUNTIME: u8 = 1;
/// Usage error: unknown verb or option, missing argument, unusable `--config`.
pub const EXIT_USAGE: u8 = 2;
/// Refused: `forget` of an attached lease without `--force`, `downgrade` with leases or
/// markers left and no `--drop-leases`. Nothing was changed.
pub(crate) const EXIT_REFUSED: u8 = 3;
/// Not found: the pod has no records, or the network has no data dir.
pub(crate) const EXIT_NOT_FOUND: u8 = 4;

pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  runtime error (data dir or file unreadable/unwritable)
  2  usage error (unknown verb or option, missing argument, bad --config)
  3  refused, nothing changed (forget of an attached lease without --force;
     downgrade with released leases or markers left and no --drop-leases)
  4  not found (the pod has no records; the network has no data dir)";

const HELP: &str = "\
sticky-ipam — host-local compatible IPAM with sticky per-pod leases.

Run by a container runtime with CNI_COMMAND set, it is a CNI plugin. Run without
CNI_COMMAND, it is the operator's tool:

Usage: sticky-ipam [global options] <command> [options]

Commands:
  list        every record of a network (or of all networks)
  show        one pod's records and what its next ADD would get
  forget      delete a pod's records (its leases): its addresses become free
              (`release` is a deprecated alias, removed in the next release)
  gc          what expiry and the boot sweep would free (--dry-run)
  downgrade   rewrite a network's data dir into host-local's layout

Global options:
  --data-dir <dir>   the data dir (default /var/lib/cni/networks)
  --network <name>   the network (a directory under the data dir); optional when the
                     data dir holds only one network, and for list
  --config <file>    a .conf or .conflist: network name, data dir, ranges and leaseHold
                     from the plugin whose type or ipam.type is sticky-ipam
  -h, --help         this help (or `sticky-ipam <command> --help`)
  -V, --version      the version

Every command takes the data dir's lock, as the plugin does: it is safe to run while
pods start and stop.
";

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("unknown command {0:?} (expected list, show, forget, gc or downgrade)")]
    UnknownVerb(String),
    #[error("no command given (expected list, show, forget, gc or downgrade)")]
    NoVerb,
    #[error(transparent)]
    Args(#[from] sticky_primitives::args::ArgsError),
    #[error("{0:?} is not a pod: expected <namespace>/<pod>, /<name> or <name>")]
    BadPod(String),
    #[error("{0:?} is not a valid network name")]
    BadNetwork(String),
    #[error("--network {given:?} does not match the name {in_config:?} in --config")]
    NetworkMismatch { given: String, in_config: String },
    #[error("{data_dir} holds {count} networks ({names}): choose one with --network or --config")]
    WhichNetwork {
        data_dir: PathBuf,
        count: usize,
        names: String,
    },
    #[error(
        "`gc` only previews (--dry-run): a real GC needs the runtime's list of live attachments, which only CNI GC carries"
    )]
    GcNeedsDryRun,
    #[error("--config {0}")]
    Conflist(#[from] conflist::ConflistError),
    #[error("--config {path}: this node's ranges: {reason}")]
    NodeRanges { path: PathBuf, reason: String },
    #[error("--config {path}: {source}")]
    Config { path: PathBuf, source: ConfigError },
    #[error("listing {path}: {source}")]
    ListDataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("network {network:?} has no data dir under {data_dir}")]
    NoNetwork { network: String, data_dir: PathBuf },
    #[error("no network under {0}")]
    NoNetworks(PathBuf),
    #[error("data dir {0} does not exist (a wrong --data-dir, or no pod ever started here)")]
    NoDataDir(PathBuf),
    #[error("{pod} has no records in network {network:?}")]
    NoRecords { pod: String, network: String },
    #[error("refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Store(_)
            | CliError::Alloc(_)
            | CliError::Output(_)
            | CliError::ListDataDir { .. } => EXIT_RUNTIME,
            CliError::Refused(_) => EXIT_REFUSED,
            CliError::NoNetwork { .. }
            | CliError::NoNetworks(_)
            | CliError::NoDataDir(_)
            | CliError::NoRecords { .. } => EXIT_NOT_FOUND,
            _ => EXIT_USAGE,
        }
    }
}

/// The tool's entry point: `args` without the program name ([`program::main`]).
pub fn main(args: Vec<String>) -> ExitCode {
    program::main("sticky-ipam", |out| run(&args, out))
}

impl program::Failure for CliError {
    fn exit_code(&self) -> u8 {
        CliError::exit_code(self)
    }
    fn is_usage(&self) -> bool {
        CliError::exit_code(self) == EXIT_USAGE
    }
}

/// Runs one command line, printing to `out`.
pub fn run(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let before_dashes = args.iter().take_while(|a| *a != "--");
    let help = before_dashes.clone().any(|a| a == "--help" || a == "-h");
    let version = before_dashes.clone().any(|a| a == "--version" || a == "-V");
    let verb = args::find_verb(args);
    if help {
        let text = match verb {
            None => HELP,
            Some(v) => verb_help(v).ok_or_else(|| CliError::UnknownVerb(v.to_string()))?,
        };
        writeln!(out, "{text}\n{EXIT_CODES}")?;
        return Ok(());
    }
    if version {
        writeln!(out, "sticky-ipam {}", env!("CARGO_PKG_VERSION"))?;
        return Ok(());
    }
    match verb {
        Some("list") => list::run(args, out),
        Some("show") => show::run(args, out),
        Some("forget") => forget::run(args, out, false),
        Some("release") => forget::run(args, out, true),
        Some("gc") => gc::run(args, out),
        Some("downgrade") => downgrade::run(args, out),
        Some(other) => Err(CliError::UnknownVerb(other.to_string())),
        None => Err(CliError::NoVerb),
    }
}

fn verb_help(verb: &str) -> Option<&'static str> {
    Some(match verb {
        "list" => list::HELP,
        "show" => show::HELP,
        "forget" | "release" => forget::HELP,
        "gc" => gc::HELP,
        "downgrade" => downgrade::HELP,
        _ => return None,
    })
}

/// Where a command works: the data dir, the network, and the config when one was given.
#[derive(Debug, Clone)]
pub struct Target {
    pub data_dir: PathBuf,
    pub network: Option<String>,
    pub config: Option<IpamConfig>,
}

impl Target {
    /// From the global options of a parsed command line.
    pub(crate) fn from_args(parsed: &args::Parsed) -> Result<Target, CliError> {
        let config = parsed
            .value("--config")
            .map(Path::new)
            .map(load_config)
            .transpose()?;
        let network = match (parsed.value("--network"), &config) {
            (Some(given), Some(c)) if given != c.network => {
                return Err(CliError::NetworkMismatch {
                    given: given.to_string(),
                    in_config: c.network.clone(),
                });
            }
            (Some(given), _) => Some(given.to_string()),
            (None, Some(c)) => Some(c.network.clone()),
            (None, None) => None,
        };
        if let Some(n) = &network
            && !is_network_name(n)
        {
            return Err(CliError::BadNetwork(n.clone()));
        }
        let data_dir = match (parsed.value("--data-dir"), &config) {
            (Some(d), _) => PathBuf::from(d),
            (None, Some(c)) => c.data_dir.clone(),
            (None, None) => PathBuf::from(DEFAULT_DATA_DIR),
        };
        Ok(Target {
            data_dir,
            network,
            config,
        })
    }

    /// The chosen network, or every network under the data dir, sorted.
    pub fn networks(&self) -> Result<Vec<String>, CliError> {
        if let Some(n) = &self.network {
            return Ok(vec![n.clone()]);
        }
        let list_err = |source| CliError::ListDataDir {
            path: self.data_dir.clone(),
            source,
        };
        let entries = match fs::read_dir(&self.data_dir) {
            Ok(entries) => entries,
            // Not an empty data dir: a wrong --data-dir, or a node that never ran a pod.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(CliError::NoDataDir(self.data_dir.clone()));
            }
            Err(e) => return Err(list_err(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_err)?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if entry.file_type().map_err(list_err)?.is_dir() && is_network_name(&name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// The one network a command works on: the chosen one, or the only one there is.
    pub fn network(&self) -> Result<String, CliError> {
        let mut names = self.networks()?;
        match names.len() {
            1 => Ok(names.remove(0)),
            0 => Err(CliError::NoNetworks(self.data_dir.clone())),
            count => Err(CliError::WhichNetwork {
                data_dir: self.data_dir.clone(),
                count,
                names: names.join(", "),
            }),
        }
    }

    /// Locks the network's data dir for writing; a missing one is "not found".
    pub fn open(&self, network: &str) -> Result<DiskStore, CliError> {
        let store = DiskStore::open_if_present(&self.data_dir.join(network))?;
        store.ok_or_else(|| self.no_network(network))
    }

    /// Opens the network's data dir only to look (nothing is written, not even `lock`); a
    /// missing one is "not found".
    pub(crate) fn open_read_only(&self, network: &str) -> Result<DiskStore, CliError> {
        let store = DiskStore::open_read_only(&self.data_dir.join(network))?;
        store.ok_or_else(|| self.no_network(network))
    }

    fn no_network(&self, network: &str) -> CliError {
        CliError::NoNetwork {
            network: network.to_string(),
            data_dir: self.data_dir.clone(),
        }
    }
}

/// Reads a `.conf` or `.conflist` ([`cni_protocol::conflist`]) and the ipam section of its
/// sticky-ipam plugin. A sticky-vxlan entry whose ipam section names no range (the cluster
/// conflist) gets this node's ranges from the peers, as the plugin fills them in
/// ([`node_ranges`]).
pub(crate) fn load_config(path: &Path) -> Result<IpamConfig, CliError> {
    let is_sticky = |v: Option<&Value>| v.and_then(Value::as_str) == Some("sticky-ipam");
    let loaded = conflist::load(
        path,
        sticky_primitives::nofollow::read_regular,
        "with type or ipam.type \"sticky-ipam\"",
        |p| is_sticky(p.get("type")) || is_sticky(p.pointer("/ipam/type")),
    )?;
    let conf = match conflist::has_type(&loaded.entry, "sticky-vxlan") {
        true => match node_ranges(&loaded.entry, &loaded.conf.name) {
            Ok(Some(filled)) => {
                NetConf::parse(filled.to_string().as_bytes()).map_err(|source| {
                    conflist::ConflistError::Invalid {
                        path: path.to_path_buf(),
                        source,
                    }
                })?
            }
            Ok(None) => loaded.conf,
            Err(reason) => {
                return Err(CliError::NodeRanges {
                    path: path.to_path_buf(),
                    reason,
                });
            }
        },
        false => loaded.conf,
    };
    IpamConfig::from_netconf(&conf, &Args::default()).map_err(|source| CliError::Config {
        path: path.to_path_buf(),
        source,
    })
}

/// `entry` (a sticky-vxlan plugin entry) with this node's ranges filled in as the plugin
/// fills them in, `None` when it names its ranges. The peers are sticky-vxlan's to read (and
/// finding this host's addresses takes netlink, which sticky-ipam does not link), so this
/// asks `sticky-vxlan node-ranges <network>`, from this binary's directory (they are
/// installed together) or `$PATH`. Its warnings pass through; its error is the reason.
fn node_ranges(entry: &Value, network: &str) -> Result<Option<Value>, String> {
    const VXLAN: &str = "sticky-vxlan";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(VXLAN)))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| VXLAN.into());
    let running = |e: std::io::Error| format!("running {}: {e}", program.display());
    let mut child = std::process::Command::new(&program)
        .args(["node-ranges", network])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(running)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(entry.to_string().as_bytes())
            .map_err(running)?;
    }
    let out = child.wait_with_output().map_err(running)?;
    let told = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let told = told.trim();
        return Err(told
            .strip_prefix("sticky-vxlan: ")
            .unwrap_or(told)
            .to_string());
    }
    eprint!("{told}");
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&out.stdout).map(Some).map_err(|e| {
        format!(
            "{} {} printed no JSON: {e}",
            program.display(),
            "node-ranges"
        )
    })
}

/// `<namespace>/<pod>`, `/<name>` or `<name>` (podman: no namespace).
pub(crate) fn parse_pod(text: &str) -> Result<Pod, CliError> {
    let (namespace, name) = text.split_once('/').unwrap_or(("", text));
    if name.is_empty() || name.contains('/') {
        return Err(CliError::BadPod(text.to_string()));
    }
    Ok(Pod {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: String::new(),
    })
}

/// How a pod is printed: `ns/name`, or `name` without a namespace.
pub(crate) fn pod_text(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

/// Writes a JSON value, pretty, and a newline.
pub(crate) fn write_json(out: &mut dyn Write, value: &Value) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    writeln!(out, "{text}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods() {
        let p = parse_pod("ns/web").unwrap();
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "web"));
        let p = parse_pod("/happy_turing").unwrap();
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str()),
            ("", "happy_turing")
        );
        assert_eq!(parse_pod("happy_turing").unwrap().name, "happy_turing");
        for bad in ["", "ns/", "a/b/c"] {
            assert!(
                parse_pod(bad)
                    .unwrap_err()
                    .to_string()
                    .contains(&format!("{bad:?}")),
                "{bad}"
            );
        }
    }

    #[test]
    fn help_version_and_usage_errors() {
        let run_text = |list: &[&str]| {
            let args: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            let mut out = Vec::new();
            let r = run(&args, &mut out);
            (
                r.map_err(|e| e.exit_code()),
                String::from_utf8(out).unwrap(),
            )
        };
        let (r, text) = run_text(&["--help"]);
        assert!(r.is_ok() && text.contains("Exit codes:") && text.contains("downgrade"));
        let (r, text) = run_text(&["release", "--help"]);
        assert!(r.is_ok() && text.contains("--force"), "{text}");
        let (r, text) = run_text(&["--version"]);
        assert!(r.is_ok() && text.starts_with("sticky-ipam "));
        assert_eq!(run_text(&["frobnicate"]).0, Err(EXIT_USAGE));
        assert_eq!(run_text(&[]).0, Err(EXIT_USAGE));
        assert_eq!(run_text(&["gc"]).0, Err(EXIT_USAGE));
    }
}
