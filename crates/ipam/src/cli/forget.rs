//! `forget`: delete a pod's records, so their addresses are free for anyone.
//!
//! Called `release` until 0.1 (kept one release as a deprecated alias, with its old output):
//! a name that said the opposite of what it does, since a released lease in the plugin is
//! one that is *kept*.
//!
//! An attached lease (or an adopted OpenYurt record) may belong to a live sandbox: dropping
//! it could hand its address to a second pod. That needs `--force`; without it nothing is
//! removed, not even the pod's released leases (all or nothing).

use std::io::Write;

use serde_json::json;

use crate::store::Store;

use super::args::{self, Spec};
use super::entry;
use super::{CliError, Target, parse_pod, pod_text, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] forget <namespace>/<pod> [--ifname <name>] [--force] [--json]

Deletes the pod's records (lease files, OpenYurt markers): their addresses become free and
the pod gets a new address on its next ADD. Refused (exit 3, nothing removed) when one of
them is attached — it may belong to a live sandbox — unless --force.
`release` is a deprecated alias of `forget` (its --json key stays \"released\"); it goes
away in the next release.

Options:
  --ifname <name>  only the records of this interface (default: every interface)
  --force          delete attached records too (the sandbox keeps running with an address
                   that may be handed out again: delete the pod first)
  --json           {network, namespace, pod, forgotten: [records as in list --json]}

Exit code 4 when the pod has no records.

Examples:
  sticky-ipam --network edge forget default/web-0
  sticky-ipam forget /happy_turing --force";

const SPEC: Spec = Spec {
    verb: "forget",
    flags: &["--json", "--force"],
    values: &["--ifname"],
    repeatable: &[],
    positionals: &["<namespace>/<pod>"],
};

/// The deprecated name, with its old output.
const ALIAS: Spec = Spec {
    verb: "release",
    ..SPEC
};

/// `forget`, or its deprecated alias `release` when `alias` (same effect, old output key).
pub fn run(argv: &[String], out: &mut dyn Write, alias: bool) -> Result<(), CliError> {
    if alias {
        eprintln!(
            "sticky-ipam: `release` is deprecated (it deletes records, while a released lease is one that is kept): use `forget`"
        );
    }
    let parsed = args::parse(argv, if alias { &ALIAS } else { &SPEC })?;
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
            "{who} is attached on {} (it may belong to a live sandbox); nothing deleted — use --force to delete it anyway",
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
                if alias { "released" } else { "forgotten" }: rows,
            }),
        );
    }
    writeln!(
        out,
        "{} {} record(s) of {who} in network {network}:",
        if alias {
            "released"
        } else {
            "forgot (deleted)"
        },
        rows.len()
    )?;
    out.write_all(entry::table(&rows, false).as_bytes())?;
    Ok(())
}
