//! `show`: one pod's records, and what its next ADD would get.
//!
//! The preview runs the plugin's own code — boot sweep, lease expiry, then
//! [`allocator::plan`] — over a [`DryRun`] overlay, for a fresh container id, exactly as the
//! next sandbox's ADD would, and writes nothing.

use std::io::Write;

use serde::Serialize;
use serde_json::json;

use crate::allocator::{self, AllocError, Plan, Request};
use crate::config::IpamConfig;
use crate::host::{current_boot, wall_clock};
use crate::identity::Pod;
use crate::lifecycle::{self, LeaseClock};
use crate::record::{parse_name, suffix_identity};
use crate::store::Store;

use super::args::{self, Spec};
use super::dryrun::DryRun;
use super::entry::{self, ATTACHED, Entry, HOST_LOCAL, MARKER, RELEASED};
use super::{CliError, Target, parse_pod, pod_text, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] show <namespace>/<pod> [--ifname <name>] [--uid <uid>] [--json]

The pod's records (see `list --help` for the columns) and, with --config, what its next
ADD would get and why: it takes back its released lease, takes over its attached lease
(same UID, attached in an earlier boot, or no UID on either side), gets a new address,
or reclaims the lease released longest ago. Without --config the ranges are unknown and
only the records are shown. Nothing is written.

A podman container has no namespace: `show /<name>` or `show <name>`.

Options:
  --ifname <name>  the interface the preview is for (default eth0); also limits the
                   records shown to that interface
  --uid <uid>      preview as a sandbox with this pod UID (default: none sent)
  --json           one JSON object: network, namespace, pod, ifname, records (as in
                   list --json), next (null without --config, else {addresses: [{rangeSet,
                   action (existing|take|takeover|new|reclaim), ip, explanation}], drops:
                   [file names], error: null or why the ADD would fail})

Exit code 4 when the pod has no records (the preview is still printed).

Examples:
  sticky-ipam --config /etc/cni/net.d/10-edge.conflist show default/web-0
  sticky-ipam show happy_turing --json";

const SPEC: Spec = Spec {
    verb: "show",
    flags: &["--json"],
    values: &["--ifname", "--uid"],
    repeatable: &[],
    positionals: &["<namespace>/<pod>"],
};

/// The container id the preview runs as: valid, and matching no real attachment.
const PREVIEW_CONTAINER: &str = "sticky-ipam-show-preview";

/// One range set's part of the next ADD.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub range_set: String,
    pub action: &'static str,
    pub ip: std::net::IpAddr,
    pub explanation: String,
}

/// What the next ADD would do.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Next {
    pub addresses: Vec<Step>,
    pub drops: Vec<String>,
    pub error: Option<String>,
}

pub fn run(argv: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let parsed = args::parse(argv, &SPEC)?;
    let target = Target::from_args(&parsed)?;
    let mut pod = parse_pod(&parsed.positionals[0])?;
    pod.uid = parsed.value("--uid").unwrap_or_default().to_string();
    let ifname_filter = parsed.value("--ifname");
    let ifname = ifname_filter.unwrap_or("eth0");
    let network = target.network()?;

    let mut store = target.open_read_only(&network)?;
    let mut clock = LeaseClock::advance(&store, wall_clock());
    let now = entry::lease_clock(&store);
    let mut view = DryRun::new(&mut store);
    let rows = entry::pod_entries(&mut view, &network, &pod, ifname_filter, now)?;
    let next = match &target.config {
        Some(config) => Some(preview(&mut view, config, &pod, ifname, &mut clock, &rows)?),
        None => None,
    };
    drop(view);
    drop(store);

    let who = pod_text(&pod.namespace, &pod.name);
    if parsed.flag("--json") {
        write_json(
            out,
            &json!({
                "network": network,
                "namespace": pod.namespace,
                "pod": pod.name,
                "ifname": ifname,
                "records": rows,
                "next": next,
            }),
        )?;
    } else {
        writeln!(out, "pod {who} (interface {ifname}) in network {network}\n")?;
        if rows.is_empty() {
            writeln!(out, "no records")?;
        } else {
            out.write_all(entry::table(&rows, false).as_bytes())?;
        }
        writeln!(out)?;
        match &next {
            None => writeln!(
                out,
                "next ADD: unknown — pass --config <file>: the ranges are in the network config"
            )?,
            Some(next) => {
                let uid = if pod.uid.is_empty() {
                    "no UID".to_string()
                } else {
                    format!("UID {}", pod.uid)
                };
                writeln!(out, "next ADD (a new sandbox, {uid}):")?;
                for name in &next.drops {
                    writeln!(out, "  drops {name}: outside every configured range")?;
                }
                for step in &next.addresses {
                    writeln!(out, "  {}: {}", step.range_set, step.explanation)?;
                }
                if let Some(error) = &next.error {
                    writeln!(out, "  fails: {error}")?;
                }
            }
        }
    }
    if rows.is_empty() {
        return Err(CliError::NoRecords { pod: who, network });
    }
    Ok(())
}

