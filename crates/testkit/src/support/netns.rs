//! Network namespaces for root tests, and a command runner.

use std::process::{Command, Stdio};

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
