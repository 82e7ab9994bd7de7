//! The operator's entry points (run without `CNI_COMMAND`): `mac`, `reconcile`, `show`,
//! `doctor` ([`crate::doctor`]).
//!
//! The convention of both tools ([`crate::cli`]): one parser that refuses what a verb does not
//! take, one conflist loader, this module's own [`CliError`], and the exit codes in
//! [`EXIT_CODES`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::{networks, node_ranges};
use sticky_netlink::link::format_mac;
use sticky_netlink::{Socket, addr, link, neigh, route};
use sticky_overlay::config;
use sticky_overlay::mac::vtep_mac;
use sticky_overlay::{Error, ROUTE_PROTOCOL, pod};
use sticky_primitives::args::{ArgsError, Spec, find_verb, parse};
use sticky_primitives::program;

pub const HELP: &str = "\
sticky-vxlan: CNI plugin for a VXLAN overlay whose VTEP MAC never changes.

Run by a container runtime with CNI_COMMAND set, it is a CNI plugin (ADD, DEL, CHECK, GC,
STATUS, VERSION). Run by hand:

  sticky-vxlan mac --local <underlay IPv4 or IPv6> --vni <n>
      print the kept VTEP MAC of a node (to annotate flannel nodes, or to check a peer)
  sticky-vxlan reconcile --config <file.conflist|file.conf> [--config <file> ...]
      create/repair the VTEP and bridge and program the peers, without a pod
      (for a boot-time unit, before kubelet starts); a segment network's file
      restores that segment. Several --config are reconciled in turn: one that
      fails is reported and the others are still reconciled
  sticky-vxlan show [--config <file.conflist|file.conf> | --state-dir /run/sticky-vxlan]
      print every VXLAN device of this namespace, its MAC, the programmed peers,
      the pods attached by sticky-vxlan, and where the agent got the peers from
      (and its sites); the agent's status is read from the network's stateDir,
      which --config finds in the network's config
  sticky-vxlan doctor --config <file.conflist|file.conf> [--json]
      probe every peer of the network from this node (underlay, through the overlay,
      at the pod MTU) and name why pods cannot talk, with the fix: one line a peer.
      Exit 0: no cause found; 1: a cause found; 2: it could not run (why on stderr).
      Changes nothing on the node
  sticky-vxlan-agent --config <file.conflist> ...   (see sticky-vxlan-agent --help)
      keep the peers file current from the Kubernetes API and reconcile on every change
  sticky-vxlan --help | --version
";

/// Exit codes of the operator's verbs (printed by `--help`).
pub const EXIT_OK: u8 = 0;
/// Runtime error: netlink, the peers file, the state dir.
pub const EXIT_RUNTIME: u8 = 1;
/// Usage error: unknown verb or option, missing or bad argument, unusable `--config`.
pub const EXIT_USAGE: u8 = 2;

pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  runtime error (netlink, peers file, state dir)
  2  usage error (unknown verb or option, missing or bad argument, bad --config)
With several --config, the highest code of the networks that failed.";

