//! Shared helpers for the process-level tests: run a plugin binary exactly as a runtime does
//! (env + stdin, one JSON on stdout), build network configs, snapshot a data dir, check the
//! on-disk invariants of a sticky-ipam data dir, and create network namespaces for root tests.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::{Value, json};

/// The plugin under test, built by `cargo test` (or `cargo build`).
pub fn sticky_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_sticky-ipam") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/sticky-ipam"),
    }
}

/// Debian's reference host-local. `None` (and a message) when it is not installed; under CI
/// its absence is a failure, since `.ci/run` installs it.
pub fn host_local_bin() -> Option<PathBuf> {
    reference_plugin("host-local")
}

/// Debian's reference plugin `name` from `/usr/lib/cni`.
pub fn reference_plugin(name: &str) -> Option<PathBuf> {
    let p = Path::new("/usr/lib/cni").join(name);
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{} is missing: install containernetworking-plugins",
            p.display()
        );
    }
    eprintln!(
        "SKIP: {} is missing (apt-get install containernetworking-plugins)",
        p.display()
    );
    None
}

/// True when running as root. Otherwise prints why the test is skipped and returns false —
/// except under CI (env `CI` set), where not being root fails the test.
pub fn require_root(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} needs root, and CI is set: run the suite as root");
    }
    eprintln!("SKIP: {what} needs root");
    false
}

// ---------------------------------------------------------------------------------------------
// Identity (CNI_ARGS)

/// A pod identity as kubelet sends it.
#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Pod {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// `CNI_ARGS` exactly as containerd's CRI plugin sends it.
    pub fn kubelet_args(&self, container_id: &str) -> String {
        let mut s = String::new();
        if !self.uid.is_empty() {
            s.push_str(&format!("K8S_POD_UID={};", self.uid));
        }
        s.push_str(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.namespace, self.name, container_id
        ));
        s
    }
}

/// `CNI_ARGS` as podman (CNI backend) sends it.
pub fn podman_args(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAME={name}")
}

// ---------------------------------------------------------------------------------------------
// Running a plugin

/// One call of a plugin binary.
#[derive(Debug, Clone)]
pub struct Call {
    pub command: String,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: String,
    pub path: Option<String>,
    pub stdin: Vec<u8>,
    pub extra_env: Vec<(String, String)>,
}

impl Call {
    pub fn new(command: &str, container_id: &str, stdin: &[u8]) -> Call {
        Call {
            command: command.into(),
            container_id: Some(container_id.into()),
            netns: Some(format!("/var/run/netns/{container_id}")),
            ifname: Some("eth0".into()),
            args: String::new(),
            path: Some("/opt/cni/bin".into()),
            stdin: stdin.to_vec(),
            extra_env: Vec::new(),
        }
    }

    pub fn add(container_id: &str, conf: &Conf) -> Call {
        Call::new("ADD", container_id, &conf.bytes())
    }

    pub fn del(container_id: &str, conf: &Conf) -> Call {
        Call::new("DEL", container_id, &conf.bytes())
    }

    pub fn check(container_id: &str, conf: &Conf) -> Call {
        Call::new("CHECK", container_id, &conf.bytes())
    }

    pub fn args(mut self, args: impl Into<String>) -> Call {
        self.args = args.into();
        self
    }

    pub fn pod(self, pod: &Pod) -> Call {
        let cid = self.container_id.clone().unwrap_or_default();
        self.args(pod.kubelet_args(&cid))
    }

    pub fn ifname(mut self, ifname: &str) -> Call {
        self.ifname = Some(ifname.into());
        self
    }

