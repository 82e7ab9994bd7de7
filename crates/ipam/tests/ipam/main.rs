//! sticky-ipam's process-level tests, one binary: each module drives the built binary as a
//! runtime does (env + stdin, one exec per call), against host-local where it must answer
//! alike. Root-only tests are `#[ignore = "needs root: ..."]`; shared helpers are in
//! `sticky-testkit`.

mod adopt;
mod bad_input;
mod bridge;
mod cli;
mod concurrency;
mod crash;
mod downgrade;
mod host_local_words;
mod hostile;
mod in_place;
mod index;
mod lifecycle;
mod props;
mod soak;
mod sticky;