/// A mistake of the operator's command line or config, or the plugin's own error at run
/// time. Not a CNI error: it never becomes a CNI error code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("unknown command {0:?} (expected mac, reconcile, show or doctor)")]
    UnknownVerb(String),
    #[error("no command given (expected mac, reconcile, show or doctor)")]
    NoVerb,
    /// `doctor` could not run: it decided nothing (exit 2).
    #[error("doctor could not run: {0}")]
    Doctor(#[from] crate::doctor::Error),
    /// `doctor` ran and found causes (exit 1; they are on stdout).
    #[error("doctor found {0} cause(s)")]
    Found(usize),
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("show: --config and --state-dir name the same thing: give one")]
    ShowWhere,
    #[error("--local {0:?} is not an IPv4 or IPv6 address")]
    BadLocal(String),
    #[error("--vni {0:?} is not an integer from 1 to {max}", max = config::MAX_VNI)]
    BadVni(String),
    #[error(transparent)]
    Vxlan(#[from] Error),
    #[error(transparent)]
    Network(#[from] networks::Error),
    #[error("cannot run {}: {source} (install sticky-vxlan-agent beside sticky-vxlan or on $PATH)", program.display())]
    AgentNotRun {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("writing output: {0}")]
    Output(std::io::Error),
    /// `node-ranges`: this node's ranges could not be worked out.
    #[error("{0}")]
    NodeRanges(String),
    /// `reconcile` with several `--config`: what was done, and each file that failed.
    #[error("{} of {total} networks were not reconciled", failed.len())]
    Networks {
        total: usize,
        done: String,
        failed: Vec<(PathBuf, CliError)>,
    },
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            // An unusable `--config` is a usage error in either mode.
            CliError::Network(e) if e.is_config() => EXIT_USAGE,
            CliError::Found(_) => EXIT_RUNTIME,
            CliError::Vxlan(_)
            | CliError::Network(_)
            | CliError::AgentNotRun { .. }
            | CliError::NodeRanges(_)
            | CliError::Output(_) => EXIT_RUNTIME,
            CliError::Networks { failed, .. } => failed
                .iter()
                .map(|(_, e)| e.exit_code())
                .max()
                .unwrap_or(EXIT_RUNTIME),
            _ => EXIT_USAGE,
        }
    }

    /// The message, naming the file it is about when it does not already.
    pub fn about(&self, path: &Path) -> String {
        match self {
            CliError::Network(e) => e.about(path),
            _ => format!("--config {}: {self}", path.display()),
        }
    }
}

const MAC: Spec = Spec {
    verb: "mac",
    flags: &[],
    values: &["--local", "--vni"],
    repeatable: &[],
    positionals: &[],
};
const RECONCILE: Spec = Spec {
    verb: "reconcile",
    flags: &[],
    values: &["--config"],
    repeatable: &["--config"],
    positionals: &[],
};
const DOCTOR: Spec = Spec {
    verb: "doctor",
    flags: &["--json"],
    values: &["--config"],
    repeatable: &[],
    positionals: &[],
};
const SHOW: Spec = Spec {
    verb: "show",
    flags: &[],
    values: &["--state-dir", "--config"],
    repeatable: &[],
    positionals: &[],
};

/// The tool's entry point: `args` without the program name ([`program::main`]). Prints the
/// output, or the error on stderr, and exits with one of the documented codes.
pub fn main(args: Vec<String>) -> ExitCode {
    program::main("sticky-vxlan", |out| {
        if args.first().map(String::as_str) == Some("agent") {
            return Err(agent_alias(&args[1..]));
        }
        if let [verb, network] = &args[..]
            && verb == NODE_RANGES
        {
            return node_ranges_for_ipam(network, out);
        }
        if find_verb(&args, &[]) == Some("doctor") && !asks_help(&args) {
            return doctor(&args, out);
        }
        match run(&args) {
            Ok(text) => out.write_all(text.as_bytes()).map_err(CliError::Output),
            Err(err) => {
                if let CliError::Networks { done, failed, .. } = &err {
                    // The exit code says the networks failed, whether or not this is seen.
                    let _ = out.write_all(done.as_bytes());
                    for (path, e) in failed {
                        eprintln!("sticky-vxlan: {}", e.about(path));
                    }
                }
                Err(err)
            }
        }
    })
}

impl program::Failure for CliError {
    fn exit_code(&self) -> u8 {
        CliError::exit_code(self)
    }
    fn is_usage(&self) -> bool {
        !matches!(self, CliError::Doctor(_)) && CliError::exit_code(self) == EXIT_USAGE
    }
}

/// The verb sticky-ipam's operator tool runs (not in `--help`, not for operators): see
/// [`node_ranges_for_ipam`].
pub(crate) const NODE_RANGES: &str = "node-ranges";

/// `sticky-vxlan node-ranges <network>`: reads a sticky-vxlan plugin entry on stdin and
/// prints it with `ipam.ranges` filled in from this node's peer entry
/// ([`node_ranges::fill`]), or nothing when nothing needs filling in. sticky-ipam's tool runs
/// it for the cluster conflist, so that sticky-ipam need not read sticky-vxlan's peers (nor
/// link netlink to find this host's addresses). Its error is `sticky-vxlan: <reason>`.
fn node_ranges_for_ipam(network: &str, out: &mut program::Stdout) -> Result<(), CliError> {
    let mut stdin = Vec::new();
    std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(CliError::Output)?;
    let entry: serde_json::Value =
        serde_json::from_slice(&stdin).map_err(|e| CliError::NodeRanges(e.to_string()))?;
    match node_ranges::fill(&entry, network) {
        Ok(Some(filled)) => writeln!(out, "{filled}").map_err(CliError::Output),
        Ok(None) => Ok(()),
        Err(e) => Err(CliError::NodeRanges(e.to_string())),
    }
}

