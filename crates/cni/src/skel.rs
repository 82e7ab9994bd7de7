//! The entry point shared by both plugins: read env and stdin, dispatch, print one JSON.

use std::io::{ErrorKind, Read, Write};
use std::process::ExitCode;

use serde_json::Value;

use super::{
    CniError, CniResult, Command, Env, EnvError, NetConf, NetConfError, Version, version_reply,
};
use crate::error::code;

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
    // Errors answer in the config's version (the spec asks for the value it was given), as
    // far as the config can be read.
    let env = env.map_err(|e| CniError::from(e).in_version(version_hint(stdin)))?;
    if env.command == Command::Version {
        return Ok(Some(version_reply()));
    }
    let conf = NetConf::parse(stdin).map_err(|err| {
        match (env.command, &err) {
            // A plugin whose config cannot be read cannot work: for STATUS that is "not
            // available" (50), unless the version alone is the problem.
            (Command::Status, e) if !matches!(e, NetConfError::UnsupportedVersion(_)) => {
                CniError::new(code::NOT_AVAILABLE, format!("config invalid: {err}"))
            }
            _ => CniError::from(err),
        }
        .in_version(version_hint(stdin))
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

/// The whole CNI side of the plugin binary `program`: process env + stdin in, one JSON out.
/// It exits 0, or 1 when the command failed (the CNI error is on stdout for the runtime and
/// told on stderr as `<program>: <error>`). A runtime that stopped reading is not an error.
pub fn run<P: Plugin>(program: &str, plugin: &P) -> ExitCode {
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
    let written = answer(&mut std::io::stdout().lock(), &printed(&outcome));
    let failed = match (outcome, written) {
        (Err(err), _) => Failed::Command(err),
        (Ok(_), Err(e)) => Failed::Output(e),
        (Ok(_), Ok(())) => return ExitCode::SUCCESS,
    };
    eprintln!("{program}: {failed}");
    ExitCode::FAILURE
}

/// Writes `text` (none when empty) and a newline to `out`; a reader that has gone (a broken
/// pipe) is not an error: the work is done, its exit code stands.
fn answer(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Why a plugin binary exits 1.
#[derive(Debug, thiserror::Error)]
enum Failed {
    /// The command failed; its CNI error is on stdout for the runtime.
    #[error("{0}")]
    Command(CniError),
    #[error("writing the answer: {0}")]
    Output(std::io::Error),
}

/// What a plugin prints for `outcome`, without the final newline; it exits 0 when that is not
/// an error. Shared by [`run`] and a plugin run in process ([`super::delegate::Linked`]), so
/// both answer alike.
pub fn printed(outcome: &Result<Option<Value>, CniError>) -> String {
    match outcome {
        Ok(Some(json)) => json.to_string(),
        Ok(None) => String::new(),
        Err(err) => err.to_json(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdout whose every write fails with `kind`.
    struct Failing(ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_answer_is_one_line_and_a_reader_that_has_gone_is_no_error() {
        let mut out = Vec::new();
        answer(&mut out, "").unwrap();
        assert!(out.is_empty(), "nothing to say prints nothing");
        answer(&mut out, "{}").unwrap();
        assert_eq!(out, b"{}\n");
        assert!(answer(&mut Failing(ErrorKind::BrokenPipe), "{}").is_ok());
        let other = answer(&mut Failing(ErrorKind::StorageFull), "{}").unwrap_err();
        assert_eq!(other.kind(), ErrorKind::StorageFull);
    }

    /// A plugin that is never reached: every case below fails before dispatching.
    struct Unreached;

    impl Plugin for Unreached {
        type Error = CniError;
        fn add(&self, _: &Call) -> Result<CniResult, CniError> {
            unreachable!()
        }
        fn del(&self, _: &Call) -> Result<(), CniError> {
            unreachable!()
        }
        fn check(&self, _: &Call) -> Result<(), CniError> {
            unreachable!()
        }
        fn gc(&self, _: &Call) -> Result<(), CniError> {
            unreachable!()
        }
        fn status(&self, _: &Call) -> Result<(), CniError> {
            unreachable!()
        }
    }

    fn del_env(container_id: &str) -> Result<Env, EnvError> {
        Env::from_vars(|k| match k {
            "CNI_COMMAND" => Some("DEL".into()),
            "CNI_CONTAINERID" => Some(container_id.into()),
            "CNI_IFNAME" => Some("eth0".into()),
            _ => None,
        })
    }

    #[test]
    fn errors_before_dispatch_answer_in_the_config_version() {
        let bad_prev =
            br#"{"cniVersion":"0.3.1","name":"n","prevResult":{"ips":[{"address":"x"}]}}"#;
        let e = dispatch(&Unreached, del_env("c1"), bad_prev).unwrap_err();
        assert_eq!((e.code, e.cni_version), (code::DECODE, "0.3.1"));
        let good = br#"{"cniVersion":"0.4.0","name":"n"}"#;
        let e = dispatch(&Unreached, del_env("bad/id"), good).unwrap_err();
        assert_eq!((e.code, e.cni_version), (code::INVALID_ENV, "0.4.0"));
        let e = dispatch(&Unreached, del_env("c1"), br#"{"cniVersion":"1.0.0"}"#).unwrap_err();
        assert_eq!((e.code, e.cni_version), (code::INVALID_CONFIG, "1.0.0"));
        // A version this crate does not speak: the newest one.
        let e = dispatch(
            &Unreached,
            del_env("c1"),
            br#"{"cniVersion":"9.9.9","name":"n"}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.cni_version),
            (code::INCOMPATIBLE_VERSION, Version::LATEST.as_str())
        );
    }
}