    pub fn netns(mut self, netns: &str) -> Call {
        self.netns = Some(netns.into());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Call {
        self.extra_env.push((key.into(), value.into()));
        self
    }

    fn command_for(&self, program: &Path, wrapper: &[String]) -> Command {
        let mut cmd = if wrapper.is_empty() {
            Command::new(program)
        } else {
            let mut c = Command::new(&wrapper[0]);
            c.args(&wrapper[1..]).arg(program);
            c
        };
        for var in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_ARGS",
            "CNI_PATH",
            "STICKY_CRASH_AT",
        ] {
            cmd.env_remove(var);
        }
        if !self.command.is_empty() {
            cmd.env("CNI_COMMAND", &self.command);
        }
        for (key, value) in [
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
        ] {
            if let Some(v) = value {
                cmd.env(key, v);
            }
        }
        if !self.args.is_empty() {
            cmd.env("CNI_ARGS", &self.args);
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// A plugin binary, optionally run through a wrapper command (e.g. `unshare -m ...`).
#[derive(Debug, Clone)]
pub struct Plugin {
    pub bin: PathBuf,
    pub wrapper: Vec<String>,
}

/// What one call produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// stdout parsed as one JSON value; `None` when stdout is empty.
    pub json: Option<Value>,
    pub what: String,
}

impl Plugin {
    pub fn sticky() -> Plugin {
        let bin = sticky_bin();
        assert!(
            bin.exists(),
            "{} is not built: run `cargo build` first",
            bin.display()
        );
        Plugin {
            bin,
            wrapper: Vec::new(),
        }
    }

    pub fn at(bin: impl Into<PathBuf>) -> Plugin {
        Plugin {
            bin: bin.into(),
            wrapper: Vec::new(),
        }
    }

    /// Runs the plugin in a private mount namespace where
    /// `/proc/sys/kernel/random/boot_id` reads as the content of `boot_id_file`: a simulated
    /// reboot, with no switch in the product. Root only.
    pub fn with_boot_id(mut self, boot_id_file: &Path) -> Plugin {
        self.wrapper = vec![
            "unshare".into(),
            "-m".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "mount --bind '{}' /proc/sys/kernel/random/boot_id && exec \"$0\"",
                boot_id_file.display()
            ),
        ];
        self
    }

    /// Starts the call without waiting (stdin is written and closed).
    pub fn spawn(&self, call: &Call) -> Child {
        let mut child = call
            .command_for(&self.bin, &self.wrapper)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A plugin that dies early (a crash test) closes its stdin: ignore EPIPE.
        let _ = stdin.write_all(&call.stdin);
        drop(stdin);
        child
    }

    pub fn run(&self, call: &Call) -> Outcome {
        let child = self.spawn(call);
        finish(child, describe(call))
    }
}

pub fn describe(call: &Call) -> String {
    format!(
        "{} cid={:?} if={:?} args={:?}",
        call.command,
        call.container_id.as_deref().unwrap_or(""),
        call.ifname.as_deref().unwrap_or(""),
        call.args
    )
}

/// Waits for a spawned call and parses its stdout.
pub fn finish(child: Child, what: String) -> Outcome {
    let out = child.wait_with_output().expect("wait for plugin");
    let text = String::from_utf8_lossy(&out.stdout);
    let json = if text.trim().is_empty() {
        None
    } else {
        Some(
            serde_json::from_str(text.trim())
                .unwrap_or_else(|e| panic!("{what}: stdout is not one JSON value ({e}): {text:?}")),
        )
    };
    Outcome {
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        json,
        what,
    }
}

impl Outcome {
    /// Asserts success and returns the JSON (`Null` for an empty stdout).
    pub fn ok(&self) -> Value {
        assert!(
            self.status.success(),
            "{} failed: status {:?}, stdout {}, stderr {}",
            self.what,
            self.status,
            String::from_utf8_lossy(&self.stdout),
            self.stderr
        );
        self.json.clone().unwrap_or(Value::Null)
    }

    /// Asserts success with nothing on stdout (DEL, CHECK).
    pub fn ok_empty(&self) {
        let v = self.ok();
        assert_eq!(v, Value::Null, "{}: expected no output", self.what);
    }

    /// Asserts a CNI error: non-zero exit, one error object on stdout. Returns its code.
    pub fn err_code(&self) -> u64 {
        assert!(
            !self.status.success(),
            "{} succeeded but an error was expected: stdout {}",
            self.what,
            String::from_utf8_lossy(&self.stdout)
        );
        let v = self.json.clone().unwrap_or_else(|| {
            panic!(
                "{}: failed without an error object on stdout (status {:?}, stderr {})",
                self.what, self.status, self.stderr
            )
        });
        let code = v["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: error without a numeric code: {v}", self.what));
        let msg = v["msg"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "{}: error without msg: {v}", self.what);
        assert!(
            v["cniVersion"].is_string(),
            "{}: error without cniVersion: {v}",
            self.what
        );
        code
    }

    /// Asserts the given error code.
    pub fn expect_code(&self, code: u64) {
        let got = self.err_code();
        assert_eq!(
            got,
            code,
            "{}: wrong error code; error was {}",
            self.what,
            String::from_utf8_lossy(&self.stdout)
        );
    }
}

/// The addresses (`10.1.0.5`, without prefix) of a result of any version.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Some(ips) = result["ips"].as_array() {
        for ip in ips {
            out.push(addr_of(ip["address"].as_str().expect("ips[].address")));
        }
    } else {
        for key in ["ip4", "ip6"] {
            if let Some(s) = result[key]["ip"].as_str() {
                out.push(addr_of(s));
            }
        }
    }
    out
}

/// The one address of a single-family result.
pub fn result_ip(result: &Value) -> IpAddr {
    let ips = result_ips(result);
    assert_eq!(ips.len(), 1, "expected one address in {result}");
    ips[0]
}

