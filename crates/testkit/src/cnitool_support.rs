//! Runs Debian's cnitool (libcni 1.1.2, the code path containerd and CRI-O use) against the
//! plugins, inside a netns node of the vxlan_support topology, without touching the machine.
//!
//! How the sandbox is made (chosen: one long-lived helper per node, entered with `nsenter`):
//! - [`Runtime::start`] runs `ip netns exec <node> unshare -m --propagation slave sh -c …`.
//!   The script mounts a tmpfs on `/var/lib/cni` (libcni's result cache, and sticky-ipam's
//!   default data dir) and binds a temp dir of the test onto `/etc/cni` (conflists in
//!   `/etc/cni/net.d`, the peers file in `/etc/cni`), prints `ready`, then `exec cat`s its stdin.
//!   When a mount point is missing on the machine (a fresh box has neither `/var/lib/cni` nor
//!   `/etc/cni`), its parent gets an overlay whose upper layer lives in a tmpfs of the helper,
//!   and the mount point is made there: the machine's directories are never created or written.
//! - Every cnitool call runs as `nsenter --mount=/proc/<helper>/ns/mnt --net=… cnitool …`, so
//!   the cache persists across `add`, `check` and `del` of one node, exactly as on a real node.
//! - `slave` propagation lets pod namespaces created later (bind mounts under `/run/netns`)
//!   appear inside, while nothing mounted inside leaks out.
//! - The helper's stdin is a pipe held by the test: when the test ends, however it ends
//!   (panic, SIGKILL), `cat` sees EOF and exits, and the mount namespace with its tmpfs goes
//!   with it. [`Runtime`]'s `Drop` also kills it (by its pid) and waits.
//! - The test reads state inside the private mounts through `/proc/<helper>/root/…`.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha512};

/// The reference plugins chained with ours, from Debian's containernetworking-plugins.
pub const REFERENCE: [&str; 4] = ["bridge", "portmap", "loopback", "host-local"];

/// The cnitool binary (built from Debian's sources by `scripts/build-cnitool.sh`, cached). The
/// tests that call it are `#[ignore = "needs root: ..."]`; when they run (as root, with
/// `--run-ignored all`), a missing prerequisite — root, a reference plugin, cnitool's build
/// dependencies — fails them with what to install (`.ci/run` installs all of it).
pub fn prerequisites(what: &str) -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{what} needs root (network and mount namespaces): run the suite as root \
         (scripts/test.sh), or leave out --run-ignored / --include-ignored to have it reported \
         as skipped"
    );
    for p in REFERENCE {
        assert!(
            Path::new("/usr/lib/cni").join(p).exists(),
            "{what}: /usr/lib/cni/{p} is missing: apt-get install containernetworking-plugins"
        );
    }
    let script = crate::support::bins::repo_root().join("scripts/build-cnitool.sh");
    // On a fresh machine the first call builds cnitool; parallel tests (threads, or processes
    // under nextest) must not build it at the same time into the same cache file.
    let lock_path = crate::support::bins::repo_root().join("target/cnitool-build.lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{what}: scripts/build-cnitool.sh failed (apt-get install golang-go \
         golang-github-appc-cni-dev): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    drop(lock);
    let path = PathBuf::from(path);
    assert!(path.is_file(), "build-cnitool.sh printed {path:?}");
    path
}

/// A `CNI_PATH` directory: symlinks to the plugins under test (built by cargo, i.e.
/// target/debug) and to Debian's reference plugins.
pub fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("sticky-cni-path-")
        .tempdir()
        .expect("temp dir");
    let ours = [
        ("sticky-ipam", crate::support::bins::built("sticky-ipam")),
        ("sticky-vxlan", crate::support::bins::built("sticky-vxlan")),
    ];
    for (name, bin) in ours {
        std::os::unix::fs::symlink(bin, dir.path().join(name)).expect("symlink");
    }
    for name in REFERENCE {
        std::os::unix::fs::symlink(Path::new("/usr/lib/cni").join(name), dir.path().join(name))
            .expect("symlink");
    }
    dir
}

