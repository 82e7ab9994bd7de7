//! The README's first command, `scripts/demo.sh`, kept honest.
//!
//! The script runs with `--no-build` against the binaries `cargo test` has just built
//! (`STICKY_BIN_DIR` = the directory of `CARGO_BIN_EXE_sticky-vxlan`, i.e. `target/debug`), so
//! the test needs no release build. From the script's output it checks what the demo claims:
//! the recreated pod got the same IP, the VTEP MAC was the same before and after its deletion,
//! the script exited 0, and no namespace (`*-demo<pid>`) nor temp dir was left behind.
//!
//! - `full_demo`: the whole demo (two netns nodes, VXLAN). It needs root, so it is
//!   `#[ignore = "needs root: ..."]`: reported as skipped without root, run as root with
//!   `cargo nextest run --run-ignored all` (scripts/test.sh does), where not being root fails it.
//! - `ipam_part`: the part that runs without root — as root through `--ipam-only`, otherwise
//!   the script's own non-root path, which must say what it skipped.
//! - `demo_installs_what_a_fresh_box_lacks`: as root (ignored like `full_demo`), with `ping`
//!   missing from `PATH` (a fresh Debian box) the demo installs it with apt-get (a recording
//!   fake here) and runs through.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The demo ends in seconds; a deadline that holds on a loaded 2-core machine (a hung demo
/// still fails, after it).
const LIMIT: Duration = Duration::from_secs(300);

struct Run {
    status: ExitStatus,
    out: String,
    pid: u32,
}

fn bin_dir() -> PathBuf {
    Path::new(sticky_testkit::support::bins::built("sticky-vxlan"))
        .parent()
        .expect("bin dir")
        .to_path_buf()
}

/// Runs the demo with `--no-build` and `args`; stops it (SIGTERM, its trap cleans up) after
/// `LIMIT`.
fn demo(args: &[&str]) -> Run {
    demo_env(args, &[])
}

/// [`demo`] with extra environment variables.
fn demo_env(args: &[&str], env: &[(&str, std::ffi::OsString)]) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");
    assert!(
        Path::new(sticky_testkit::support::bins::built("sticky-ipam")).exists(),
        "sticky-ipam not built"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("out");
    let file = File::create(&log).expect("log");
    let mut child = Command::new(&script)
        .arg("--no-build")
        .args(args)
        .env("STICKY_BIN_DIR", bin_dir())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let pid = child.id();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let s = child.wait().expect("wait");
            panic!(
                "demo.sh took more than {LIMIT:?} ({s}); output:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&log).expect("read log");
    eprintln!("--- demo.sh {args:?} ({:?}) ---\n{out}", start.elapsed());
    Run { status, out, pid }
}

/// The value after `key` on the first line containing every string of `with`.
fn value_after<'a>(out: &'a str, with: &[&str], key: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.split_once(key))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .map(|v| v.trim_end_matches([';', ':', ',']))
        .collect()
}

fn one<'a>(out: &'a str, with: &[&str], key: &str) -> &'a str {
    let v = value_after(out, with, key);
    assert_eq!(
        v.len(),
        1,
        "expected one line with {with:?} and {key:?}, found {v:?} in:\n{out}"
    );
    v[0]
}

