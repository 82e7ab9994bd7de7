//! Running a delegated plugin (the IPAM plugin of a main plugin) exactly as libcni's `invoke`
//! package and the reference plugins do: `$CNI_PATH/<type>` with the caller's stdin and
//! environment (so `K8S_POD_*` in `CNI_ARGS` reach it), only `CNI_COMMAND` set per call.
//!
//! Executing is behind [`Exec`] ([`Process`] is the real one), so what a plugin's answer
//! means ([`read_answer`]) and the callers' decisions are tested without running anything.
//! [`Linked`] runs a plugin compiled into the caller's own binary the same way: the
//! environment the exec'd plugin would get (`CNI_COMMAND` replaced), the same stdin, its
//! JSON answer read by the same [`read_answer`], on a thread so that it still runs while the
//! caller does its own work.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use serde_json::Value;

use super::skel::{self, Plugin};
use super::{Call, CniError, CniResult, Env};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("IPAM plugin {plugin:?} was not found in CNI_PATH ({path})")]
    NotFound { plugin: String, path: String },
    #[error("running IPAM plugin {plugin}: {source}")]
    Exec {
        plugin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The plugin answered with a CNI error (or exited non-zero): its code and words are kept.
    #[error("IPAM plugin {plugin} failed: {msg}")]
    Failed {
        plugin: PathBuf,
        code: u32,
        msg: String,
        details: String,
    },
    #[error("IPAM plugin {plugin} printed something that is not a CNI result: {reason}")]
    Output { plugin: PathBuf, reason: String },
}

/// What a finished plugin left: whether it exited 0, and its stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub success: bool,
    pub status: String,
    pub stdout: Vec<u8>,
}

/// Starts plugins; [`Exec::Running`] is one under way.
pub trait Exec {
    type Running: Running;
    /// Starts `plugin` for `command` with `stdin`, without waiting for it.
    fn start(&self, plugin: &Path, command: &str, stdin: &[u8]) -> Result<Self::Running, Error>;
}

/// A plugin under way.
pub trait Running {
    fn finish(self) -> Result<Answer, Error>;
}

/// Runs plugins as processes.
pub struct Process;

/// A plugin process under way: started first so it runs while the caller does its own work
/// (both take milliseconds), then waited for.
pub struct Child {
    plugin: PathBuf,
    child: std::process::Child,
}

impl Exec for Process {
    type Running = Child;

    fn start(&self, plugin: &Path, command: &str, stdin: &[u8]) -> Result<Child, Error> {
        let exec = |source| Error::Exec {
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
        Ok(Child {
            plugin: plugin.to_path_buf(),
            child,
        })
    }
}

impl Running for Child {
    fn finish(self) -> Result<Answer, Error> {
        let out = self
            .child
            .wait_with_output()
            .map_err(|source| Error::Exec {
                plugin: self.plugin.clone(),
                source,
            })?;
        Ok(Answer {
            success: out.status.success(),
            status: out.status.to_string(),
            stdout: out.stdout,
        })
    }
}

/// Runs plugin `P`, compiled into this binary, in this process: what it answers is what the
/// exec'd plugin would print, for the environment it would see.
pub struct Linked<P>(pub P);

/// A linked plugin under way on its own thread.
pub struct LinkedRun {
    plugin: PathBuf,
    thread: JoinHandle<Result<Option<Value>, CniError>>,
}

impl<P: Plugin + Clone + Send + 'static> Exec for Linked<P> {
    type Running = LinkedRun;

    fn start(&self, plugin: &Path, command: &str, stdin: &[u8]) -> Result<LinkedRun, Error> {
        // The environment a child would inherit, CNI_COMMAND replaced (see Process).
        let env = Env::from_vars(|name| match name {
            "CNI_COMMAND" => Some(command.to_string()),
            _ => std::env::var(name).ok(),
        });
        let (linked, stdin) = (self.0.clone(), stdin.to_vec());
        let thread = std::thread::Builder::new()
            .name("ipam".into())
            .spawn(move || skel::dispatch(&linked, env, &stdin))
            .map_err(|source| Error::Exec {
                plugin: plugin.to_path_buf(),
                source,
            })?;
        Ok(LinkedRun {
            plugin: plugin.to_path_buf(),
            thread,
        })
    }
}

impl Running for LinkedRun {
    fn finish(self) -> Result<Answer, Error> {
        let outcome = self.thread.join().map_err(|_| Error::Exec {
            plugin: self.plugin.clone(),
            source: std::io::Error::other("the linked plugin panicked"),
        })?;
        // Exactly what skel::run would have printed and told, and its exit status.
        let text = skel::printed(&outcome);
        let success = outcome.is_ok();
        if let Err(err) = &outcome {
            let name = self
                .plugin
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            eprintln!("{name}: {err}");
        }
        Ok(Answer {
            success,
            status: format!("linked: {}", if success { "success" } else { "failure" }),
            stdout: text.into_bytes(),
        })
    }
}

