//! `gc --dry-run`: what the recovery every ADD and GC runs would do now — the once-per-boot
//! sweep (attached leases of an earlier boot become released leases) and lease expiry
//! (`leaseHold`) — planned by the plugin's own code over a [`DryRun`] overlay.

use std::io::Write;

use serde::Serialize;
use serde_json::json;

use crate::host::{current_boot, wall_clock};
use crate::lifecycle::{self, Action, Change, LeaseClock};
use crate::record::{Body, suffix_identity};

use super::args::{self, Spec};
use super::dryrun::DryRun;
use super::entry::{self, ago};
use super::{CliError, Target, pod_text, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] gc --dry-run [--json]

What the recovery that runs at every ADD and CNI GC would do right now, without doing it:
  release  an attached lease of an earlier boot (after a reboot no sandbox of it is
           alive): it becomes a released lease, kept for its pod
  free     a released lease (or OpenYurt marker) older than leaseHold: the file is
           removed and the address is free again
leaseHold comes from --config; without it only the boot sweep is shown.

A real GC is not offered here: it needs the runtime's list of live attachments, which
only a CNI GC call carries (CRI-O sends one; containerd does not yet). Unknown
attachments are released by that call, not by this tool.

Options:
  --dry-run  required
  --json     {network, boot, leaseHold (seconds or null), changes: [{ip, file, namespace,
             pod, containerId, action (release|free), reason (earlier-boot|expired)}]}

Example:
  sticky-ipam --config /etc/cni/net.d/10-edge.conflist gc --dry-run";

const SPEC: Spec = Spec {
    verb: "gc",
    flags: &["--json", "--dry-run"],
    values: &[],
    repeatable: &[],
    positionals: &[],
};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Planned {
    pub ip: std::net::IpAddr,
    pub file: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container_id: Option<String>,
    pub action: &'static str,
    pub reason: &'static str,
}

impl Planned {
    fn new(change: &Change, reason: &'static str) -> Planned {
        let r = &change.record;
        let (namespace, pod, container_id) = match &r.body {
            Body::Lease(l) => (
                Some(l.namespace.clone()),
                Some(l.pod.clone()),
                Some(l.container_id.clone()),
            ),
            Body::HostLocal { container_id, .. } => (None, None, Some(container_id.clone())),
            Body::Marker | Body::Held(_) => match r.suffix().and_then(suffix_identity) {
                Some((ns, pod)) => (Some(ns), Some(pod), None),
                None => (None, None, None),
            },
        };
        Planned {
            ip: r.ip,
            file: r.name.clone(),
            namespace,
            pod,
            container_id,
            action: match change.action {
                Action::Release => "release",
                Action::Remove => "free",
            },
            reason,
        }
    }
}

pub fn run(argv: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let parsed = args::parse(argv, &SPEC)?;
    if !parsed.flag("--dry-run") {
        return Err(CliError::GcNeedsDryRun);
    }
    let target = Target::from_args(&parsed)?;
    let network = target.network()?;
    let sticky = target.config.as_ref().is_none_or(|c| c.sticky);
    let hold = target
        .config
        .as_ref()
        .and_then(|c| c.lease_hold)
        .map(|d| d.as_secs());
    let boot = current_boot();

    let mut store = target.open_read_only(&network)?;
    let mut clock = LeaseClock::advance(&store, wall_clock());
    let mut view = DryRun::new(&mut store);
    let mut planned = Vec::new();
    if sticky {
        let sweep = lifecycle::plan_boot_sweep(&mut view, &boot)?;
        if let Some(err) = lifecycle::apply(&mut view, &sweep, clock.now)
            .into_iter()
            .next()
        {
            return Err(err.into());
        }
        planned.extend(sweep.iter().map(|c| Planned::new(c, "earlier-boot")));
    }
    if let Some(hold) = hold {
        let expiry = lifecycle::plan_expiry(&mut view, hold, &mut clock)?;
        planned.extend(expiry.iter().map(|c| Planned::new(c, "expired")));
    }
    drop(view);
    drop(store);

    if parsed.flag("--json") {
        return write_json(
            out,
            &json!({
                "network": network,
                "boot": boot,
                "leaseHold": hold,
                "changes": planned,
            }),
        );
    }
    let hold_text = match hold {
        Some(h) => format!("leaseHold {}", ago(h)),
        None if target.config.is_some() => "no leaseHold: leases never expire".into(),
        None => "leaseHold unknown (no --config): expiry not evaluated".into(),
    };
    writeln!(out, "network {network}: dry run ({hold_text})")?;
    if planned.is_empty() {
        writeln!(out, "nothing to release or free")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = planned
        .iter()
        .map(|p| {
            vec![
                p.ip.to_string(),
                p.pod
                    .as_deref()
                    .map(|pod| pod_text(p.namespace.as_deref().unwrap_or(""), pod))
                    .unwrap_or_else(|| "-".into()),
                p.action.to_string(),
                p.reason.to_string(),
                p.file.clone(),
            ]
        })
        .collect();
    out.write_all(entry::align(&["IP", "POD", "ACTION", "REASON", "FILE"], &rows).as_bytes())?;
    Ok(())
}
