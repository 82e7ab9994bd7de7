//! The command-line parser both binaries' operator verbs use: a verb, its positional
//! arguments, `--flag`s and `--option value` (or `--option=value`), in any order. Each verb
//! names what it accepts and anything else is refused, so every mistake is reported with the
//! bad input quoted. Each tool passes its global options (accepted by every verb).
//!
//! Hand-written on purpose: eight verbs and a dozen options do not justify a dependency.

use std::collections::{BTreeMap, BTreeSet};

/// A command-line mistake. Each tool wraps it in its own error (exit code 2, usage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown option {option:?} for `{verb}`")]
    UnknownOption { verb: &'static str, option: String },
    #[error("option {0} needs a value")]
    MissingValue(&'static str),
    #[error("option {0} is given twice")]
    Repeated(&'static str),
    #[error("option {option} is given twice with the same value {value:?}")]
    RepeatedValue { option: &'static str, value: String },
    #[error("{0:?}: this option takes no value")]
    FlagWithValue(String),
    #[error("unexpected argument {arg:?} for `{verb}`")]
    ExtraArgument { verb: &'static str, arg: String },
    #[error("`{verb}` needs {what}")]
    MissingArgument {
        verb: &'static str,
        what: &'static str,
    },
}

/// What one verb accepts besides the global options.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub verb: &'static str,
    pub flags: &'static [&'static str],
    pub values: &'static [&'static str],
    /// Those of `values` that may be given more than once (each value once).
    pub repeatable: &'static [&'static str],
    /// Names of the positional arguments, in order (all required).
    pub positionals: &'static [&'static str],
}

/// A command line, checked against its verb's [`Spec`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub positionals: Vec<String>,
    flags: BTreeSet<&'static str>,
    values: BTreeMap<&'static str, Vec<String>>,
}

impl Parsed {
    pub fn flag(&self, name: &str) -> bool {
        self.flags.contains(name)
    }

    /// The value of an option (the first, for a repeatable one).
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values_of(name).first().copied()
    }

    /// Every value of a repeatable option, in the order given.
    pub fn values_of(&self, name: &str) -> Vec<&str> {
        self.values
            .get(name)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

/// The verb: the first argument that is neither an option nor an option's value (`globals`
/// take one). `None` when there is none (`--help`, `--version`, or nothing at all).
pub fn find_verb<'a>(args: &'a [String], globals: &[&str]) -> Option<&'a str> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            return iter.next().map(String::as_str);
        }
        if globals.contains(&arg.as_str()) {
            iter.next();
        } else if !arg.starts_with('-') || arg == "-" {
            return Some(arg);
        }
    }
    None
}

/// Parses `args` (without the program name) for `spec`, plus the tool's `globals` (options
/// every verb accepts, each taking a value). The verb itself, when present, is skipped as
/// the first positional.
pub fn parse(args: &[String], globals: &[&'static str], spec: &Spec) -> Result<Parsed, ArgsError> {
    let mut parsed = Parsed::default();
    let mut iter = args.iter();
    let mut verb_seen = false;
    let mut only_positionals = false;
    while let Some(arg) = iter.next() {
        if only_positionals || !arg.starts_with("--") || arg == "--" {
            if arg == "--" && !only_positionals {
                only_positionals = true;
                continue;
            }
            if arg.starts_with('-') && arg.len() > 1 && !only_positionals {
                return Err(unknown(spec, arg));
            }
            if !verb_seen && arg == spec.verb {
                verb_seen = true;
            } else {
                parsed.positionals.push(arg.clone());
            }
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if let Some(name) = globals.iter().chain(spec.values).find(|n| **n == name) {
            let value = match inline {
                Some(v) => v,
                None => iter.next().cloned().ok_or(ArgsError::MissingValue(name))?,
            };
            if value.is_empty() {
                return Err(ArgsError::MissingValue(name));
            }
            let given = parsed.values.entry(name).or_default();
            if given.contains(&value) && spec.repeatable.contains(name) {
                return Err(ArgsError::RepeatedValue {
                    option: name,
                    value,
                });
            }
            if !given.is_empty() && !spec.repeatable.contains(name) {
                return Err(ArgsError::Repeated(name));
            }
            given.push(value);
        } else if let Some(name) = spec.flags.iter().find(|n| **n == name) {
            if inline.is_some() {
                return Err(ArgsError::FlagWithValue(arg.clone()));
            }
            parsed.flags.insert(name);
        } else {
            return Err(unknown(spec, arg));
        }
    }
    if let Some(extra) = parsed.positionals.get(spec.positionals.len()) {
        return Err(ArgsError::ExtraArgument {
            verb: spec.verb,
            arg: extra.clone(),
        });
    }
    if let Some(missing) = spec.positionals.get(parsed.positionals.len()) {
        return Err(ArgsError::MissingArgument {
            verb: spec.verb,
            what: missing,
        });
    }
    Ok(parsed)
}

fn unknown(spec: &Spec, arg: &str) -> ArgsError {
    ArgsError::UnknownOption {
        verb: spec.verb,
        option: arg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: Spec = Spec {
        verb: "show",
        flags: &["--json"],
        values: &["--ifname", "--label"],
        repeatable: &["--label"],
        positionals: &["<namespace>/<pod>"],
    };

    const GLOBALS: [&str; 3] = ["--data-dir", "--network", "--config"];

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_anywhere_in_both_spellings() {
        let a = args(&[
            "--data-dir",
            "/d",
            "show",
            "ns/p",
            "--ifname=net1",
            "--json",
        ]);
        assert_eq!(find_verb(&a, &GLOBALS), Some("show"));
        let p = parse(&a, &GLOBALS, &SHOW).unwrap();
        assert_eq!(p.positionals, ["ns/p"]);
        assert_eq!(p.value("--data-dir"), Some("/d"));
        assert_eq!(p.value("--ifname"), Some("net1"));
        assert!(p.flag("--json") && !p.flag("--force"));
        assert_eq!(
            find_verb(&args(&["--network", "list", "show"]), &GLOBALS),
            Some("show")
        );
        assert_eq!(find_verb(&args(&["--help"]), &GLOBALS), None);
    }

    #[test]
    fn mistakes_quote_the_input() {
        let err = |list: &[&str]| parse(&args(list), &GLOBALS, &SHOW).unwrap_err().to_string();
        assert!(err(&["show", "a/b", "--force"]).contains("\"--force\""));
        assert!(err(&["show", "a/b", "-x"]).contains("\"-x\""));
        assert!(err(&["show", "a/b", "c/d"]).contains("\"c/d\""));
        assert!(err(&["show"]).contains("<namespace>/<pod>"));
        assert!(err(&["show", "a/b", "--ifname"]).contains("--ifname"));
        assert!(err(&["show", "a/b", "--json=yes"]).contains("--json=yes"));
        assert!(err(&["show", "a/b", "--network", "x", "--network=y"]).contains("--network"));
        let p = parse(&args(&["show", "--", "-odd"]), &GLOBALS, &SHOW).unwrap();
        assert_eq!(p.positionals, ["-odd"]);
        assert!(err(&["show", "a/b", "--label", "x", "--label=x"]).contains("\"x\""));
    }

    #[test]
    fn a_repeatable_option_keeps_every_value_in_order() {
        let p = parse(
            &args(&["show", "a/b", "--label", "x", "--label=y", "--label", "w"]),
            &GLOBALS,
            &SHOW,
        )
        .unwrap();
        assert_eq!(p.values_of("--label"), ["x", "y", "w"]);
        assert_eq!(p.value("--label"), Some("x"));
        assert!(p.values_of("--ifname").is_empty());
    }
}
