//! `list`: every record of a network, or of every network under the data dir.

use std::io::Write;
use std::net::IpAddr;

use crate::store::Store;

use super::args::{self, Spec};
use super::dryrun::DryRun;
use super::entry::{self, Entry};
use super::{CliError, Target, write_json};

pub const HELP: &str = "\
Usage: sticky-ipam [global options] list [--json]

Every record of the network chosen with --network/--config, or of every network under
the data dir. One row per record:

  IP         the address
  POD        namespace/pod (podman: the container name alone), - without identity
  STATE      attached             held by a live sandbox (a sticky lease)
             released #N (T ago)  kept for its pod; N is the release order (lowest is
                                  reclaimed first), T is measured on the lease clock
                                  (measures time between calls, clamped: see README)
             host-local           host-local's <ip> file (adopted, or a pod without name)
             host-local (openyurt)  <ip> file with OpenYurt's <ip>_<ns>_<pod> marker
             marker               an OpenYurt marker alone: a reservation for the pod
  CONTAINER  the container id (first 12 characters), IFNAME, UID (the pod UID)

Options:
  --json   print a JSON array instead, one object per record, with the fields
           network, ip, state (attached|released|host-local|marker), namespace, pod,
           containerId, ifname, podUid, boot, releaseSeq, releasedAgo (seconds),
           files (the record's file names); a field not known for the state is null.

Each network is read under its lock, so a listing is a consistent snapshot of it;
no record is written (not even crash leftovers are resolved). Taking the lock creates
`lock` if it is missing and removes the `.tmp.*` files of killed writers, as every
command does.

Examples:
  sticky-ipam list
  sticky-ipam --network k8s-pod-network list --json | jq '.[] | select(.state==\"released\")'";

const SPEC: Spec = Spec {
    verb: "list",
    flags: &["--json"],
    values: &[],
    repeatable: &[],
    positionals: &[],
};

pub fn run(argv: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let parsed = args::parse(argv, &SPEC)?;
    let target = Target::from_args(&parsed)?;
    let networks = target.networks()?;
    let mut all: Vec<Entry> = Vec::new();
    for network in &networks {
        match network_entries(&target, network) {
            Ok(rows) => all.extend(rows),
            // A network removed since the data dir was listed.
            Err(CliError::NoNetwork { .. }) if target.network.is_none() => {}
            Err(e) => return Err(e),
        }
    }
    if parsed.flag("--json") {
        let value = serde_json::to_value(&all).map_err(std::io::Error::other)?;
        return write_json(out, &value);
    }
    if all.is_empty() {
        writeln!(out, "no records under {}", target.data_dir.display())?;
        return Ok(());
    }
    out.write_all(entry::table(&all, target.network.is_none()).as_bytes())?;
    Ok(())
}

/// Every row of one network, read under its lock.
pub(crate) fn network_entries(target: &Target, network: &str) -> Result<Vec<Entry>, CliError> {
    let mut store = target.open_read_only(network)?;
    let now = entry::lease_clock(&store);
    let mut view = DryRun::new(&mut store);
    let ips: Vec<IpAddr> = view.index().ips().collect();
    Ok(entry::entries(&mut view, network, &ips, now)?)
}