/// The next ADD of `pod`, planned after the recovery an ADD runs first.
fn preview<S: Store>(
    view: &mut DryRun<'_, S>,
    config: &IpamConfig,
    pod: &Pod,
    ifname: &str,
    clock: &mut LeaseClock,
    rows: &[Entry],
) -> Result<Next, CliError> {
    let boot = current_boot();
    if config.sticky {
        lifecycle::sweep_earlier_boots(view, &boot, clock.now)?;
    }
    if let Some(hold) = config.lease_hold {
        lifecycle::expire(view, hold.as_secs(), clock)?;
    }
    let requested = allocator::assign_requested(config)?;
    let req = Request {
        container_id: PREVIEW_CONTAINER,
        ifname,
        pod: Some(pod),
        sticky: config.sticky,
        boot: &boot,
        lease_clock: clock.now,
    };
    let plan = match allocator::plan(view, config, &req, &requested) {
        Ok(plan) => plan,
        Err(
            e @ (AllocError::Exhausted { .. }
            | AllocError::RequestedGateway { .. }
            | AllocError::RequestedTaken { .. }
            | AllocError::RequestedUnavailable { .. }
            | AllocError::RequestedUnfulfilled(_)),
        ) => {
            return Ok(Next {
                error: Some(e.to_string()),
                ..Next::default()
            });
        }
        Err(e) => return Err(e.into()),
    };
    let addresses = plan
        .sets
        .iter()
        .zip(&config.range_sets)
        .map(|(step, set)| {
            let (action, explanation) = explain(step, pod, &boot, rows, |ip| set.contains(ip));
            Step {
                range_set: set.to_string(),
                action,
                ip: step.ip(),
                explanation,
            }
        })
        .collect();
    Ok(Next {
        addresses,
        drops: plan.drops,
        error: None,
    })
}

/// An action name and a sentence for one range set's plan.
fn explain(
    plan: &Plan,
    pod: &Pod,
    boot: &str,
    rows: &[Entry],
    in_set: impl Fn(std::net::IpAddr) -> bool,
) -> (&'static str, String) {
    let ip = plan.ip();
    let row = rows.iter().find(|r| r.ip == ip);
    match plan {
        Plan::Existing(_) => ("existing", format!("keeps {ip}: already recorded")),
        Plan::Take { .. } => match row.map(|r| r.state) {
            Some(ATTACHED) => {
                let row_uid = row.and_then(|r| r.pod_uid.as_deref()).unwrap_or("");
                let row_boot = row.and_then(|r| r.boot.as_deref()).unwrap_or("");
                let why = if !pod.uid.is_empty() && row_uid == pod.uid {
                    "same UID"
                } else if !row_boot.is_empty() && row_boot != boot {
                    "attached in an earlier boot"
                } else {
                    "no UID on either side"
                };
                (
                    "takeover",
                    format!("takes over attached lease {ip} ({why})"),
                )
            }
            Some(HOST_LOCAL) => (
                "takeover",
                format!("takes over its adopted OpenYurt record {ip} (no UID recorded)"),
            ),
            Some(MARKER) => (
                "take",
                format!("takes back {ip}, reserved by its OpenYurt marker"),
            ),
            Some(RELEASED) | Some(_) | None => {
                ("take", format!("takes back its released lease {ip}"))
            }
        },
        Plan::New(_) => {
            let live = rows
                .iter()
                .find(|r| r.state == ATTACHED && in_set(r.ip))
                .map(|r| match r.pod_uid.as_deref().filter(|u| !u.is_empty()) {
                    Some(uid) => format!(
                        " (its lease {} is attached in this boot to UID {uid}: that sandbox may be alive)",
                        r.ip
                    ),
                    None => format!(
                        " (its lease {} is attached in this boot without a UID: that sandbox may be alive)",
                        r.ip
                    ),
                })
                .unwrap_or_default();
            ("new", format!("gets a new address {ip}{live}"))
        }
        Plan::Reclaim { victims, .. } => {
            let owner = victims
                .iter()
                .find_map(|n| parse_name(n).and_then(|(_, s)| s).and_then(suffix_identity))
                .map(|(ns, p)| format!(" from {}", pod_text(&ns, &p)))
                .unwrap_or_default();
            (
                "reclaim",
                format!(
                    "reclaims {ip}, the lease released longest ago{owner}: no never-used address is left"
                ),
            )
        }
    }
}