/// `sticky-vxlan agent ...`, kept for one release: runs `sticky-vxlan-agent` from this binary's
/// directory (or `$PATH`) with the same arguments, and says so. Returns only when it cannot.
fn agent_alias(args: &[String]) -> CliError {
    const AGENT: &str = "sticky-vxlan-agent";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(AGENT)))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| AGENT.into());
    eprintln!(
        "sticky-vxlan: `sticky-vxlan agent` is deprecated and will be removed in the next release: running {} (the agent is a program of its own now)",
        program.display()
    );
    let source = std::process::Command::new(&program).args(args).exec();
    CliError::AgentNotRun { program, source }
}

/// Whether the command line asks for the help (before any `--`).
fn asks_help(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--help" || a == "-h" || a == "help")
}

/// `doctor --config <file> [--json]`: prints the report whatever it found; the exit code says
/// whether a cause was found (1) or it could not run (2).
fn doctor(args: &[String], out: &mut program::Stdout) -> Result<(), CliError> {
    let (text, found) = doctor_report(args)?;
    out.write_all(text.as_bytes()).map_err(CliError::Output)?;
    match found {
        0 => Ok(()),
        n => Err(CliError::Found(n)),
    }
}

/// What `doctor` prints, and how many causes it found.
fn doctor_report(args: &[String]) -> Result<(String, usize), CliError> {
    let parsed = parse(args, &[], &DOCTOR)?;
    let config = parsed.value("--config").ok_or(ArgsError::MissingArgument {
        verb: "doctor",
        what: "--config <file>",
    })?;
    let report = crate::doctor::run(Path::new(config))?;
    let text = if parsed.flag("--json") {
        format!("{}\n", crate::doctor::render::json(&report))
    } else {
        crate::doctor::render::text(&report)
    };
    Ok((text, report.findings.len()))
}

/// Runs one operator command and returns what to print.
pub fn run(args: &[String]) -> Result<String, CliError> {
    let before_dashes = || args.iter().take_while(|a| *a != "--");
    if args.is_empty() || asks_help(args) {
        return Ok(format!("{HELP}\n{EXIT_CODES}\n"));
    }
    if before_dashes().any(|a| a == "--version" || a == "-V") {
        return Ok(format!("sticky-vxlan {}\n", env!("CARGO_PKG_VERSION")));
    }
    let required =
        |verb: &'static str, what: &'static str| ArgsError::MissingArgument { verb, what };
    match find_verb(args, &[]) {
        Some("mac") => {
            let parsed = parse(args, &[], &MAC)?;
            let local = parsed
                .value("--local")
                .ok_or(required("mac", "--local <underlay IPv4 or IPv6>"))?;
            let vni = parsed.value("--vni").ok_or(required("mac", "--vni <n>"))?;
            let local: IpAddr = local
                .parse()
                .map_err(|_| CliError::BadLocal(local.to_string()))?;
            let vni: u32 = vni
                .parse()
                .ok()
                .filter(|v| (1..=config::MAX_VNI).contains(v))
                .ok_or_else(|| CliError::BadVni(vni.to_string()))?;
            Ok(format!("{}\n", format_mac(&vtep_mac(local, vni))))
        }
        Some("reconcile") => {
            let parsed = parse(args, &[], &RECONCILE)?;
            match parsed.values_of("--config")[..] {
                [] => Err(required("reconcile", "--config <file>").into()),
                [one] => reconcile_file(Path::new(one)),
                ref several => reconcile_files(several),
            }
        }
        Some("show") => {
            let parsed = parse(args, &[], &SHOW)?;
            let state_dir = match (parsed.value("--config"), parsed.value("--state-dir")) {
                (Some(_), Some(_)) => return Err(CliError::ShowWhere),
                (Some(conf), None) => networks::load(Path::new(conf))?.state_dir,
                (None, dir) => PathBuf::from(dir.unwrap_or(config::DEFAULT_STATE_DIR)),
            };
            show(&state_dir).map_err(CliError::from)
        }
        Some(other) => Err(CliError::UnknownVerb(other.to_string())),
        None => Err(CliError::NoVerb),
    }
}

