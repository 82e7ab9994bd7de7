//! Running the IPAM plugin exactly as the reference plugins do: `$CNI_PATH/<ipam.type>` with
//! the same stdin and environment (so `K8S_POD_*` in `CNI_ARGS` reach it), only
//! `CNI_COMMAND` changed when rolling back.
//!
//! One addition: when the `ipam` section of a `sticky-ipam` or `host-local` IPAM names no
//! range (no `ranges`, no `subnet`), this node's own subnets from the peer list are filled in
//! as its range sets. One conflist and one peers file then serve every node of a cluster.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::IpNet;
use serde_json::{Value, json};

use super::Error;
use crate::cni::{Call, CniResult};

/// IPAM plugins whose config is host-local's schema, the ones ranges may be filled in for.
const RANGE_SCHEMA: [&str; 2] = ["sticky-ipam", "host-local"];

/// How the IPAM plugin is run for this call: which plugin, with which stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipam {
    pub plugin_type: String,
    pub stdin: Vec<u8>,
}

impl Ipam {
    /// The call's stdin as received.
    pub fn verbatim(call: &Call, plugin_type: &str) -> Ipam {
        Ipam {
            plugin_type: plugin_type.to_string(),
            stdin: call.stdin.clone(),
        }
    }

    /// The call's stdin with `ipam.ranges` set to one range set per subnet of `local`.
    pub fn with_ranges(call: &Call, plugin_type: &str, local: &[IpNet]) -> Ipam {
        let mut conf = call.conf.raw.clone();
        let sets: Vec<Value> = local
            .iter()
            .map(|net| json!([{ "subnet": net.trunc().to_string() }]))
            .collect();
        conf["ipam"]["ranges"] = Value::Array(sets);
        Ipam {
            plugin_type: plugin_type.to_string(),
            stdin: conf.to_string().into_bytes(),
        }
    }

    /// `verbatim`, or `with_ranges` from `local()` when the ipam section needs them.
    pub fn for_call(
        call: &Call,
        plugin_type: &str,
        local: impl FnOnce() -> Result<Vec<IpNet>, Error>,
    ) -> Result<Ipam, Error> {
        if needs_ranges(&call.conf.raw) {
            Ok(Ipam::with_ranges(call, plugin_type, &local()?))
        } else {
            Ok(Ipam::verbatim(call, plugin_type))
        }
    }
}

/// Whether the `ipam` section is host-local's schema with no range at all.
pub fn needs_ranges(conf: &Value) -> bool {
    let ipam = &conf["ipam"];
    let empty = |key: &str| match ipam.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    ipam["type"]
        .as_str()
        .is_some_and(|t| RANGE_SCHEMA.contains(&t))
        && empty("ranges")
        && empty("subnet")
}

