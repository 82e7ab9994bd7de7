//! sticky-ipam's on-disk format as the tests read and seed it, and its invariants.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use serde_json::{Value, json};

/// Percent-encoding of a name component in a record file name: every byte outside
/// `[a-z0-9.-]` as `%XX` (upper-case hex).
pub fn encode_component(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The record file name of a sticky lease, when no shortening applies.
pub fn sticky_name(ip: IpAddr, namespace: &str, pod: &str) -> String {
    format!(
        "{ip}_{}_{}",
        encode_component(namespace),
        encode_component(pod)
    )
}

/// The parsed body of a sticky record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StickyRecord {
    pub container_id: String,
    pub ifname: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub boot: String,
    pub attached: bool,
    pub release_seq: u64,
    pub released_at: u64,
}

/// sticky-ipam's derived name index, inside a network's directory.
pub const INDEX_DIR: &str = "sticky-index";

/// sticky-ipam's own bookkeeping files beside the records (not in host-local's layout).
pub const BOOKKEEPING: &[&str] = &["release_seq", "boot_id", "lease_clock", "sticky_counters"];

/// One record file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `<ip>`: host-local's `<containerID>\r\n<ifname>`.
    Plain {
        container_id: String,
        ifname: String,
    },
    /// `<ip>_<ns>_<pod>` with a sticky-ipam/v1 body.
    Sticky(StickyRecord),
    /// `<ip>_<ns>_<pod>` empty: an OpenYurt marker (only valid beside an `<ip>` record).
    Marker,
}

/// A parsed network directory.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// file name → (ip, record)
    pub records: BTreeMap<String, (IpAddr, Record)>,
    pub tmp_files: Vec<String>,
    pub release_counter: Option<u64>,
    pub boot_id: Option<String>,
}

impl State {
    /// The file name and record holding `ip` (the non-marker one).
    pub fn by_ip(&self, ip: IpAddr) -> Option<(&String, &Record)> {
        self.records
            .iter()
            .find(|(_, (a, r))| *a == ip && *r != Record::Marker)
            .map(|(n, (_, r))| (n, r))
    }

    /// Addresses recorded in any form (markers excluded).
    pub fn ips(&self) -> BTreeSet<IpAddr> {
        self.records
            .values()
            .filter(|(_, r)| *r != Record::Marker)
            .map(|(a, _)| *a)
            .collect()
    }

    /// Sticky records attached to `container_id`.
    pub fn attached_to(&self, container_id: &str) -> Vec<IpAddr> {
        self.records
            .values()
            .filter(|(_, r)| match r {
                Record::Sticky(s) => s.attached && s.container_id == container_id,
                Record::Plain {
                    container_id: c, ..
                } => c == container_id,
                Record::Marker => false,
            })
            .map(|(a, _)| *a)
            .collect()
    }

    pub fn sticky(&self, ip: IpAddr) -> StickyRecord {
        match self.by_ip(ip) {
            Some((_, Record::Sticky(s))) => s.clone(),
            other => panic!("expected a sticky record for {ip}, found {other:?}"),
        }
    }

    pub fn released_count(&self) -> usize {
        self.records
            .values()
            .filter(|(_, r)| matches!(r, Record::Sticky(s) if !s.attached))
            .count()
    }
}

/// How strict [`check_dir`] is.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// `.tmp.*` files are allowed (right after a killed call; cleaned on the next one).
    pub allow_tmp: bool,
    /// Empty `<ip>_<ns>_<pod>` markers (OpenYurt) are allowed, except beside a sticky record.
    pub allow_markers: bool,
}

pub const COMPLETED: Rules = Rules {
    allow_tmp: false,
    allow_markers: false,
};
pub const AFTER_KILL: Rules = Rules {
    allow_tmp: true,
    allow_markers: false,
};