/// `reconcile --config <path>`: the main network's node or a segment, as the file says.
fn reconcile_file(path: &Path) -> Result<String, CliError> {
    Ok(networks::reconcile(path)?)
}

/// `reconcile` with several `--config`: each in turn, whatever happened to the ones before
/// (a boot unit must not leave a segment down because another file is broken).
fn reconcile_files(paths: &[&str]) -> Result<String, CliError> {
    let mut done = String::new();
    let mut failed = Vec::new();
    for path in paths.iter().map(Path::new) {
        match reconcile_file(path) {
            Ok(out) => done.push_str(&out),
            Err(e) => failed.push((path.to_path_buf(), e)),
        }
    }
    if failed.is_empty() {
        return Ok(done);
    }
    Err(CliError::Networks {
        total: paths.len(),
        done,
        failed,
    })
}

/// Every VXLAN device with its MAC (and whether it is the kept one) and the peers on it.
fn show(state_dir: &Path) -> Result<String, Error> {
    let mut sock = Socket::open()?;
    let links = link::list(&mut sock)?;
    let mut out = String::new();
    let name_of = |i: Option<u32>| {
        links
            .iter()
            .find(|l| Some(l.index) == i)
            .map(|l| l.name.clone())
            .unwrap_or_else(|| "-".into())
    };
    let routes = route::list(&mut sock)?;
    for vtep in links.iter().filter(|l| l.vxlan.is_some()) {
        let Some(v) = &vtep.vxlan else { continue };
        let mac = vtep
            .mac
            .map(|m| format_mac(&m))
            .unwrap_or_else(|| "-".into());
        let kept = match (v.local, v.vni) {
            (Some(local), Some(vni)) if vtep.mac == Some(vtep_mac(local, vni)) => {
                "kept MAC".to_string()
            }
            (Some(local), Some(vni)) => {
                format!("NOT the kept MAC {}", format_mac(&vtep_mac(local, vni)))
            }
            _ => "no local address: MAC cannot be checked".into(),
        };
        let _ = writeln!(
            out,
            "{} vni {} port {} local {} dev {} mtu {} {} mac {mac} ({kept})",
            vtep.name,
            v.vni.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            v.port.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            v.local.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            name_of(v.underlay),
            vtep.mtu.unwrap_or(0),
            if vtep.up { "up" } else { "DOWN" },
        );
        for a in addr::list(&mut sock, vtep.index)? {
            let _ = writeln!(out, "  own address {a}");
        }
        // A peer's subnets: our routes on this VTEP via a gateway whose neighbour entry is the
        // peer's MAC (looked up, so `show` stays linear in the peers).
        let mut via: HashMap<IpAddr, Vec<String>> = HashMap::new();
        for r in &routes {
            if let Some(gw) = r.gateway
                && r.oif == Some(vtep.index)
                && r.protocol == ROUTE_PROTOCOL
            {
                via.entry(gw).or_default().push(r.dst.to_string());
            }
        }
        let mut by_mac: HashMap<[u8; 6], Vec<IpAddr>> = HashMap::new();
        for n in neigh::list(&mut sock, vtep.index)? {
            by_mac.entry(n.mac).or_default().push(n.ip);
        }
        for f in neigh::list_fdb(&mut sock, vtep.index)? {
            let subnets: Vec<String> = by_mac
                .get(&f.mac)
                .into_iter()
                .flatten()
                .flat_map(|ip| via.get(ip).into_iter().flatten().cloned())
                .collect();
            let _ = writeln!(
                out,
                "  peer {} mac {}{} subnets {}",
                f.dst,
                format_mac(&f.mac),
                if f.permanent { "" } else { " (not permanent)" },
                if subnets.is_empty() {
                    "NONE (no route/neighbour)".into()
                } else {
                    subnets.join(" ")
                }
            );
        }
    }
    if out.is_empty() {
        out.push_str("no VXLAN device in this network namespace\n");
    }
    out.push_str(&crate::segment::show::segments(&mut sock, &links)?);
    let agents = crate::status::describe(state_dir);
    if agents.is_empty() {
        let _ = writeln!(
            out,
            "no agent status in {}: a network whose stateDir is elsewhere is shown with --config <its conflist> (or --state-dir)",
            state_dir.display()
        );
    }
    out.push_str(&agents);
    for l in &links {
        if let Some((network, cid, ifname)) = l.alias.as_deref().and_then(pod::parse_alias) {
            let _ = writeln!(
                out,
                "pod {cid} {ifname} network {network} host {} on {}",
                l.name,
                name_of(l.master)
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn mac_help_version_and_usage_errors() {
        assert_eq!(
            run(&args(&["mac", "--local", "192.0.2.1", "--vni", "1"])).unwrap(),
            "0a:01:c0:00:02:01\n"
        );
        // An IPv6 underlay's kept MAC (vxlan::mac pins the formula).
        assert_eq!(
            run(&args(&["mac", "--local", "2001:db8::1", "--vni", "1"])).unwrap(),
            "06:be:aa:cc:39:99\n"
        );
        assert!(
            run(&args(&["--help"]))
                .unwrap()
                .contains("reconcile --config")
        );
        assert!(
            run(&args(&["--version"]))
                .unwrap()
                .starts_with("sticky-vxlan ")
        );
        for bad in [
            &["mac", "--local", "2001:db8::zz", "--vni", "1"][..],
            &["mac", "--local", "192.0.2.1", "--vni", "0"],
            &["mac", "--vni", "1"],
            &["mac", "--local", "192.0.2.1", "--vni", "1", "--vni", "2"],
            &["mac", "--local", "192.0.2.1", "--vni", "1", "--force"],
            &["reconcile"],
            &["reconcile", "--config"],
            &["reconcile", "--config", "/a.conf", "--config=/a.conf"],
            &["show", "now"],
            &["frobnicate"],
        ] {
            let err = run(&args(bad)).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}: {err}");
        }
    }

    /// `doctor` refuses a bad command line as a usage error and says it could not run (2,
    /// without pointing at `--help`) when the config cannot be read; nothing is probed then.
    #[test]
    fn doctor_usage_errors_and_an_unreadable_config_exit_2() {
        for bad in [
            &["doctor"][..],
            &["doctor", "--config"],
            &["doctor", "--config", "/a", "--verbose"],
            &["doctor", "--config", "/a", "extra"],
        ] {
            let err = doctor_report(&args(bad)).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}: {err}");
            assert!(program::Failure::is_usage(&err), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("10-missing.conflist");
        let err =
            doctor_report(&args(&["doctor", "--config", missing.to_str().unwrap()])).unwrap_err();
        assert!(matches!(err, CliError::Doctor(_)), "{err:?}");
        assert_eq!(err.exit_code(), 2);
        assert!(!program::Failure::is_usage(&err));
        assert!(
            err.to_string().starts_with("doctor could not run: "),
            "{err}"
        );
        assert_eq!(CliError::Found(2).exit_code(), 1);
    }

    /// Several `--config`: every file is tried and each failure kept with its file; the exit
    /// code is the highest of them.
    #[test]
    fn several_configs_are_each_tried_and_every_failure_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("10-missing.conflist");
        let bad = dir.path().join("20-bad.conflist");
        std::fs::write(&bad, "{").unwrap();
        let (m, b) = (missing.to_str().unwrap(), bad.to_str().unwrap());
        let err = run(&args(&["reconcile", "--config", m, "--config", b])).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_USAGE);
        let CliError::Networks {
            total,
            done,
            failed,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*total, done.as_str()), (2, ""));
        let paths: Vec<&Path> = failed.iter().map(|(p, _)| p.as_path()).collect();
        assert_eq!(paths, [missing.as_path(), bad.as_path()]);
        assert!(failed[1].1.about(&bad).contains("20-bad.conflist"));
        let runtime = CliError::Networks {
            total: 2,
            done: String::new(),
            failed: vec![(missing.clone(), CliError::Vxlan(Error::NoRemotePeer))],
        };
        assert_eq!(runtime.exit_code(), EXIT_RUNTIME);
        assert!(runtime.to_string().contains("1 of 2 networks"));
    }
}
