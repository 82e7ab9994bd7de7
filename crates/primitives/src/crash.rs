//! Crash points for the crash-safety tests.
//!
//! With the `crash-points` feature (never in release packages), `STICKY_CRASH_AT=<n>` makes the
//! process abort, as SIGKILL would, when it reaches the n-th crash point of the call; steps are
//! counted from 1. Without the feature, [`point`] compiles to nothing.

#[cfg(feature = "crash-points")]
pub fn point(step: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static REACHED: AtomicUsize = AtomicUsize::new(0);
    let n = REACHED.fetch_add(1, Ordering::SeqCst) + 1;
    let target = std::env::var("STICKY_CRASH_AT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if target == Some(n) {
        eprintln!("crash point {n} ({step}): aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn point(_step: &str) {}
