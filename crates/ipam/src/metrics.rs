//! Metrics for node_exporter's textfile collector (`metricsFile` in the ipam config).
//!
//! Every CNI call that holds the data dir rewrites the file atomically — a temp file in the
//! same directory, then a rename — so the collector never reads half a file:
//!
//! ```text
//! sticky_ipam_addresses{network="net",range_set="10.1.0.1-10.1.0.254",state="free"} 250
//! sticky_ipam_addresses{network="net",range_set="10.1.0.1-10.1.0.254",state="attached"} 3
//! sticky_ipam_addresses{network="net",range_set="10.1.0.1-10.1.0.254",state="released"} 1
//! sticky_ipam_sticky_total{network="net",result="hit"} 7
//! sticky_ipam_sticky_total{network="net",result="miss"} 2
//! ```
//!
//! Counts come from the record file names and lease bodies (a plain `<ip>` file is attached
//! without being read). The counters live in the data dir (`sticky_counters`), so they survive
//! across calls; like every Prometheus counter they may restart from zero (a lost hint file).
//! A metrics failure never fails the CNI call: it is logged on stderr.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::allocator::Allocation;
use super::config::IpamConfig;
use super::range::{RangeSet, to_int};
use super::record::{Body, State, parse_name};
use super::store::{Note, Store, StoreError};
use sticky_primitives::nofollow::{self, Durability};

#[derive(Debug, thiserror::Error)]
pub(crate) enum MetricsError {
    #[error("metricsFile {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Address counts of one range set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub free: u128,
    pub attached: u128,
    pub released: u128,
}

/// Sticky hit/miss counters, as persisted in `sticky_counters` (`<hits> <misses>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
}

impl Counters {
    pub fn read<S: Store>(store: &S) -> Counters {
        let text = store.note(Note::Counters).unwrap_or_default();
        let mut parts = text.split_whitespace().map(|t| t.parse::<u64>().ok());
        Counters {
            hits: parts.next().flatten().unwrap_or(0),
            misses: parts.next().flatten().unwrap_or(0),
        }
    }
}

/// After a CNI call, with the store still held: adds `hits`/`misses` to the persisted
/// counters and rewrites `metricsFile`, when configured. Errors are logged, never returned:
/// metrics must not fail a pod's network setup.
pub(crate) fn after_call<S: Store>(config: &IpamConfig, store: &mut S, hits: u64, misses: u64) {
    if config.metrics_file.is_some()
        && let Err(err) = write(config, store, hits, misses)
    {
        eprintln!("sticky-ipam: metrics not written: {err}");
    }
}

/// [`after_call`] for an ADD: a named pod (with stickiness on) that got every address back
/// is a hit, one that got a new or reclaimed address a miss.
pub(crate) fn after_add<S: Store>(
    config: &IpamConfig,
    store: &mut S,
    named_pod: bool,
    allocations: &[Allocation],
) {
    let named = u64::from(named_pod && config.sticky);
    let hit = u64::from(allocations.iter().all(|a| a.kept));
    after_call(config, store, named * hit, named * (1 - hit));
}

/// Adds to the counters and rewrites `metricsFile` (a no-op without one).
pub fn write<S: Store>(
    config: &IpamConfig,
    store: &mut S,
    hits: u64,
    misses: u64,
) -> Result<(), MetricsError> {
    let Some(path) = &config.metrics_file else {
        return Ok(());
    };
    let mut counters = Counters::read(store);
    if hits + misses > 0 {
        counters.hits = counters.hits.saturating_add(hits);
        counters.misses = counters.misses.saturating_add(misses);
        store.set_note(
            Note::Counters,
            &format!("{} {}", counters.hits, counters.misses),
        )?;
    }
    let mut sets = Vec::new();
    for set in &config.range_sets {
        sets.push((set.to_string(), count(store, set)?));
    }
    replace_file(path, render(&config.network, &sets, counters).as_bytes())
}

/// Free, attached and released addresses of `set`.
pub fn count<S: Store>(store: &mut S, set: &RangeSet) -> Result<Counts, StoreError> {
    let mut counts = Counts::default();
    let ips: Vec<IpAddr> = store.index().ips().filter(|ip| set.contains(*ip)).collect();
    for ip in ips {
        let mut attached = false;
        let mut released = false;
        for name in store.index().names(ip) {
            match parse_name(&name) {
                // host-local's `<ip>`: an attachment, known from the name alone.
                Some((_, None)) => attached = true,
                _ => match store.read(&name)?.map(|r| r.body) {
                    Some(Body::Lease(l)) if l.state == State::Attached => attached = true,
                    Some(Body::HostLocal { .. } | Body::Held(_)) => attached = true,
                    Some(Body::Lease(_) | Body::Marker) => released = true,
                    None => {}
                },
            }
        }
        if attached {
            counts.attached += 1;
        } else if released {
            counts.released += 1;
        }
    }
    counts.free = assignable(set).saturating_sub(counts.attached + counts.released);
    Ok(counts)
}

