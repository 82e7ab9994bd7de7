//! Scratch space and a seeded PRNG.

/// A temp dir on disk (not tmpfs) under the target dir, removed on drop.
pub fn temp_dir() -> tempfile::TempDir {
    let base = crate::support::bins::repo_root().join("target/test-tmp");
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

    #[allow(
        clippy::should_implement_trait,
        reason = "an endless generator: an Option per draw would only be unwrapped"
    )]
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
