//! Running the IPAM plugin exactly as the reference plugins do: `$CNI_PATH/<ipam.type>` with
//! the same stdin and environment (so `K8S_POD_*` in `CNI_ARGS` reach it), only
//! `CNI_COMMAND` changed when rolling back.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use super::Error;
use crate::cni::{Call, CniResult};

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
pub fn run(call: &Call, plugin_type: &str, command: &str) -> Result<Option<Value>, Error> {
    let plugin = find(plugin_type, &call.env.path)?;
    run_at(&plugin, &call.stdin, command)
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
pub fn spawn(call: &Call, plugin_type: &str, command: &str) -> Result<Pending, Error> {
    let plugin = find(plugin_type, &call.env.path)?;
    spawn_at(&plugin, &call.stdin, command)
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