/// The first `<dir>/<plugin>` on `CNI_PATH` that is a file.
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, Error> {
    path.iter()
        .map(|dir| dir.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::NotFound {
            plugin: plugin.to_string(),
            path: path
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
}

/// What a plugin's answer means: its JSON output (if any), or its CNI error with code and
/// message kept, or an error saying the output is not JSON.
pub fn read_answer(plugin: &Path, answer: &Answer) -> Result<Option<Value>, Error> {
    let text = String::from_utf8_lossy(&answer.stdout);
    let text = text.trim();
    let parsed: Option<Value> = if text.is_empty() {
        None
    } else {
        serde_json::from_str(text).ok()
    };
    if !answer.success {
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
            m if m.is_empty() => format!("exited with {} and printed {text:?}", answer.status),
            m => m,
        };
        return Err(Error::Failed {
            plugin: plugin.to_path_buf(),
            code,
            msg,
            details: field("details"),
        });
    }
    if parsed.is_none() && !text.is_empty() {
        return Err(Error::Output {
            plugin: plugin.to_path_buf(),
            reason: format!("not JSON: {text:?}"),
        });
    }
    Ok(parsed)
}

/// An ADD's answer as a result.
pub fn read_result(plugin: &Path, answer: &Answer) -> Result<CniResult, Error> {
    let output = |reason: String| Error::Output {
        plugin: plugin.to_path_buf(),
        reason,
    };
    let value = read_answer(plugin, answer)?.ok_or_else(|| output("ADD printed nothing".into()))?;
    CniResult::from_json(&value).map_err(|e| output(e.to_string()))
}

/// One delegated call under way.
pub struct Pending<R> {
    plugin: PathBuf,
    running: R,
}

impl<R: Running> Pending<R> {
    /// Waits for it and reads its answer.
    pub fn wait(self) -> Result<Option<Value>, Error> {
        read_answer(&self.plugin, &self.running.finish()?)
    }

    /// Waits for an ADD and reads its result.
    pub fn result(self) -> Result<CniResult, Error> {
        read_result(&self.plugin, &self.running.finish()?)
    }
}

/// Starts `plugin_type` (found on the call's `CNI_PATH`) for `command` with `stdin`.
pub fn start<E: Exec>(
    exec: &E,
    call: &Call,
    plugin_type: &str,
    command: &str,
    stdin: &[u8],
) -> Result<Pending<E::Running>, Error> {
    let plugin = find(plugin_type, &call.env.path)?;
    let running = exec.start(&plugin, command, stdin)?;
    Ok(Pending { plugin, running })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin compiled in: GC succeeds, STATUS says it is not available.
    #[derive(Clone)]
    struct Compiled;

    impl Plugin for Compiled {
        type Error = CniError;
        fn add(&self, _: &Call) -> Result<CniResult, CniError> {
            unreachable!("not asked")
        }
        fn del(&self, _: &Call) -> Result<(), CniError> {
            unreachable!("not asked")
        }
        fn check(&self, _: &Call) -> Result<(), CniError> {
            unreachable!("not asked")
        }
        fn gc(&self, call: &Call) -> Result<(), CniError> {
            assert_eq!(call.env.command, super::super::Command::Gc);
            Ok(())
        }
        fn status(&self, _: &Call) -> Result<(), CniError> {
            Err(CniError::new(50, "the data dir is full"))
        }
    }

    #[test]
    fn a_linked_plugin_answers_as_the_exec_would_have() {
        let p = Path::new("/opt/cni/bin/compiled");
        let stdin = br#"{"cniVersion":"1.1.0","name":"n","type":"compiled"}"#;
        let run = |command: &str| {
            let answer = Linked(Compiled)
                .start(p, command, stdin)
                .unwrap()
                .finish()
                .unwrap();
            read_answer(p, &answer)
        };
        assert_eq!(run("GC").unwrap(), None);
        let err = run("STATUS").unwrap_err();
        assert!(
            matches!(&err, Error::Failed { code: 50, msg, .. } if msg == "the data dir is full"),
            "{err:?}"
        );
        // The config is checked by the plugin, as by its binary: GC in 0.4.0 is refused.
        let old = br#"{"cniVersion":"0.4.0","name":"n","type":"compiled"}"#;
        let answer = Linked(Compiled)
            .start(p, "GC", old)
            .unwrap()
            .finish()
            .unwrap();
        assert!(!answer.success);
        assert!(matches!(read_answer(p, &answer), Err(Error::Failed { .. })));
    }

    fn answer(success: bool, out: &str) -> Answer {
        Answer {
            success,
            status: if success {
                "exit status: 0"
            } else {
                "exit status: 1"
            }
            .into(),
            stdout: out.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_cni_error_keeps_its_code_and_words() {
        let p = Path::new("/x/ipam");
        let err = read_answer(
            p,
            &answer(false, r#"{"code":100,"msg":"range full","details":"d"}"#),
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Failed { code: 100, msg, details, .. } if msg == "range full" && details == "d"),
            "{err:?}"
        );
        let err = read_answer(p, &answer(false, "boom")).unwrap_err();
        assert!(
            matches!(&err, Error::Failed { code: 999, msg, .. } if msg.contains("boom")),
            "{err:?}"
        );
    }

    #[test]
    fn garbage_and_silence_are_told_apart_from_results() {
        let p = Path::new("/x/ipam");
        assert!(matches!(
            read_answer(p, &answer(true, "not json")),
            Err(Error::Output { .. })
        ));
        assert_eq!(read_answer(p, &answer(true, "  ")).unwrap(), None);
        let err = read_result(p, &answer(true, "")).unwrap_err();
        assert!(err.to_string().contains("ADD printed nothing"), "{err}");
        let err = read_result(p, &answer(true, r#"{"ips":"10.0.0.1/24"}"#)).unwrap_err();
        assert!(
            !err.to_string().contains("prevResult"),
            "an ADD output is not a prevResult: {err}"
        );
        let ok = read_result(
            p,
            &answer(
                true,
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}"#,
            ),
        )
        .unwrap();
        assert_eq!(ok.ips.len(), 1);
    }
}