/// How many addresses of `set` can be handed out (gateway, network, broadcast excluded).
pub fn assignable(set: &RangeSet) -> u128 {
    set.0
        .iter()
        .map(|r| {
            let size = to_int(r.end) - to_int(r.start) + 1;
            let mut reserved: Vec<IpAddr> = [r.gateway, r.subnet.network(), r.subnet.broadcast()]
                .into_iter()
                .filter(|ip| r.contains(*ip) && r.is_reserved(*ip))
                .collect();
            reserved.sort();
            reserved.dedup();
            size.saturating_sub(reserved.len() as u128)
        })
        .sum()
}

fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The file's text, in Prometheus' text exposition format.
pub(crate) fn render(network: &str, sets: &[(String, Counts)], counters: Counters) -> String {
    let net = label(network);
    let mut out = String::new();
    out.push_str(
        "# HELP sticky_ipam_addresses Addresses of a range set by state: free (never held or \
         freed), attached (in use by a sandbox), released (kept for a pod that may come back).\n",
    );
    out.push_str("# TYPE sticky_ipam_addresses gauge\n");
    for (set, c) in sets {
        let set = label(set);
        for (state, n) in [
            ("free", c.free),
            ("attached", c.attached),
            ("released", c.released),
        ] {
            out.push_str(&format!(
                "sticky_ipam_addresses{{network=\"{net}\",range_set=\"{set}\",state=\"{state}\"}} {n}\n"
            ));
        }
    }
    out.push_str(
        "# HELP sticky_ipam_sticky_total ADDs of a named pod: hit = it got its own address back \
         (or already had it), miss = it got a new or reclaimed one.\n",
    );
    out.push_str("# TYPE sticky_ipam_sticky_total counter\n");
    for (result, n) in [("hit", counters.hits), ("miss", counters.misses)] {
        out.push_str(&format!(
            "sticky_ipam_sticky_total{{network=\"{net}\",result=\"{result}\"}} {n}\n"
        ));
    }
    out
}

/// Temp file beside `path` (a new, unpredictable name), then rename ([`nofollow::replace`]):
/// readers see the old file or the new one, and nothing is written through a link planted in
/// the directory. [`Durability::Cache`]: every call rewrites the file from the data dir, so a
/// copy a power cut loses is whole again after the next call, and a flush per call would only
/// slow every ADD and DEL down.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), MetricsError> {
    let err = |source| MetricsError::Write {
        path: path.to_path_buf(),
        source,
    };
    nofollow::ensure_replaceable(path).map_err(err)?;
    // node_exporter reads only `*.prom`: the temp name (`.<name>.<random>`) never matches.
    nofollow::replace(path, bytes, 0o644, Durability::Cache).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;
    use cni_protocol::{Args, NetConf};
    use std::fs;

    fn config(ipam: &str) -> IpamConfig {
        let doc = format!(r#"{{"cniVersion":"1.0.0","name":"net","ipam":{ipam}}}"#);
        IpamConfig::from_netconf(&NetConf::parse(doc.as_bytes()).unwrap(), &Args::default())
            .unwrap()
    }

    #[test]
    fn assignable_skips_gateway_network_broadcast() {
        let c = config(r#"{"subnet":"10.0.0.0/29"}"#);
        assert_eq!(assignable(&c.range_sets[0]), 5, ".2 .. .6");
        let c = config(r#"{"ranges":[[{"subnet":"2001:db8::/64"}]]}"#);
        assert_eq!(assignable(&c.range_sets[0]), (1u128 << 64) - 2);
    }

    #[test]
    fn counts_by_state() {
        let c = config(r#"{"subnet":"10.0.0.0/29"}"#);
        let mut s = MemStore::default();
        let lease = |state: &str| {
            format!(
                r#"{{"format":"sticky-ipam/v1","containerId":"c","ifname":"eth0","namespace":"ns","pod":"p","state":"{state}","releaseSeq":1}}"#
            )
        };
        s.put_raw("10.0.0.2", b"a\r\neth0");
        s.put_raw("10.0.0.3_ns_p", lease("attached").as_bytes());
        s.put_raw("10.0.0.4_ns_q", lease("released").as_bytes());
        s.put_raw("10.0.0.5_ns_r", b"");
        s.put_raw("10.9.0.5_ns_r", b"");
        let got = count(&mut s, &c.range_sets[0]).unwrap();
        assert_eq!(
            got,
            Counts {
                free: 1,
                attached: 2,
                released: 2
            }
        );
        let text = render("net", &[("x".into(), got)], Counters { hits: 3, misses: 1 });
        assert!(
            text.contains(
                "sticky_ipam_addresses{network=\"net\",range_set=\"x\",state=\"free\"} 1\n"
            )
        );
        assert!(text.contains("sticky_ipam_sticky_total{network=\"net\",result=\"hit\"} 3\n"));
        assert!(text.contains("# TYPE sticky_ipam_sticky_total counter\n"));
    }

    #[test]
    fn counters_accumulate_in_the_data_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.prom");
        let doc = format!(
            r#"{{"subnet":"10.0.0.0/29","metricsFile":"{}"}}"#,
            path.display()
        );
        let c = config(&doc);
        let mut s = MemStore::default();
        write(&c, &mut s, 1, 0).unwrap();
        write(&c, &mut s, 1, 1).unwrap();
        assert_eq!(Counters::read(&s), Counters { hits: 2, misses: 1 });
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("result=\"miss\"} 1\n"), "{text}");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1, "no temp left");
    }
}
