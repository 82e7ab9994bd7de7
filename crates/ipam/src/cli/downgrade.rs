//! `downgrade`: the way back to host-local.
//!
//! host-local knows an address is taken only by creating `<ip>` with `O_EXCL`: a lease file
//! `<ip>_<ns>_<pod>` means nothing to it. So every attached lease is rewritten as `<ip>` with
//! host-local's body (`<containerID>\r\n<ifname>`), and what host-local cannot express —
//! released leases, OpenYurt markers — blocks the downgrade unless `--drop-leases` (then those
//! addresses become free). sticky-ipam's bookkeeping (`release_seq`, `boot_id`,
//! `lease_clock`, `sticky_counters`) and its name index (`sticky-index/`) are removed; `lock`
//! and `last_reserved_ip.*` are host-local's own files and stay.
//!
//! Crash-safe: per address, `<ip>` is created first and the lease removed second. A crash in
//! between leaves both; [`group`] resolves that pair to the lease (as an interrupted
//! adoption), so sticky-ipam still works on the data dir, and running `downgrade` again
//! finishes the job.

use std::io::Write;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::json;

use crate::disk::RELEASE_SEQ_FILE;
use crate::group::group;
use crate::host::current_boot;
use crate::record::{Body, Record, State, suffix_identity};
use crate::store::{Note, Store};

use super::args::{self, Spec};
use super::entry::{self, short_id};
use super::{CliError, Target, pod_text, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] downgrade [--drop-leases] [--json]

Rewrites the network's data dir into host-local's layout, so the network can go back to
\"type\": \"host-local\" without handing out an address that is in use:
  attached lease   -> <ip> file with body <containerID>\\r\\n<ifname> (DEL by container
                      id through host-local releases it)
  host-local <ip>  -> kept as is
  released lease   -> refused: host-local cannot keep an address for a pod
  attached lease of an earlier boot -> refused: no sandbox of that boot is alive
                      (the plugin's next ADD would release it)
  OpenYurt marker  -> refused
With released leases or markers present nothing is changed and they are listed (exit 3),
unless --drop-leases: then they are removed and their addresses become free.
sticky-ipam's bookkeeping files (release_seq, boot_id, lease_clock, sticky_counters) are
removed; lock and last_reserved_ip.* are host-local's and stay.

Safe to interrupt: run it again to finish. Stop pod churn on the node first if you can,
and switch the network config to host-local right after: an ADD by sticky-ipam in
between writes a lease again.

Options:
  --drop-leases  remove released leases and markers instead of refusing
  --json         {network, converted: [{ip, file, namespace, pod, containerId, ifname}],
                 dropped: [{ip, file, namespace, pod, reason}], kept, removed: [files]};
                 when refused: {network, refused: [{ip, file, namespace, pod, reason}]}

Example:
  sticky-ipam --network edge downgrade --drop-leases";

const SPEC: Spec = Spec {
    verb: "downgrade",
    flags: &["--json", "--drop-leases"],
    values: &[],
    repeatable: &[],
    positionals: &[],
};

/// An attached lease to rewrite as host-local's `<ip>`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Convert {
    pub ip: IpAddr,
    pub file: String,
    pub namespace: String,
    pub pod: String,
    pub container_id: String,
    pub ifname: String,
}

/// A record host-local cannot express.
#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    pub ip: IpAddr,
    pub file: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub reason: &'static str,
}

/// The bookkeeping files host-local does not have.
pub fn bookkeeping() -> [&'static str; 4] {
    [
        RELEASE_SEQ_FILE,
        Note::Boot.file_name(),
        Note::LeaseClock.file_name(),
        Note::Counters.file_name(),
    ]
}

