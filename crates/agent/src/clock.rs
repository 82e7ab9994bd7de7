//! Time for the agent's loops, behind a trait so their transitions are tested without
//! sleeping: [`SystemClock`] in the program, [`FakeClock`] in tests. And the one source of
//! jitter: [`Backoff`].

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock {
    /// Monotonic time (for windows and timeouts).
    fn now(&self) -> Instant;
    /// Wall-clock seconds since the Unix epoch (for the status file and logs only).
    fn unix(&self) -> u64;
    fn sleep(&mut self, d: Duration);
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn unix(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A clock that moves only when slept on, and remembers every sleep.
#[cfg(test)]
#[derive(Debug, Clone)]
pub struct FakeClock {
    pub start: Instant,
    pub elapsed: Duration,
    pub sleeps: Vec<Duration>,
}

#[cfg(test)]
impl Default for FakeClock {
    fn default() -> FakeClock {
        FakeClock {
            start: Instant::now(),
            elapsed: Duration::ZERO,
            sleeps: Vec::new(),
        }
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed
    }
    fn unix(&self) -> u64 {
        1_800_000_000 + self.elapsed.as_secs()
    }
    fn sleep(&mut self, d: Duration) {
        self.elapsed += d;
        self.sleeps.push(d);
    }
}

/// Exponential backoff with jitter, as client-go's reflector waits between failed lists and
/// watches: from [`Backoff::MIN`] doubling to [`Backoff::MAX`], each wait spread over
/// ±50% so a fleet of agents that lost the API at the same instant does not come back at the
/// same instant. As client-go's, it starts over only after [`Backoff::RESET_AFTER`] without a
/// failure: a list that succeeds between two failed watches does not reset it (an API that
/// answers every watch with 410 is not relisted every second).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    rng: u64,
    last_failure: Option<Instant>,
}

impl Backoff {
    pub const MIN: Duration = Duration::from_secs(1);
    pub const MAX: Duration = Duration::from_secs(30);
    pub const RESET_AFTER: Duration = Duration::from_secs(120);

    /// Seeded from the standard library's per-process random state.
    pub fn new() -> Backoff {
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Backoff::seeded(seed)
    }

    pub fn seeded(seed: u64) -> Backoff {
        Backoff {
            next: Self::MIN,
            rng: seed | 1,
            last_failure: None,
        }
    }

    /// The wait after a failure at `now`, jittered; doubles the one after it, up to the cap,
    /// unless the previous failure is more than [`Backoff::RESET_AFTER`] ago.
    pub fn next_wait(&mut self, now: Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|t| now.duration_since(t) >= Self::RESET_AFTER)
        {
            self.next = Self::MIN;
        }
        self.last_failure = Some(now);
        let d = self.jitter(self.next, 0.5);
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    /// `d` ± `fraction` of it, uniformly.
    pub fn jitter(&mut self, d: Duration, fraction: f64) -> Duration {
        // xorshift64: plenty for spreading waits.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng % 1_000_000) as f64 / 1_000_000.0;
        d.mul_f64(1.0 - fraction + 2.0 * fraction * unit)
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_spread_around_the_nominal_value() {
        let mut b = Backoff::seeded(42);
        let t = Instant::now();
        let waits: Vec<Duration> = (0..8).map(|_| b.next_wait(t)).collect();
        for (i, w) in waits.iter().enumerate() {
            let nominal = (Backoff::MIN * 2u32.pow(i as u32)).min(Backoff::MAX);
            assert!(
                *w >= nominal / 2 && *w <= nominal * 3 / 2,
                "wait {i}: {w:?} is not within ±50% of {nominal:?}"
            );
        }
        // Two minutes without a failure: from the start again.
        assert!(b.next_wait(t + Backoff::RESET_AFTER) <= Backoff::MIN * 3 / 2);
    }

    #[test]
    fn two_agents_do_not_wait_in_step() {
        let a: Vec<Duration> = {
            let mut b = Backoff::seeded(1);
            (0..5).map(|_| b.next_wait(Instant::now())).collect()
        };
        let b: Vec<Duration> = {
            let mut b = Backoff::seeded(2);
            (0..5).map(|_| b.next_wait(Instant::now())).collect()
        };
        assert_ne!(a, b);
    }
}