/// The container id cnitool derives from a netns path: `cnitool-` + the first 10 bytes of
/// SHA-512(path) in hex.
pub fn container_id(netns_path: &str) -> String {
    let digest = Sha512::digest(netns_path.as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// `CNI_ARGS` exactly as kubelet (containerd's CRI plugin) sends it.
pub fn kubelet_args(namespace: &str, name: &str, uid: &str, container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
         K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={container_id}"
    )
}

const HELPER: &str = r#"
set -e
scratch=$1 conf=$2
mount -t tmpfs -o mode=0700 sticky-test-scratch "$scratch"
for d in /var/lib/cni /etc/cni; do
  if [ ! -d "$d" ]; then
    parent=${d%/*}
    n=$(printf %s "$parent" | tr / _)
    mkdir "$scratch/$n.upper" "$scratch/$n.work"
    mount -t overlay sticky-test-overlay \
      -o "lowerdir=$parent,upperdir=$scratch/$n.upper,workdir=$scratch/$n.work" "$parent"
    mkdir "$d"
  fi
done
mount -t tmpfs -o mode=0755 sticky-test-cni-cache /var/lib/cni
mount --bind "$conf" /etc/cni
echo ready
exec cat >/dev/null
"#;

/// One node's runtime view: a private `/var/lib/cni` and `/etc/cni`, in the node's netns.
pub struct Runtime {
    helper: Child,
    _stdin: ChildStdin,
    pub pid: u32,
    /// Bound onto `/etc/cni` inside; `net.d/` holds the conflists.
    pub etc: tempfile::TempDir,
    scratch: tempfile::TempDir,
    cnitool: PathBuf,
    cni_path: PathBuf,
}

impl Runtime {
    /// Starts the helper inside netns `node` (a name under /run/netns).
    pub fn start(node: &str, cnitool: &Path, cni_path: &Path) -> Runtime {
        let etc = tempfile::Builder::new()
            .prefix("sticky-etc-cni-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir(etc.path().join("net.d")).expect("net.d");
        let scratch = tempfile::Builder::new()
            .prefix("sticky-scratch-")
            .tempdir()
            .expect("temp dir");
        let mut helper = Command::new("ip")
            .args([
                "netns",
                "exec",
                node,
                "unshare",
                "-m",
                "--propagation",
                "slave",
            ])
            .args(["sh", "-c", HELPER, "sticky-cni-helper"])
            .arg(scratch.path())
            .arg(etc.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the mount namespace helper");
        let stdin = helper.stdin.take().expect("stdin");
        let mut line = String::new();
        let mut stdout = BufReader::new(helper.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("read helper stdout");
        if line.trim() != "ready" {
            let _ = helper.kill();
            let _ = helper.wait();
            let mut err = String::new();
            if let Some(mut e) = helper.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("the mount namespace helper failed: {err}");
        }
        let pid = helper.id();
        // The helper is the process itself (every step execs): its namespaces are the node's
        // netns and a mount namespace of its own.
        let ns = |p: &str, kind: &str| std::fs::read_link(format!("{p}/ns/{kind}")).unwrap();
        assert_ne!(
            ns(&format!("/proc/{pid}"), "mnt"),
            ns("/proc/self", "mnt"),
            "the helper must have a mount namespace of its own"
        );
        let ino = |p: &str| std::fs::metadata(p).map(|m| m.ino()).unwrap();
        assert_eq!(
            ino(&format!("/proc/{pid}/ns/net")),
            ino(&format!("/run/netns/{node}")),
            "the helper must be in the node's netns"
        );
        Runtime {
            helper,
            _stdin: stdin,
            pid,
            etc,
            scratch,
            cnitool: cnitool.to_path_buf(),
            cni_path: cni_path.to_path_buf(),
        }
    }

    /// Writes `/etc/cni/<rel>` (e.g. `net.d/10-x.conflist`) atomically, mode 0644, root-owned.
    pub fn write_etc(&self, rel: &str, value: &Value) {
        let path = self.etc.path().join(rel);
        let tmp = self
            .etc
            .path()
            .join(format!(".{}.tmp", rel.replace('/', "_")));
        std::fs::write(&tmp, serde_json::to_string_pretty(value).unwrap()).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }

    /// Writes a raw file into `/etc/cni/<rel>` (a file copied unchanged from conf-examples/).
    pub fn write_etc_raw(&self, rel: &str, bytes: &[u8]) {
        let path = self.etc.path().join(rel);
        std::fs::write(&path, bytes).expect("write");
    }

    /// A path inside the helper's mount namespace, as seen from the test.
    pub fn inside(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.pid))
    }

    /// Runs `cnitool <cmd> <net> <netns path>` as a runtime on this node would.
    /// `env` adds `CNI_ARGS`, `CNI_IFNAME`, `CAP_ARGS`, ...
    pub fn cnitool(&self, cmd: &str, net: &str, netns: &str, env: &[(&str, &str)]) -> Output {
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", self.pid))
            .arg(format!("--net=/proc/{}/ns/net", self.pid))
            .arg("--")
            .arg(&self.cnitool)
            .args([cmd, net, netns])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("NETCONFPATH", "/etc/cni/net.d")
            .env("CNI_PATH", &self.cni_path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run cnitool")
    }

    /// `cnitool add` that must succeed; returns the printed result.
    pub fn add(&self, net: &str, netns: &str, env: &[(&str, &str)]) -> Value {
        let out = self.cnitool("add", net, netns, env);
        assert!(
            out.status.success(),
            "cnitool add {net} {netns} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "cnitool add printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `cnitool del` / `check` that must succeed.
    pub fn must(&self, cmd: &str, net: &str, netns: &str, env: &[(&str, &str)]) {
        let out = self.cnitool(cmd, net, netns, env);
        assert!(
            out.status.success(),
            "cnitool {cmd} {net} {netns} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// libcni's cached result for (network, container id, ifname), if any.
    pub fn cached(&self, net: &str, container_id: &str, ifname: &str) -> Option<Value> {
        let path = self.inside(&format!(
            "/var/lib/cni/results/{net}-{container_id}-{ifname}"
        ));
        let text = std::fs::read_to_string(path).ok()?;
        Some(serde_json::from_str(&text).expect("libcni cache is JSON"))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.helper.kill();
        let _ = self.helper.wait();
        let _ = &self.scratch;
    }
}

/// The IPv4 (or IPv6) address of a result, without prefix.
pub fn first_ip(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':') == v6)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("no IPv{} address in {result}", if v6 { 6 } else { 4 }))
        .to_string()
}

/// Pings `to` from netns `from` once per try, up to `tries` (first packets may be lost while
/// neighbours resolve).
pub fn reaches(from: &str, to: &str, tries: usize) -> bool {
    let fam = if to.contains(':') { "-6" } else { "-4" };
    (0..tries).any(|_| {
        Command::new("ip")
            .args(["netns", "exec", from, "ping", fam, "-c", "1", "-W", "2", to])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

/// `ip -j addr show` of a device in a netns (empty when the device is missing).
pub fn addrs(netns: &str, dev: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", netns, "-j", "addr", "show", "dev", dev])
        .output()
        .expect("ip");
    if !out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["scope"] == "global")
        .filter_map(|a| a["local"].as_str().map(str::to_string))
        .collect()
}
