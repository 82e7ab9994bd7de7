//! The entry point shared by both plugins: read env and stdin, dispatch, print one JSON.

use std::io::{Read, Write};
use std::process::ExitCode;

use serde_json::Value;

use super::{
    CniError, CniResult, Command, Env, EnvError, NetConf, NetConfError, Version, version_reply,
};
use crate::cni::error::code;

/// One invocation, validated.
#[derive(Debug, Clone)]
pub struct Call {
    pub env: Env,
    pub conf: NetConf,
    /// stdin exactly as received: a main plugin hands it on to its IPAM plugin.
    pub stdin: Vec<u8>,
}

/// What a plugin implements; [`run`] does the rest.
pub trait Plugin {
    type Error: Into<CniError>;
    fn add(&self, call: &Call) -> Result<CniResult, Self::Error>;
    fn del(&self, call: &Call) -> Result<(), Self::Error>;
    fn check(&self, call: &Call) -> Result<(), Self::Error>;
    fn gc(&self, call: &Call) -> Result<(), Self::Error>;
    fn status(&self, call: &Call) -> Result<(), Self::Error>;
}

/// Validates the call and runs the command. `Ok(Some(json))` is printed, `Ok(None)` prints
/// nothing.
pub fn dispatch<P: Plugin>(
    plugin: &P,
    env: Result<Env, EnvError>,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    let env = env.map_err(CniError::from)?;
    if env.command == Command::Version {
        return Ok(Some(version_reply()));
    }
    let conf = NetConf::parse(stdin).map_err(|err| match (env.command, &err) {
        // A plugin whose config cannot be read cannot work: for STATUS that is "not
        // available" (50), unless the version alone is the problem.
        (Command::Status, e) if !matches!(e, NetConfError::UnsupportedVersion(_)) => {
            CniError::new(code::NOT_AVAILABLE, format!("config invalid: {err}"))
        }
        _ => CniError::from(err),
    })?;
    let version = conf.version;
    let allowed = match env.command {
        Command::Check => version.has_check(),
        Command::Gc | Command::Status => version.has_gc_status(),
        _ => true,
    };
    if !allowed {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "cniVersion {version} does not allow {}",
                env.command.as_str()
            ),
        )
        .in_version(version));
    }
    let call = Call {
        env,
        conf,
        stdin: stdin.to_vec(),
    };
    let in_version = |e: P::Error| e.into().in_version(version);
    match call.env.command {
        Command::Add => plugin
            .add(&call)
            .map(|r| Some(r.to_json(version)))
            .map_err(in_version),
        Command::Del => plugin.del(&call).map(|()| None).map_err(in_version),
        Command::Check => plugin.check(&call).map(|()| None).map_err(in_version),
        Command::Gc => plugin.gc(&call).map(|()| None).map_err(in_version),
        Command::Status => plugin.status(&call).map(|()| None).map_err(in_version),
        Command::Version => Ok(Some(version_reply())),
    }
}

/// The whole CNI side of a plugin binary: process env + stdin in, one JSON out.
pub fn run<P: Plugin>(plugin: &P) -> ExitCode {
    let env = Env::from_process();
    let mut stdin = Vec::new();
    let read = match &env {
        Ok(e) if e.command == Command::Version => Ok(0),
        _ => std::io::stdin().read_to_end(&mut stdin),
    };
    let outcome = match read {
        Ok(_) => dispatch(plugin, env, &stdin),
        Err(e) => Err(CniError::new(code::IO, format!("reading stdin: {e}"))),
    };
    let (text, status) = match outcome {
        Ok(Some(json)) => (json.to_string(), ExitCode::SUCCESS),
        Ok(None) => (String::new(), ExitCode::SUCCESS),
        Err(err) => {
            eprintln!("{err}");
            (err.to_json(), ExitCode::FAILURE)
        }
    };
    let mut out = std::io::stdout().lock();
    if !text.is_empty() && writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    status
}

/// Version of the config if it can be read, for errors raised before full parsing.
pub fn version_hint(stdin: &[u8]) -> Version {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .and_then(Version::parse)
        })
        .unwrap_or(Version::LATEST)
}
