//! Shared helpers for the sticky-ipam process-level tests (the vxlan topology lives in
//! `tests/vxlan_support`, cnitool in `tests/cnitool_support`). Split by what each part serves:
//!
//! - [`bins`]: where the binaries under test come from, and the root check;
//! - [`call`]: running a plugin exactly as a runtime does (env + stdin, one JSON on stdout);
//! - [`conf`]: building an IPAM network config;
//! - [`snapshot`]: "nothing changed" assertions over a data dir;
//! - [`ipam_disk`]: sticky-ipam's on-disk format, seeding records, checking invariants;
//! - [`netns`]: network namespaces for root tests;
//! - [`scratch`]: temp dirs and a seeded PRNG.
//!
//! Everything is re-exported at `support::`.
pub mod bins;
pub mod call;
pub mod conf;
pub mod ipam_disk;
pub mod netns;
pub mod scratch;
pub mod snapshot;

// Each test binary uses a different subset of these.
#[allow(unused_imports)]
pub use {bins::*, call::*, conf::*, ipam_disk::*, netns::*, scratch::*, snapshot::*};
