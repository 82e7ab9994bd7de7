//! What sticky-ipam reads from the host, besides the data dir: the current boot's id (an
//! attachment made in an earlier boot cannot belong to a live sandbox) and the wall clock
//! (only for `leaseHold`, through the clamped lease clock of [`super::lifecycle`]).

use std::time::{SystemTime, UNIX_EPOCH};

/// Where the kernel publishes the current boot's id.
pub(crate) const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The current boot id, or "" when the kernel does not say (then no lease is ever judged to
/// be from an earlier boot).
pub(crate) fn current_boot() -> String {
    std::fs::read_to_string(BOOT_ID_PATH)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Wall clock in Unix seconds.
pub(crate) fn wall_clock() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
