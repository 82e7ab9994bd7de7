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
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).map_err(exec)?;
    }
    let out = child.wait_with_output().map_err(exec)?;
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
            plugin: plugin.to_path_buf(),
            code,
            msg,
            details: field("details"),
        });
    }
    if parsed.is_none() && !text.trim().is_empty() {
        return Err(Error::IpamOutput {
            plugin: plugin.to_path_buf(),
            reason: format!("not JSON: {:?}", text.trim()),
        });
    }
    Ok(parsed)
}

/// IPAM ADD: the allocated addresses, routes and DNS.
pub fn add(call: &Call, plugin_type: &str) -> Result<CniResult, Error> {
    let plugin = find(plugin_type, &call.env.path)?;
    let value = run_at(&plugin, &call.stdin, "ADD")?.ok_or_else(|| Error::IpamOutput {
        plugin: plugin.clone(),
        reason: "ADD printed nothing".into(),
    })?;
    CniResult::from_json(&value).map_err(|e| Error::IpamOutput {
        plugin,
        reason: e.to_string(),
    })
}
