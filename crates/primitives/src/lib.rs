//! The primitives every sticky-cni program stands on, each knowing nothing of CNI, IPs or
//! netlink: [`program`] (how a binary runs and exits), [`args`] (the command-line parser of the
//! operator verbs and the agent), [`crash`] (crash points for the test suite, nothing without
//! the `crash-points` feature) and [`nofollow`] (the one way files are opened and written).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod args;
pub mod crash;
pub mod nofollow;
pub mod program;
