//! `release`: drop a pod's leases, so their addresses are free for anyone.
//!
//! An attached lease (or an adopted OpenYurt record) may belong to a live sandbox: dropping
//! it could hand its address to a second pod. That needs `--force`; without it nothing is
//! removed, not even the pod's released leases (all or nothing).

use std::io::Write;

use serde_json::json;

use crate::ipam::store::Store;

use super::args::{self, Spec};
use super::entry;
use super::{CliError, Target, parse_pod, pod_text, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] release <namespace>/<pod> [--ifname <name>] [--force] [--json]

Drops the pod's records (lease files, OpenYurt markers): their addresses become free and
the pod gets a new address on its next ADD. Refused (exit 3, nothing removed) when one of
them is attached — it may belong to a live sandbox — unless --force.

Options:
  --ifname <name>  only the records of this interface (default: every interface)
  --force          drop attached records too (the sandbox keeps running with an address
                   that may be handed out again: delete the pod first)
  --json           {network, namespace, pod, released: [records as in list --json]}

Exit code 4 when the pod has no records.

Examples:
  sticky-ipam --network edge release default/web-0
  sticky-ipam release /happy_turing --force";

const SPEC: Spec = Spec {
    verb: "release",
    flags: &["--json", "--force"],
    values: &["--ifname"],
    positionals: &["<namespace>/<pod>"],
};

pub fn run(argv: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let parsed = args::parse(argv, &SPEC)?;
    let target = Target::from_args(&parsed)?;
    let pod = parse_pod(&parsed.positionals[0])?;
    let who = pod_text(&pod.namespace, &pod.name);
    let network = target.network()?;

    let mut store = target.open(&network)?;
    let now = entry::lease_clock(&store);
    let rows = entry::pod_entries(&mut store, &network, &pod, parsed.value("--ifname"), now)?;
    if rows.is_empty() {
        return Err(CliError::NoRecords { pod: who, network });
    }
    let attached: Vec<String> = rows
        .iter()
        .filter(|r| r.is_attached())
        .map(|r| r.ip.to_string())
        .collect();
    if !attached.is_empty() && !parsed.flag("--force") {
        return Err(CliError::Refused(format!(
            "{who} is attached on {} (it may belong to a live sandbox); nothing released — use --force to drop it anyway",
            attached.join(", ")
        )));
    }
    for row in &rows {
        for file in &row.files {
            store.remove(file)?;
        }
    }
    store.sync()?;
    drop(store);

    if parsed.flag("--json") {
        return write_json(
            out,
            &json!({
                "network": network,
                "namespace": pod.namespace,
                "pod": pod.name,
                "released": rows,
            }),
        );
    }
    writeln!(
        out,
        "released {} record(s) of {who} in network {network}:",
        rows.len()
    )?;
    out.write_all(entry::table(&rows, false).as_bytes())?;
    Ok(())
}
