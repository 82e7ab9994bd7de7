//! The soak script (`scripts/soak-ipam.py`) in a reduced form, against the debug binary: 600
//! mixed ADD/DEL/GC calls from 4 parallel workers over 40 restarting pods, with the data dir
//! checked under the plugin's lock during the run and exactly at the end.

use sticky_testkit::support;

use std::process::Command;

use support::*;

#[test]
fn reduced_soak_passes() {
    assert_installed("python3", "python3");
    let bin = Plugin::sticky().bin;
    let script = sticky_testkit::support::bins::repo_root().join("scripts/soak-ipam.py");
    let tmp = temp_dir();
    let out = Command::new("python3")
        .arg(&script)
        .args(["--ops", "600", "--workers", "4", "--pods", "40"])
        .args(["--check-every", "50", "--exact-every", "150"])
        .arg("--binary")
        .arg(&bin)
        .arg("--data-dir")
        .arg(tmp.path())
        .output()
        .expect("run the soak script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "soak failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or("");
    let (passed, failed) = last
        .split_once(" passed, ")
        .unwrap_or_else(|| panic!("last line is not `N passed, M failed`: {stdout}"));
    let passed: u32 = passed.parse().expect("N passed");
    assert_eq!(failed, "0 failed", "{stdout}");
    // Locked checks every 50 calls, exact ones every 150, and the final ones: the checker ran.
    assert!(passed >= 5, "too few invariant checks ran: {stdout}");
    assert!(
        stdout.contains("ops: 600 ("),
        "every one of the 600 calls must have run: {stdout}"
    );
    assert!(
        stdout.contains("every ADD returned the pod's first address"),
        "{stdout}"
    );
}