pub fn addr_of(cidr: &str) -> IpAddr {
    let a = cidr.split('/').next().unwrap_or("");
    a.parse()
        .unwrap_or_else(|e| panic!("bad address {cidr:?}: {e}"))
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Config builder

/// A network config for an IPAM plugin: a main plugin entry with an `ipam` section.
#[derive(Debug, Clone)]
pub struct Conf {
    pub value: Value,
}

impl Conf {
    /// `cniVersion` 1.0.0, network `name`, `ipam.type` sticky-ipam, `dataDir` set, and the
    /// given range sets.
    pub fn new(name: &str, data_dir: &Path, ranges: Value) -> Conf {
        Conf {
            value: json!({
                "cniVersion": "1.0.0",
                "name": name,
                "type": "bridge",
                "ipam": {
                    "type": "sticky-ipam",
                    "dataDir": data_dir.to_str().expect("utf-8 temp path"),
                    "ranges": ranges,
                }
            }),
        }
    }

    /// One IPv4 range set with one range.
    pub fn v4(name: &str, data_dir: &Path, subnet: &str) -> Conf {
        Conf::new(name, data_dir, json!([[{ "subnet": subnet }]]))
    }

    pub fn version(mut self, v: &str) -> Conf {
        self.value["cniVersion"] = json!(v);
        self
    }

    pub fn ipam(mut self, key: &str, v: Value) -> Conf {
        self.value["ipam"][key] = v;
        self
    }

    pub fn top(mut self, key: &str, v: Value) -> Conf {
        self.value[key] = v;
        self
    }

    pub fn prev_result(self, result: &Value) -> Conf {
        self.top("prevResult", result.clone())
    }

    pub fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).unwrap()
    }

    pub fn name(&self) -> String {
        self.value["name"].as_str().unwrap().to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots

/// Every file and directory under `root` (relative path → bytes; directories end in `/` and
/// map to nothing), for "byte-for-byte unchanged" assertions. sticky-ipam's name index
/// ([`INDEX_DIR`]) is derived data, restamped by every call that writes: left out.
pub type Snapshot = BTreeMap<String, Vec<u8>>;

pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    if root.exists() {
        walk(root, root, &mut out);
    }
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if e.file_name() == INDEX_DIR {
            continue;
        }
        let path = e.path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.insert(format!("{rel}/"), Vec::new());
            walk(root, &path, out);
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            out.insert(
                format!("{rel}@"),
                target.to_string_lossy().into_owned().into_bytes(),
            );
        } else {
            out.insert(rel, std::fs::read(&path).unwrap());
        }
    }
}

/// Asserts two snapshots are equal except for `lease_clock`, naming the differences.
///
/// `lease_clock` is the clamped clock's memory (`<clock> <wall> <next expiry>`): any call that
/// opens the store may advance it when a second has passed, so it is not part of "nothing
/// changed" for calls that reach the store. [`assert_same_strict`] compares it too.
pub fn assert_same(before: &Snapshot, after: &Snapshot, what: &str) {
    let strip = |s: &Snapshot| -> Snapshot {
        s.iter()
            .filter(|(k, _)| !k.ends_with("/lease_clock"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_same_strict(&strip(before), &strip(after), what);
}

/// Asserts two snapshots are byte-for-byte equal, naming the differences.
pub fn assert_same_strict(before: &Snapshot, after: &Snapshot, what: &str) {
    if before == after {
        return;
    }
    let mut diffs = Vec::new();
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for k in keys {
        match (before.get(k), after.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => diffs.push(format!(
                "changed {k}: {:?} -> {:?}",
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b)
            )),
            (Some(_), None) => diffs.push(format!("removed {k}")),
            (None, Some(b)) => diffs.push(format!("added {k}: {:?}", String::from_utf8_lossy(b))),
            (None, None) => {}
        }
    }
    panic!("{what}: data dir changed:\n  {}", diffs.join("\n  "));
}

// ---------------------------------------------------------------------------------------------
// The on-disk format and its invariants

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

// ---------------------------------------------------------------------------------------------
// Network namespaces (root tests)

/// A network namespace named uniquely for this process, deleted on drop (also on panic).
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("stk-{tag}-{}", std::process::id());
        // A leftover from a killed earlier run with the same pid: remove it first.
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        sh(&["ip", "netns", "add", &name]);
        Netns { name }
    }

    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace; returns its output (panics on failure).
    pub fn exec(&self, argv: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(argv);
        sh(&full)
    }

    /// Runs a command inside the namespace; returns whether it succeeded.
    pub fn try_exec(&self, argv: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs argv, panics with its stderr when it fails, returns stdout.
pub fn sh(argv: &[&str]) -> String {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Small things

/// A temp dir on disk (not tmpfs) under the target dir, removed on drop.
pub fn temp_dir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tmp");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("sticky-")
        .tempdir_in(base)
        .unwrap()
}

/// A tiny deterministic PRNG (xorshift64*), seeded and printed by the caller.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn from_time() -> (Rng, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ u64::from(std::process::id());
        (Rng::new(seed), seed)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// sticky-ipam built with the `crash-points` feature into `target/crash` (once per test
/// binary), or the binary named by `STICKY_CRASH_BIN`.
pub fn crash_bin_path() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("STICKY_CRASH_BIN") {
            return PathBuf::from(p);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/crash");
        let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
            .args([
                "build",
                "--features",
                "crash-points",
                "--bin",
                "sticky-ipam",
            ])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(root)
            .status()
            .expect("run cargo to build the crash-points binary");
        assert!(status.success(), "building the crash-points binary failed");
        target.join("debug/sticky-ipam")
    })
    .clone()
}