/// Parses every file of `<dataDir>/<network>` and asserts the invariants: every record
/// parses, its name matches its body, no address is recorded twice in any form, release
/// sequence numbers are unique and not above the counter, and (unless allowed) no `.tmp.*`.
pub fn check_dir(net_dir: &Path, rules: Rules) -> State {
    let mut state = State::default();
    if !net_dir.exists() {
        return state;
    }
    let mut seen: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(net_dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == INDEX_DIR {
            assert!(
                entry.file_type().unwrap().is_dir(),
                "{name} is not a directory"
            );
            continue;
        }
        assert!(
            entry.file_type().unwrap().is_file(),
            "{}: unexpected non-file {name:?}",
            net_dir.display()
        );
        assert!(name.len() <= 255, "file name longer than 255 bytes: {name}");
        let body = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&body).into_owned();
        if name == "lock" {
            continue;
        }
        if name.starts_with(".tmp.") {
            assert!(
                rules.allow_tmp,
                "stray temp file {name} after a completed call"
            );
            state.tmp_files.push(name);
            continue;
        }
        if let Some(n) = name.strip_prefix("last_reserved_ip.") {
            n.parse::<usize>()
                .unwrap_or_else(|_| panic!("bad hint file name {name}"));
            let t = text.trim();
            t.parse::<IpAddr>()
                .unwrap_or_else(|_| panic!("{name} holds {text:?}, not an address"));
            continue;
        }
        if name == "release_seq" {
            let n = text
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("release_seq holds {text:?}, not a counter"));
            state.release_counter = Some(n);
            continue;
        }
        if name == "boot_id" {
            state.boot_id = Some(text.trim().to_string());
            continue;
        }
        if BOOKKEEPING.contains(&name.as_str()) {
            continue;
        }
        let (ip_text, rest) = match name.split_once('_') {
            Some((a, r)) => (a, Some(r)),
            None => (name.as_str(), None),
        };
        let ip: IpAddr = ip_text
            .parse()
            .unwrap_or_else(|_| panic!("unexpected file {name:?} in {}", net_dir.display()));
        assert_eq!(ip.to_string(), ip_text, "address not canonical in {name}");
        let record = match rest {
            None => {
                let (cid, ifname) = text.split_once("\r\n").unwrap_or_else(|| {
                    panic!("{name}: not a host-local record (<id>\\r\\n<ifname>): {text:?}")
                });
                assert!(!cid.is_empty() && !ifname.is_empty(), "{name}: {text:?}");
                assert!(!ifname.contains('\n'), "{name}: trailing newline: {text:?}");
                Record::Plain {
                    container_id: cid.into(),
                    ifname: ifname.into(),
                }
            }
            Some(rest) => {
                let (ns_enc, pod_enc) = rest
                    .split_once('_')
                    .unwrap_or_else(|| panic!("{name}: no <ns>_<pod> after the address"));
                assert!(
                    !pod_enc.contains('_'),
                    "{name}: more than two '_' separators"
                );
                for c in [ns_enc, pod_enc] {
                    assert!(
                        c.bytes().all(|b| b.is_ascii_lowercase()
                            || b.is_ascii_digit()
                            || b"%.-~ABCDEF".contains(&b)),
                        "{name}: component {c:?} is not percent-encoded"
                    );
                }
                if body.is_empty() {
                    assert!(
                        rules.allow_markers,
                        "{name}: empty sticky record (only OpenYurt markers are empty)"
                    );
                    Record::Marker
                } else if is_host_local_body(&text) {
                    // An adopted host-local record renamed to its pod's name, its lease body
                    // not yet written: the plugin reads it as a marker (the pod's released
                    // lease). A torn lease body never looks like this.
                    Record::Marker
                } else {
                    let rec = parse_sticky(&name, &text);
                    for (enc, full) in [(ns_enc, &rec.namespace), (pod_enc, &rec.pod)] {
                        if enc.contains('~') {
                            let (prefix, hash) = enc.rsplit_once('~').unwrap();
                            assert_eq!(hash.len(), 16, "{name}: hash suffix not 16 hex");
                            assert!(
                                hash.bytes().all(|b| b.is_ascii_hexdigit()),
                                "{name}: hash suffix not hex"
                            );
                            assert!(
                                encode_component(full).starts_with(prefix),
                                "{name}: shortened component is not a prefix of {full:?}"
                            );
                        } else {
                            assert_eq!(
                                enc,
                                encode_component(full),
                                "{name}: name does not match the body's identity"
                            );
                        }
                    }
                    Record::Sticky(rec)
                }
            }
        };
        if record != Record::Marker {
            seen.entry(ip).or_default().push(name.clone());
        }
        state.records.insert(name, (ip, record));
    }
    for (ip, names) in &seen {
        assert_eq!(names.len(), 1, "{ip} is recorded more than once: {names:?}");
    }
    if rules.allow_markers {
        for (name, (ip, r)) in &state.records {
            // A marker beside host-local's `<ip>` record, or alone (OpenYurt keeps it after
            // DEL as the pod's reservation), but never beside a sticky record of the address.
            if *r == Record::Marker {
                assert!(
                    !matches!(state.by_ip(*ip), Some((_, Record::Sticky(_)))),
                    "marker {name} beside a sticky record of the same address"
                );
            }
        }
    }
    let mut seqs = BTreeSet::new();
    for (name, (_, r)) in &state.records {
        let Record::Sticky(s) = r else { continue };
        if s.attached {
            continue;
        }
        assert!(seqs.insert(s.release_seq), "{name}: releaseSeq reused");
        if let Some(c) = state.release_counter {
            assert!(
                s.release_seq <= c,
                "{name}: releaseSeq {} above the counter {c}",
                s.release_seq
            );
        }
    }
    state
}