/// Sorts every record of the data dir: to convert, to drop, or (host-local) to keep. `boot`
/// is the current boot id ("" if unknown): a lease attached in an earlier boot is released
/// in all but name (the plugin's next ADD would sweep it), so it is not converted.
pub fn plan<S: Store>(
    store: &mut S,
    boot: &str,
) -> Result<(Vec<Convert>, Vec<Dropped>, usize), CliError> {
    let (mut converts, mut drops, mut kept) = (Vec::new(), Vec::new(), 0);
    let mut ips: Vec<IpAddr> = store.index().ips().collect();
    ips.sort();
    for ip in ips {
        // `group` leaves no host-local file beside an attached lease.
        let records = group(store, ip)?;
        for record in &records {
            let dropped = |reason, identity: Option<(String, String)>| {
                let (namespace, pod) = identity.unzip();
                Dropped {
                    ip,
                    file: record.name.clone(),
                    namespace,
                    pod,
                    reason,
                }
            };
            match &record.body {
                Body::HostLocal { .. } => kept += 1,
                Body::Marker => drops.push(dropped(
                    "OpenYurt marker",
                    record.suffix().and_then(suffix_identity),
                )),
                // Perhaps a live pod's lease of a newer format: host-local could not know.
                Body::Held(_) => drops.push(dropped(
                    "held record (unreadable by this version)",
                    record.suffix().and_then(suffix_identity),
                )),
                Body::Lease(l) => {
                    let identity = Some((l.namespace.clone(), l.pod.clone()));
                    if l.state == State::Released {
                        drops.push(dropped("released lease", identity));
                    } else if !boot.is_empty() && !l.boot.is_empty() && l.boot != boot {
                        drops.push(dropped("attached in an earlier boot", identity));
                    } else {
                        converts.push(Convert {
                            ip,
                            file: record.name.clone(),
                            namespace: l.namespace.clone(),
                            pod: l.pod.clone(),
                            container_id: l.container_id.clone(),
                            ifname: l.ifname.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok((converts, drops, kept))
}

pub fn run(argv: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let parsed = args::parse(argv, &SPEC)?;
    let target = Target::from_args(&parsed)?;
    let network = target.network()?;
    let json = parsed.flag("--json");

    let mut store = target.open(&network)?;
    let (converts, drops, kept) = plan(&mut store, &current_boot())?;
    if !drops.is_empty() && !parsed.flag("--drop-leases") {
        store.sync()?;
        drop(store);
        if json {
            write_json(out, &json!({ "network": network, "refused": drops }))?;
        } else {
            writeln!(out, "host-local cannot express these records of {network}:")?;
            out.write_all(drop_table(&drops).as_bytes())?;
        }
        return Err(CliError::Refused(format!(
            "{} record(s) host-local cannot express; nothing changed — rerun with --drop-leases to remove them",
            drops.len()
        )));
    }
    for c in &converts {
        // `<ip>` first: a crash in between leaves both, which `group` resolves to the lease.
        store.write(&Record::host_local(c.ip, &c.container_id, &c.ifname))?;
        store.remove(&c.file)?;
    }
    for d in &drops {
        store.remove(&d.file)?;
    }
    let removed: Vec<&str> = bookkeeping().to_vec();
    for name in &removed {
        store.remove(name)?;
    }
    store.remove_index()?;
    store.sync()?;
    drop(store);

    if json {
        return write_json(
            out,
            &json!({
                "network": network,
                "converted": converts,
                "dropped": drops,
                "kept": kept,
                "removed": removed,
            }),
        );
    }
    writeln!(
        out,
        "network {network}: {} lease(s) converted, {} record(s) dropped, {kept} host-local record(s) kept",
        converts.len(),
        drops.len()
    )?;
    if !converts.is_empty() {
        let rows: Vec<Vec<String>> = converts
            .iter()
            .map(|c| {
                vec![
                    c.ip.to_string(),
                    pod_text(&c.namespace, &c.pod),
                    short_id(&c.container_id),
                    c.ifname.clone(),
                ]
            })
            .collect();
        writeln!(out, "\nconverted to host-local <ip> files:")?;
        out.write_all(entry::align(&["IP", "POD", "CONTAINER", "IFNAME"], &rows).as_bytes())?;
    }
    if !drops.is_empty() {
        writeln!(out, "\ndropped (addresses now free):")?;
        out.write_all(drop_table(&drops).as_bytes())?;
    }
    writeln!(
        out,
        "\nnow set \"type\": \"host-local\" in the network's ipam config"
    )?;
    Ok(())
}

fn drop_table(drops: &[Dropped]) -> String {
    let rows: Vec<Vec<String>> = drops
        .iter()
        .map(|d| {
            vec![
                d.ip.to_string(),
                d.pod
                    .as_deref()
                    .map(|p| pod_text(d.namespace.as_deref().unwrap_or(""), p))
                    .unwrap_or_else(|| "-".into()),
                d.reason.to_string(),
                d.file.clone(),
            ]
        })
        .collect();
    entry::align(&["IP", "POD", "REASON", "FILE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    fn lease(cid: &str, state: &str) -> String {
        format!(
            r#"{{"format":"sticky-ipam/v1","containerId":"{cid}","ifname":"eth0","namespace":"ns","pod":"{cid}","state":"{state}","releaseSeq":1}}"#
        )
    }

    #[test]
    fn sorts_records_and_resumes_an_interrupted_conversion() {
        let mut s = MemStore::default();
        s.put_raw("10.0.0.2_ns_a", lease("a", "attached").as_bytes());
        s.put_raw("10.0.0.3_ns_b", lease("b", "released").as_bytes());
        s.put_raw("10.0.0.4", b"anon\r\neth0");
        s.put_raw("10.0.0.5_ns_y", b"");
        // Interrupted: `<ip>` written, lease not yet removed.
        s.put_raw("10.0.0.6_ns_c", lease("c", "attached").as_bytes());
        s.put_raw("10.0.0.6", b"c\r\neth0");
        s.put_raw(
            "10.0.0.7_ns_d",
            lease("d", "attached")
                .replace(r#""state""#, r#""boot":"old","state""#)
                .as_bytes(),
        );
        let (converts, drops, kept) = plan(&mut s, "now").unwrap();
        let ips = |v: Vec<IpAddr>| v.iter().map(IpAddr::to_string).collect::<Vec<_>>();
        assert_eq!(
            ips(converts.iter().map(|c| c.ip).collect()),
            ["10.0.0.2", "10.0.0.6"]
        );
        assert_eq!(
            ips(drops.iter().map(|d| d.ip).collect()),
            ["10.0.0.3", "10.0.0.5", "10.0.0.7"]
        );
        assert_eq!(drops[2].reason, "attached in an earlier boot");
        assert_eq!(kept, 1);
    }
}
