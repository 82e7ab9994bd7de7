//! Where the binaries under test come from: sticky-ipam from this build, the reference
//! plugins from Debian's package, the crash-points build; and the root check.

use std::path::{Path, PathBuf};
use std::process::Command;

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
