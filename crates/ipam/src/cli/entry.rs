//! One row of `list`, `show` and `forget`: a record of an address as an operator reads it.
//!
//! Records of one address are read together through [`group`], so crash leftovers are
//! resolved as the plugin would. An OpenYurt marker beside host-local's `<ip>` file makes one
//! row (the marker names the pod, `<ip>` the attachment); every other record is a row of its
//! own, so an address that shows up twice means two records really hold it.
//!
//! JSON fields (every field is always present; `null` when not known for the state):
//! `network`, `ip`, `state` (`attached`, `released`, `host-local`, `marker`, `held`), `heldReason`
//! (why a `held` record cannot be read: a newer format, damage, not a regular file), `namespace`,
//! `pod`, `containerId`, `ifname`, `podUid`, `boot` (the boot id the lease was attached in),
//! `releaseSeq` (position in the release order; lowest is reclaimed first), `releasedAgo`
//! (seconds on the lease clock since the release; null
//! when the data dir has no lease clock yet, e.g. one adopted from host-local), `files` (the record's file names).

use std::net::IpAddr;

use serde::Serialize;

use crate::group::group;
use crate::host::wall_clock;
use crate::identity::Pod;
use crate::lifecycle::LeaseClock;
use crate::record::{Body, State, suffix_identity};
use crate::store::{Note, Store, StoreError};

use super::pod_text;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub network: String,
    pub ip: IpAddr,
    pub state: &'static str,
    pub held_reason: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub pod_uid: Option<String>,
    pub boot: Option<String>,
    pub release_seq: Option<u64>,
    pub released_ago: Option<u64>,
    pub files: Vec<String>,
}

pub(crate) const ATTACHED: &str = "attached";
pub(crate) const RELEASED: &str = "released";
pub const HOST_LOCAL: &str = "host-local";
pub const MARKER: &str = "marker";
/// A record this version cannot read: the address is taken until an operator looks.
pub(crate) const HELD: &str = "held";

impl Entry {
    fn new(network: &str, ip: IpAddr, state: &'static str, file: &str) -> Entry {
        Entry {
            network: network.to_string(),
            ip,
            state,
            held_reason: None,
            namespace: None,
            pod: None,
            container_id: None,
            ifname: None,
            pod_uid: None,
            boot: None,
            release_seq: None,
            released_ago: None,
            files: vec![file.to_string()],
        }
    }

    /// Whether a sandbox may be using the address (an attached lease, a host-local record, or
    /// a record that cannot be read, which may be either).
    pub(crate) fn is_attached(&self) -> bool {
        self.state == ATTACHED || self.state == HOST_LOCAL || self.state == HELD
    }

    pub(crate) fn pod_text(&self) -> String {
        match &self.pod {
            Some(pod) => pod_text(self.namespace.as_deref().unwrap_or(""), pod),
            None => "-".into(),
        }
    }

    /// The state column: `released #3 (2h ago)`, `host-local (openyurt)`, ...
    pub(crate) fn state_text(&self) -> String {
        match (self.state, self.release_seq) {
            (RELEASED, Some(seq)) => match self.released_ago {
                Some(secs) => format!("released #{seq} ({} ago)", ago(secs)),
                None => format!("released #{seq}"),
            },
            (HOST_LOCAL, _) if self.pod.is_some() => "host-local (openyurt)".into(),
            (HELD, _) => format!(
                "held ({})",
                self.held_reason.as_deref().unwrap_or("unreadable")
            ),
            (state, _) => state.into(),
        }
    }
}

/// The rows of every record of `ips`, sorted by address. `clock_now` is the lease clock, when
/// the data dir has one (every CNI call of sticky-ipam keeps it).
pub fn entries<S: Store>(
    store: &mut S,
    network: &str,
    ips: &[IpAddr],
    clock_now: Option<u64>,
) -> Result<Vec<Entry>, StoreError> {
    let mut ips = ips.to_vec();
    ips.sort();
    let mut out = Vec::new();
    for ip in ips {
        let records = group(store, ip)?;
        let mut markers: Vec<(String, Option<(String, String)>)> = records
            .iter()
            .filter(|r| r.body == Body::Marker)
            .map(|r| (r.name.clone(), r.suffix().and_then(suffix_identity)))
            .collect();
        for record in &records {
            let entry = match &record.body {
                Body::Marker => continue,
                Body::Held(why) => {
                    let mut e = Entry::new(network, ip, HELD, &record.name);
                    e.held_reason = Some(why.clone());
                    if let Some((ns, pod)) = record.suffix().and_then(suffix_identity) {
                        e.namespace = Some(ns);
                        e.pod = Some(pod);
                    }
                    e
                }
                Body::HostLocal {
                    container_id,
                    ifname,
                } => {
                    let mut e = Entry::new(network, ip, HOST_LOCAL, &record.name);
                    e.container_id = Some(container_id.clone());
                    e.ifname = ifname.clone();
                    // OpenYurt: the marker beside `<ip>` names the pod.
                    if let Some((name, identity)) = markers.pop() {
                        e.files.push(name);
                        if let Some((ns, pod)) = identity {
                            e.namespace = Some(ns);
                            e.pod = Some(pod);
                        }
                    }
                    e
                }
                Body::Lease(l) => {
                    let released = l.state == State::Released;
                    let mut e = Entry::new(
                        network,
                        ip,
                        if released { RELEASED } else { ATTACHED },
                        &record.name,
                    );
                    e.namespace = Some(l.namespace.clone());
                    e.pod = Some(l.pod.clone());
                    e.container_id = Some(l.container_id.clone());
                    e.ifname = Some(l.ifname.clone());
                    e.pod_uid = Some(l.pod_uid.clone());
                    e.boot = Some(l.boot.clone());
                    if released {
                        e.release_seq = Some(l.release_seq);
                        e.released_ago = clock_now.map(|now| now.saturating_sub(l.release_clock));
                    }
                    e
                }
            };
            out.push(entry);
        }
        for (name, identity) in markers {
            let mut e = Entry::new(network, ip, MARKER, &name);
            if let Some((ns, pod)) = identity {
                e.namespace = Some(ns);
                e.pod = Some(pod);
            }
            out.push(e);
        }
    }
    Ok(out)
}