/// host-local's `<containerID>\r\n<ifname>`.
fn is_host_local_body(text: &str) -> bool {
    text.split_once("\r\n").is_some_and(|(id, ifname)| {
        !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !ifname.is_empty()
            && !ifname.contains(['\r', '\n'])
    })
}

/// Parses and checks one sticky record body.
pub fn parse_sticky(name: &str, text: &str) -> StickyRecord {
    assert!(
        text.ends_with('\n') && text.matches('\n').count() == 1,
        "{name}: body must be one JSON line ending in \\n: {text:?}"
    );
    let v: Value = serde_json::from_str(text.trim_end())
        .unwrap_or_else(|e| panic!("{name}: body is not JSON ({e}): {text:?}"));
    assert_eq!(v["format"], "sticky-ipam/v1", "{name}: {text}");
    let s = |k: &str| {
        v[k].as_str()
            .unwrap_or_else(|| panic!("{name}: {k} missing or not a string: {text}"))
            .to_string()
    };
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("{name}: {k} missing or not a number: {text}"))
    };
    let state = s("state");
    let rec = StickyRecord {
        container_id: s("containerId"),
        ifname: s("ifname"),
        namespace: s("namespace"),
        pod: s("pod"),
        pod_uid: s("podUid"),
        boot: s("boot"),
        attached: match state.as_str() {
            "attached" => true,
            "released" => false,
            other => panic!("{name}: unknown state {other:?}"),
        },
        release_seq: n("releaseSeq"),
        released_at: n("releasedAt"),
    };
    if rec.attached {
        assert_eq!(rec.release_seq, 0, "{name}: attached with a releaseSeq");
        assert_eq!(rec.released_at, 0, "{name}: attached with a releasedAt");
    } else {
        assert!(rec.release_seq > 0, "{name}: released without a releaseSeq");
    }
    assert!(
        !rec.pod.is_empty(),
        "{name}: sticky record without a pod name"
    );
    rec
}

