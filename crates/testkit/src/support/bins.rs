//! Where the binaries under test come from: sticky-ipam from this build, the reference
//! plugins from Debian's package, the crash-points build; and the root assertion.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The repository's root (the workspace's), where the scripts, conf examples and `target/` are.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The plugin under test, built by `cargo test` (or `cargo build`) ([`built`]).
pub fn sticky_bin() -> PathBuf {
    PathBuf::from(built("sticky-ipam"))
}

/// The workspace's binary `name` as this test run built it: in the profile directory of the
/// target dir the running test binary lives in (`<target>/debug/deps/<test>` →
/// `<target>/debug/<name>`), where `cargo test` or `cargo build` at the workspace root puts
/// every binary (`CARGO_BIN_EXE_*` names only a package's own). Panics, saying what to run,
/// when it is not there.
pub fn built(name: &str) -> &'static str {
    static FOUND: Mutex<Vec<(String, &'static str)>> = Mutex::new(Vec::new());
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = found.iter().find(|(n, _)| n == name) {
        return path;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in <target>/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (`cargo build` at the workspace root; `cargo test` there builds them too)",
        path.display()
    );
    let path: &'static str = Box::leak(path.to_string_lossy().into_owned().into_boxed_str());
    found.push((name.to_string(), path));
    path
}

/// Debian's reference host-local; panics with what to install when it is missing.
pub fn host_local_bin() -> PathBuf {
    reference_plugin("host-local")
}

/// Debian's reference plugin `name` from `/usr/lib/cni`. A test that uses it cannot do without
/// it, so its absence is a failure, with what to install (`.ci/run` installs it).
pub fn reference_plugin(name: &str) -> PathBuf {
    let p = Path::new("/usr/lib/cni").join(name);
    assert!(
        p.exists(),
        "{} is missing: apt-get install containernetworking-plugins (.ci/run installs it)",
        p.display()
    );
    p
}

/// Panics unless running as root. The tests that call it are `#[ignore = "needs root: ..."]`,
/// so a run without root reports them as skipped; they run as root with
/// `cargo nextest run --run-ignored all` (or `cargo test -- --include-ignored`), and there a
/// missing root is a failure, never a silent pass.
pub fn assert_root(what: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root ({what}): run the suite as root (scripts/test.sh), or leave out \
         --run-ignored / --include-ignored to have it reported as skipped"
    );
}

/// Panics unless the command `tool` is on `PATH`, naming the Debian package that has it
/// (`.ci/run` installs every tool the suite uses): a test that needs a tool fails without it,
/// it never passes having checked nothing.
pub fn assert_installed(tool: &str, package: &str) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    assert!(
        std::env::split_paths(&path).any(|d| d.join(tool).is_file()),
        "{tool} is not installed: apt-get install {package} (.ci/run installs it)"
    );
}

/// sticky-ipam built with the `crash-points` feature into `target/crash` (once per test
/// binary), or the binary named by `STICKY_CRASH_BIN`.
pub fn crash_bin_path() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("STICKY_CRASH_BIN") {
            return PathBuf::from(p);
        }
        let root = repo_root();
        let target = root.join("target/crash");
        let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
            .args([
                "build",
                "--package",
                "sticky-ipam",
                "--features",
                "crash-points",
                "--bin",
                "sticky-ipam",
            ])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(&root)
            .status()
            .expect("run cargo to build the crash-points binary");
        assert!(status.success(), "building the crash-points binary failed");
        target.join("debug/sticky-ipam")
    })
    .clone()
}