/// The rows of `pod`'s records (on `ifname` only, when given; markers name no interface).
pub(crate) fn pod_entries<S: Store>(
    store: &mut S,
    network: &str,
    pod: &Pod,
    ifname: Option<&str>,
    clock_now: Option<u64>,
) -> Result<Vec<Entry>, StoreError> {
    let suffix = pod.suffix();
    let ips = store.index().ips_with_suffix(&suffix);
    let rows = entries(store, network, &ips, clock_now)?;
    Ok(rows
        .into_iter()
        .filter(|e| e.files.iter().any(|f| *f == format!("{}{suffix}", e.ip)))
        .filter(|e| {
            e.state == HOST_LOCAL
                || e.state == MARKER
                || e.state == HELD
                || (e.namespace.as_deref() == Some(&pod.namespace)
                    && e.pod.as_deref() == Some(&pod.name))
        })
        .filter(|e| match (ifname, &e.ifname) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        })
        .collect())
}

/// The lease clock's reading, when the data dir keeps one.
pub fn lease_clock<S: Store>(store: &S) -> Option<u64> {
    store
        .note(Note::LeaseClock)
        .map(|_| LeaseClock::advance(store, wall_clock()).now)
}

/// `42s`, `5m`, `3h`, `2d`: the largest unit that keeps two significant digits.
pub fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The first 12 characters of a container id, as `docker ps` shows them.
pub(crate) fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

/// The standard table of entries.
pub fn table(entries: &[Entry], with_network: bool) -> String {
    let mut header = vec!["IP", "POD", "STATE", "CONTAINER", "IFNAME", "UID"];
    if with_network {
        header.insert(0, "NETWORK");
    }
    let rows = entries
        .iter()
        .map(|e| {
            let mut row = vec![
                e.ip.to_string(),
                e.pod_text(),
                e.state_text(),
                e.container_id
                    .as_deref()
                    .map(short_id)
                    .unwrap_or_else(|| "-".into()),
                e.ifname.clone().unwrap_or_else(|| "-".into()),
                e.pod_uid
                    .clone()
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "-".into()),
            ];
            if with_network {
                row.insert(0, e.network.clone());
            }
            row
        })
        .collect::<Vec<_>>();
    align(&header, &rows)
}

/// Columns padded to their widest cell, two spaces apart, a header line first. Padding is
/// written by hand: `format!`'s width is a `u16`, and a pod name may be longer.
pub(crate) fn align(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(cell);
                let pad = w.saturating_sub(cell.chars().count()) + 2;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.push('\n');
        text
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    #[test]
    fn rows_by_kind() {
        let mut s = MemStore::default();
        s.put_raw(
            "10.0.0.3_ns_web",
            br#"{"format":"sticky-ipam/v1","containerId":"c1","ifname":"eth0","namespace":"ns","pod":"web","podUid":"u","boot":"b","state":"released","releaseSeq":4,"releasedAt":100}"#,
        );
        s.put_raw("10.0.0.2", b"abc\r\neth0");
        s.put_raw("10.0.0.4", b"yurt\r\neth0");
        s.put_raw("10.0.0.4_kube-system_dns", b"");
        s.put_raw("10.0.0.5_ns_gone", b"");
        let ips: Vec<IpAddr> = s.index.ips().collect();
        let rows = entries(&mut s, "net", &ips, Some(7300)).unwrap();
        let states: Vec<String> = rows.iter().map(Entry::state_text).collect();
        assert_eq!(
            states,
            [
                "host-local",
                "released #4 (2h ago)",
                "host-local (openyurt)",
                "marker"
            ]
        );
        assert_eq!(rows[2].pod_text(), "kube-system/dns");
        assert_eq!(rows[2].files.len(), 2);
        let text = table(&rows, false);
        assert!(text.starts_with("IP        POD"), "{text}");
        assert!(text.contains("10.0.0.3  ns/web"), "{text}");
    }
}