/// The body of a sticky record as the implementation writes it (for seeding).
pub fn sticky_body(rec: &StickyRecord) -> String {
    let v = json!({
        "format": "sticky-ipam/v1",
        "containerId": rec.container_id,
        "ifname": rec.ifname,
        "namespace": rec.namespace,
        "pod": rec.pod,
        "podUid": rec.pod_uid,
        "boot": rec.boot,
        "state": if rec.attached { "attached" } else { "released" },
        "releaseSeq": rec.release_seq,
        "releasedAt": rec.released_at,
    });
    format!("{v}\n")
}

/// FNV-1a 64, as the index uses it.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether the stored name index of `net_dir` would be trusted now (its stamp parses, its sum
/// holds, it names the directory's device, inode, mtime and ctime), and if so asserts that
/// its buckets hold exactly the record names in the directory: a trusted index that is wrong
/// is the one thing that could hand out an address a record holds.
pub fn check_index(net_dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let index = net_dir.join(INDEX_DIR);
    let Ok(stamp) = std::fs::read_to_string(index.join("stamp")) else {
        return false;
    };
    let Some((body, sum)) = stamp.rsplit_once("sum ") else {
        return false;
    };
    if format!("{:016x}", fnv(body.as_bytes())) != sum.trim_end() {
        return false;
    }
    let mut lines = body.lines();
    let head: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    let m = std::fs::metadata(net_dir).unwrap();
    let now = [
        m.dev() as i64,
        m.ino() as i64,
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ];
    let stamped: Vec<i64> = head[1..].iter().map(|t| t.parse().unwrap()).collect();
    if head[0] != "sticky-index/1" || stamped != now {
        return false;
    }
    let hashes: Vec<&str> = lines.next().unwrap().split(' ').collect();
    let mut by_ip = BTreeSet::new();
    let mut by_pod = BTreeSet::new();
    for (i, hash) in hashes.iter().enumerate() {
        let file = if i < 256 {
            format!("ip.{i:02x}")
        } else {
            format!("pod.{:02x}", i - 256)
        };
        let bytes = std::fs::read(index.join(&file)).unwrap_or_default();
        if format!("{:016x}", fnv(&bytes)) != *hash {
            // The call that reads this bucket lists the directory instead.
            return false;
        }
        let names = String::from_utf8(bytes).unwrap();
        let set = if i < 256 { &mut by_ip } else { &mut by_pod };
        set.extend(names.lines().map(str::to_string));
    }
    let records: BTreeSet<String> = std::fs::read_dir(net_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            let ip_part = n.split('_').next().unwrap_or_default();
            ip_part.parse::<IpAddr>().is_ok() && (!n.contains('_') || n.matches('_').count() == 2)
        })
        .collect();
    assert_eq!(
        by_ip, records,
        "trusted index (by address) differs from the records"
    );
    let named: BTreeSet<String> = records.into_iter().filter(|n| n.contains('_')).collect();
    assert_eq!(
        by_pod, named,
        "trusted index (by pod) differs from the records"
    );
    true
}

/// Writes a sticky record into `net_dir` (creating it), as a seed.
pub fn seed_sticky(net_dir: &Path, ip: IpAddr, rec: &StickyRecord) {
    std::fs::create_dir_all(net_dir).unwrap();
    std::fs::write(
        net_dir.join(sticky_name(ip, &rec.namespace, &rec.pod)),
        sticky_body(rec),
    )
    .unwrap();
}

/// A released lease of `ns/pod` with the given release order.
pub fn released(ns: &str, pod: &str, seq: u64) -> StickyRecord {
    StickyRecord {
        container_id: format!("dead{seq}"),
        ifname: "eth0".into(),
        namespace: ns.into(),
        pod: pod.into(),
        pod_uid: format!("uid-{pod}"),
        boot: current_boot_id(),
        attached: false,
        release_seq: seq,
        released_at: 1_700_000_000 + seq,
    }
}

/// The machine's boot id, as the plugin reads it.
pub fn current_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string()
}