/// The first `<dir>/<plugin>` on `CNI_PATH` that is a file.
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, Error> {
    path.iter()
        .map(|dir| dir.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::IpamNotFound {
            plugin: plugin.to_string(),
            path: path
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
}

/// Runs the IPAM plugin for `command` and returns what it printed (parsed), if anything.
pub fn run(call: &Call, ipam: &Ipam, command: &str) -> Result<Option<Value>, Error> {
    let plugin = find(&ipam.plugin_type, &call.env.path)?;
    run_at(&plugin, &ipam.stdin, command)
}

pub fn run_at(plugin: &Path, stdin: &[u8], command: &str) -> Result<Option<Value>, Error> {
    spawn_at(plugin, stdin, command)?.wait()
}

/// An IPAM call under way: started first so it runs while this plugin does its own netlink
/// work (both take milliseconds), then waited for.
pub struct Pending {
    plugin: PathBuf,
    child: std::process::Child,
}

/// Starts the IPAM plugin for `command` without waiting for it.
pub fn spawn(call: &Call, ipam: &Ipam, command: &str) -> Result<Pending, Error> {
    let plugin = find(&ipam.plugin_type, &call.env.path)?;
    spawn_at(&plugin, &ipam.stdin, command)
}

fn spawn_at(plugin: &Path, stdin: &[u8], command: &str) -> Result<Pending, Error> {
    let exec = |source| Error::IpamExec {
        plugin: plugin.to_path_buf(),
        source,
    };
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(exec)?;
    // Dropping stdin after the write closes it, so the plugin sees EOF.
    if let Some(mut input) = child.stdin.take()
        && let Err(e) = input.write_all(stdin)
    {
        let _ = child.kill();
        let _ = child.wait();
        return Err(exec(e));
    }
    Ok(Pending {
        plugin: plugin.to_path_buf(),
        child,
    })
}

impl Pending {
    /// Waits for the plugin; its CNI error (non-zero exit) keeps its code and message.
    pub fn wait(self) -> Result<Option<Value>, Error> {
        let plugin = self.plugin;
        let out = self
            .child
            .wait_with_output()
            .map_err(|source| Error::IpamExec {
                plugin: plugin.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let parsed: Option<Value> = if text.trim().is_empty() {
            None
        } else {
            serde_json::from_str(text.trim()).ok()
        };
        if !out.status.success() {
            let field = |k: &str| {
                parsed
                    .as_ref()
                    .and_then(|v| v.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let code = parsed
                .as_ref()
                .and_then(|v| v.get("code"))
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(999);
            let msg = match field("msg") {
                m if m.is_empty() => {
                    format!("exited with {} and printed {:?}", out.status, text.trim())
                }
                m => m,
            };
            return Err(Error::Ipam {
                plugin,
                code,
                msg,
                details: field("details"),
            });
        }
        if parsed.is_none() && !text.trim().is_empty() {
            return Err(Error::IpamOutput {
                plugin,
                reason: format!("not JSON: {:?}", text.trim()),
            });
        }
        Ok(parsed)
    }

    /// Waits for an ADD and reads its result.
    pub fn result(self) -> Result<CniResult, Error> {
        let plugin = self.plugin.clone();
        let value = self.wait()?.ok_or_else(|| Error::IpamOutput {
            plugin: plugin.clone(),
            reason: "ADD printed nothing".into(),
        })?;
        CniResult::from_json(&value).map_err(|e| Error::IpamOutput {
            plugin,
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{Env, NetConf};

    fn call(ipam: Value) -> Call {
        let doc = json!({"cniVersion": "1.0.0", "name": "n", "type": "sticky-vxlan", "vni": 1, "ipam": ipam});
        let stdin = doc.to_string().into_bytes();
        let env = Env::from_vars(|k| (k == "CNI_COMMAND").then(|| "STATUS".to_string())).unwrap();
        Call {
            env,
            conf: NetConf::parse(&stdin).unwrap(),
            stdin,
        }
    }

    #[test]
    fn ranges_are_filled_only_when_a_range_schema_ipam_has_none() {
        assert!(needs_ranges(&call(json!({"type": "sticky-ipam"})).conf.raw));
        assert!(needs_ranges(
            &call(json!({"type": "host-local", "ranges": []})).conf.raw
        ));
        assert!(!needs_ranges(
            &call(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"}))
                .conf
                .raw
        ));
        assert!(!needs_ranges(
            &call(json!({"type": "sticky-ipam", "ranges": [[{"subnet": "10.0.0.0/24"}]]}))
                .conf
                .raw
        ));
        assert!(!needs_ranges(&call(json!({"type": "dhcp"})).conf.raw));
    }

    #[test]
    fn local_subnets_become_one_range_set_each_and_the_rest_is_kept() {
        let c = call(json!({"type": "sticky-ipam", "dataDir": "/d"}));
        let nets: Vec<IpNet> = vec![
            "10.244.1.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ];
        let ipam = Ipam::for_call(&c, "sticky-ipam", || Ok(nets)).unwrap();
        let sent: Value = serde_json::from_slice(&ipam.stdin).unwrap();
        assert_eq!(
            sent["ipam"],
            json!({"type": "sticky-ipam", "dataDir": "/d",
                   "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:1::/64"}]]})
        );
        assert_eq!(sent["vni"], 1);
        let verbatim = call(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"}));
        let ipam = Ipam::for_call(&verbatim, "sticky-ipam", || panic!("not asked")).unwrap();
        assert_eq!(
            ipam.stdin, verbatim.stdin,
            "a config with ranges is passed on byte for byte"
        );
    }
}