/// Exit 0, no namespace of this run left, temp dir removed.
fn assert_clean(run: &Run) {
    assert!(
        run.status.success(),
        "demo.sh failed ({}):\n{}",
        run.status,
        run.out
    );
    let tag = format!("demo{}", run.pid);
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        let left: Vec<_> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&tag))
            .map(str::to_string)
            .collect();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
    }
    // The temp dir (mktemp's sticky-demo.XXXXXX) is named in the output; it must be gone.
    let marker = "/sticky-demo.";
    let dirs: Vec<&str> = run
        .out
        .split_whitespace()
        .filter_map(|w| w.find(marker).map(|i| (w, i + marker.len() + 6)))
        .filter(|(w, end)| w.len() >= *end)
        .map(|(w, end)| &w[..end])
        .collect();
    assert!(!dirs.is_empty(), "the temp dir is not named:\n{}", run.out);
    for dir in dirs {
        assert!(!Path::new(dir).exists(), "temp dir {dir} left behind");
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Panics unless root: the tests that call it are ignored without root (see the file's doc).
fn assert_root() {
    assert!(
        is_root(),
        "the full demo needs root (network namespaces): run the suite as root \
         (scripts/test.sh), or leave out --run-ignored / --include-ignored to have it reported \
         as skipped"
    );
}

#[test]
#[ignore = "needs root: network namespaces (the full demo)"]
fn full_demo() {
    assert_root();
    let run = demo(&[]);
    assert_clean(&run);
    let out = &run.out;

    // The recreated pod got the same IP.
    let before = one(out, &["web-0 (node-1) got"], " got ");
    let after = one(out, &["web-0 (node-1, recreated) got"], " got ");
    assert!(before.starts_with("10.244.1."), "web-0 IP {before:?}");
    assert_eq!(before, after, "web-0 did not keep its IP");
    let db = one(out, &["db-0 (node-2) got"], " got ");
    assert!(db.starts_with("10.244.2."), "db-0 IP {db:?}");

    // The VTEP MAC was the same before and after, and is the documented kept MAC.
    let mac_before = one(out, &["node-2 VTEP sticky.1 MAC:"], "MAC: ");
    let mac_after = one(
        out,
        &["node-2 VTEP sticky.1 MAC after reconcile:"],
        "reconcile: ",
    );
    assert_eq!(
        mac_before, "0a:01:c0:00:02:02",
        "kept MAC of 192.0.2.2, VNI 1"
    );
    assert_eq!(mac_before, mac_after, "the VTEP did not keep its MAC");

    // Traffic worked, broke with the VTEP gone, and came back.
    let reply = format!("reply from {}", db.split('/').next().unwrap_or(db));
    let replies = out.matches(&reply);
    assert_eq!(replies.count(), 2, "two successful pings expected:\n{out}");
    assert!(
        out.contains("no reply: web-0 (node-1) can no longer reach db-0"),
        "the break was not shown:\n{out}"
    );
    assert!(out.contains("traffic is back, node-1 was never touched"));
    // `sticky-ipam list` was shown, with the lease released and then attached again.
    assert!(
        out.contains("released #1"),
        "no released lease listed:\n{out}"
    );
    assert!(
        out.contains("default/web-0  attached"),
        "no attached lease:\n{out}"
    );
    assert!(out.contains("Summary"));
}

#[test]
fn ipam_part() {
    let run = if is_root() {
        demo(&["--ipam-only"])
    } else {
        demo(&[])
    };
    assert_clean(&run);
    let out = &run.out;

    let before = one(out, &["web-0 got"], " got ");
    let after = one(out, &["web-0 (recreated) got"], " got ");
    assert!(before.starts_with("10.244.1."), "web-0 IP {before:?}");
    assert_eq!(before, after, "web-0 did not keep its IP");
    assert!(
        out.contains("released #1"),
        "no released lease listed:\n{out}"
    );
    assert!(
        out.contains("default/web-0  attached"),
        "no attached lease:\n{out}"
    );

    // Without a pod name: host-local's behaviour, a new address after DEL + ADD.
    let first = one(out, &["ADD got", "host-local's"], "ADD got ");
    let next = one(out, &["the next ADD got"], "ADD got ");
    assert_ne!(
        first, next,
        "a pod without a name must behave as host-local"
    );

    let skipped: Vec<_> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("skipped:"))
        .collect();
    assert_eq!(skipped.len(), 1, "one 'skipped:' line expected:\n{out}");
    if is_root() {
        assert!(skipped[0].contains("--ipam-only"), "{}", skipped[0]);
    } else {
        assert!(skipped[0].contains("need root"), "{}", skipped[0]);
    }
}

/// A fresh Debian box has no `ping`: the demo installs it (apt-get) instead of stopping. `PATH`
/// is a mirror of the system's without `ping`, and `apt-get` a fake that records its arguments
/// and then makes the real `ping` appear, so nothing is installed on this machine.
#[test]
#[ignore = "needs root: network namespaces (the full demo)"]
fn demo_installs_what_a_fresh_box_lacks() {
    assert_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    for sys in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let Ok(entries) = std::fs::read_dir(sys) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name == "ping" || name == "apt-get" || bin.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), bin.join(&name));
        }
    }
    let real_ping = ["/usr/bin/ping", "/bin/ping"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("this test needs a real ping to hand out");
    let calls = dir.path().join("apt-calls");
    let fake = bin.join("apt-get");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> {calls}\ncase \"$*\" in *iputils-ping*) ln -sf {real_ping} {bin}/ping;; esac\n",
            calls = calls.display(),
            bin = bin.display()
        ),
    )
    .expect("fake apt-get");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let run = demo_env(&[], &[("PATH", bin.clone().into_os_string())]);
    assert_clean(&run);
    let recorded = std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        recorded.contains("install") && recorded.contains("iputils-ping"),
        "apt-get was not asked for iputils-ping: {recorded:?}"
    );
}
