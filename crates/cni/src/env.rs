//! The `CNI_*` environment of one call, validated per command as the spec asks.

use std::path::PathBuf;

use super::args::{Args, ArgsError};

/// The operation a runtime asked for (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    pub fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// ADD, DEL and CHECK act on one container attachment.
    pub fn is_per_container(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// Everything a plugin learns from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// `CNI_CONTAINERID`; always set for ADD, DEL and CHECK.
    pub container_id: String,
    /// `CNI_NETNS`; may be empty on DEL.
    pub netns: String,
    /// `CNI_IFNAME`; always set for ADD, DEL and CHECK.
    pub ifname: String,
    pub args: Args,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("CNI_COMMAND is not set")]
    NoCommand,
    // From here to `BadIfname`: the words of the reference plugins' skeleton (libcni 1.1), which
    // scripts written against them grep for. The bad value goes in the error's details.
    #[error("unknown CNI_COMMAND: {0}")]
    UnknownCommand(String),
    #[error("required env variables [{var}] missing")]
    Missing {
        var: &'static str,
        command: &'static str,
    },
    #[error("invalid characters in containerID")]
    BadContainerId(String),
    #[error("{}", ifname_problem(.0))]
    BadIfname(String),
    #[error(transparent)]
    Args(#[from] ArgsError),
}

/// The skeleton's words for what is wrong with an interface name.
fn ifname_problem(name: &str) -> &'static str {
    if name.is_empty() {
        "interface name is empty"
    } else if name.len() > MAX_IFNAME {
        "interface name is too long"
    } else if name == "." || name == ".." {
        "interface name is . or .."
    } else {
        "interface name contains / or : or whitespace characters"
    }
}

impl EnvError {
    /// The error's details, as the skeleton gives them.
    pub fn details(&self) -> Option<String> {
        match self {
            EnvError::BadContainerId(id) => Some(id.clone()),
            EnvError::BadIfname(name) if name.len() > MAX_IFNAME => {
                Some("interface name should be less than 16 characters".into())
            }
            _ => None,
        }
    }
}

/// Linux interface names are at most IFNAMSIZ - 1 bytes.
const MAX_IFNAME: usize = 15;

impl Env {
    /// Reads and validates the environment through `var` (so tests need no process env).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Env, EnvError> {
        let text = var("CNI_COMMAND")
            .filter(|c| !c.is_empty())
            .ok_or(EnvError::NoCommand)?;
        let command = Command::parse(&text).ok_or(EnvError::UnknownCommand(text))?;
        let required = |name: &'static str| -> Result<String, EnvError> {
            var(name)
                .filter(|v| !v.is_empty())
                .ok_or(EnvError::Missing {
                    var: name,
                    command: command.as_str(),
                })
        };
        let optional = |name: &str| var(name).unwrap_or_default();

        let (container_id, ifname) = if command.is_per_container() {
            (required("CNI_CONTAINERID")?, required("CNI_IFNAME")?)
        } else {
            (optional("CNI_CONTAINERID"), optional("CNI_IFNAME"))
        };
        let netns = match command {
            Command::Add | Command::Check => required("CNI_NETNS")?,
            _ => optional("CNI_NETNS"),
        };
        if command.is_per_container() {
            validate_container_id(&container_id)?;
            validate_ifname(&ifname)?;
        }
        let path = optional("CNI_PATH")
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        let args = Args::parse(&optional("CNI_ARGS"))?;
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }

    /// Reads the process environment.
    pub fn from_process() -> Result<Env, EnvError> {
        Env::from_vars(|name| std::env::var(name).ok())
    }
}

/// The spec's pattern: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn validate_container_id(id: &str) -> Result<(), EnvError> {
    let mut bytes = id.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(EnvError::BadContainerId(id.to_string()))
    }
}

/// The rules libcni applies before it calls a plugin.
pub fn validate_ifname(name: &str) -> Result<(), EnvError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IFNAME
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(EnvError::BadIfname(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Env, EnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_vars(|k| map.get(k).cloned())
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn add_with_everything() {
        let e = env(&ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(
            e.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }

    #[test]
    fn add_needs_netns_but_del_does_not() {
        let no_netns: Vec<_> = ADD
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect();
        assert_eq!(
            env(&no_netns),
            Err(EnvError::Missing {
                var: "CNI_NETNS",
                command: "ADD"
            })
        );
        let mut del = no_netns.clone();
        del[0] = ("CNI_COMMAND", "DEL");
        assert!(env(&del).is_ok());
    }

    #[test]
    fn status_and_version_need_only_the_command() {
        assert!(env(&[("CNI_COMMAND", "STATUS")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC")]).is_ok());
        assert_eq!(env(&[]), Err(EnvError::NoCommand));
        assert!(matches!(
            env(&[("CNI_COMMAND", "add")]),
            Err(EnvError::UnknownCommand(_))
        ));
    }

    #[test]
    fn container_id_pattern() {
        for good in ["a", "A1", "0_x.y-z", "cnitool-0123456789abcdef0123"] {
            assert!(validate_container_id(good).is_ok(), "{good}");
        }
        for bad in ["", "_a", "-a", ".a", "a/b", "a b", "../x", "a\u{e9}"] {
            assert!(validate_container_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ifname_rules() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "1234567890123456"] {
            assert!(validate_ifname(bad).is_err(), "{bad}");
        }
    }
}
