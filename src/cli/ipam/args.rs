//! sticky-ipam's global options, bound to the shared parser ([`crate::args`]).

pub use crate::args::{Parsed, Spec};

use super::CliError;

/// Options every verb accepts, each taking a value.
pub const GLOBAL_VALUES: [&str; 3] = ["--data-dir", "--network", "--config"];

/// The verb of a sticky-ipam command line.
pub fn find_verb(args: &[String]) -> Option<&str> {
    crate::args::find_verb(args, &GLOBAL_VALUES)
}

/// Parses a sticky-ipam command line for `spec`.
pub fn parse(args: &[String], spec: &Spec) -> Result<Parsed, CliError> {
    Ok(crate::args::parse(args, &GLOBAL_VALUES, spec)?)
}
