//! sticky-ipam's global options, bound to the shared parser ([`sticky_primitives::args`]).

pub use sticky_primitives::args::{Parsed, Spec};

use super::CliError;

/// Options every verb accepts, each taking a value.
pub(crate) const GLOBAL_VALUES: [&str; 3] = ["--data-dir", "--network", "--config"];

/// The verb of a sticky-ipam command line.
pub fn find_verb(args: &[String]) -> Option<&str> {
    sticky_primitives::args::find_verb(args, &GLOBAL_VALUES)
}

/// Parses a sticky-ipam command line for `spec`.
pub fn parse(args: &[String], spec: &Spec) -> Result<Parsed, CliError> {
    Ok(sticky_primitives::args::parse(args, &GLOBAL_VALUES, spec)?)
}
