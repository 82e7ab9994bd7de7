//! Running a plugin binary exactly as a runtime does: env + stdin, one JSON on stdout.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::Value;

use super::bins::sticky_bin;
use super::conf::Conf;

/// A pod identity as kubelet sends it.
#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Pod {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// `CNI_ARGS` exactly as containerd's CRI plugin sends it.
    pub fn kubelet_args(&self, container_id: &str) -> String {
        let mut s = String::new();
        if !self.uid.is_empty() {
            s.push_str(&format!("K8S_POD_UID={};", self.uid));
        }
        s.push_str(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.namespace, self.name, container_id
        ));
        s
    }
}

/// `CNI_ARGS` as podman (CNI backend) sends it.
pub fn podman_args(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAME={name}")
}

// ---------------------------------------------------------------------------------------------
// Running a plugin

/// One call of a plugin binary.
#[derive(Debug, Clone)]
pub struct Call {
    pub command: String,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: String,
    pub path: Option<String>,
    pub stdin: Vec<u8>,
    pub extra_env: Vec<(String, String)>,
}

impl Call {
    pub fn new(command: &str, container_id: &str, stdin: &[u8]) -> Call {
        Call {
            command: command.into(),
            container_id: Some(container_id.into()),
            netns: Some(format!("/var/run/netns/{container_id}")),
            ifname: Some("eth0".into()),
            args: String::new(),
            path: Some("/opt/cni/bin".into()),
            stdin: stdin.to_vec(),
            extra_env: Vec::new(),
        }
    }

    pub fn add(container_id: &str, conf: &Conf) -> Call {
        Call::new("ADD", container_id, &conf.bytes())
    }

    pub fn del(container_id: &str, conf: &Conf) -> Call {
        Call::new("DEL", container_id, &conf.bytes())
    }

    pub fn check(container_id: &str, conf: &Conf) -> Call {
        Call::new("CHECK", container_id, &conf.bytes())
    }

    pub fn args(mut self, args: impl Into<String>) -> Call {
        self.args = args.into();
        self
    }

    pub fn pod(self, pod: &Pod) -> Call {
        let cid = self.container_id.clone().unwrap_or_default();
        self.args(pod.kubelet_args(&cid))
    }

    pub fn ifname(mut self, ifname: &str) -> Call {
        self.ifname = Some(ifname.into());
        self
    }

    pub fn netns(mut self, netns: &str) -> Call {
        self.netns = Some(netns.into());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Call {
        self.extra_env.push((key.into(), value.into()));
        self
    }

    fn command_for(&self, program: &Path, wrapper: &[String]) -> Command {
        let mut cmd = if wrapper.is_empty() {
            Command::new(program)
        } else {
            let mut c = Command::new(&wrapper[0]);
            c.args(&wrapper[1..]).arg(program);
            c
        };
        for var in RUNTIME_VARS {
            cmd.env_remove(var);
        }
        if !self.command.is_empty() {
            cmd.env("CNI_COMMAND", &self.command);
        }
        for (key, value) in [
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
        ] {
            if let Some(v) = value {
                cmd.env(key, v);
            }
        }
        if !self.args.is_empty() {
            cmd.env("CNI_ARGS", &self.args);
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// What a runtime (or a crash test) sets: removed before every run, so the test's own
/// environment never leaks into a call or an operator's command.
pub const RUNTIME_VARS: [&str; 7] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    "STICKY_CRASH_AT",
];

/// Runs an operator's command (no runtime variables) and returns its exit code, stdout and
/// stderr.
pub fn run_tool(mut cmd: Command) -> (i32, String, String) {
    for var in RUNTIME_VARS {
        cmd.env_remove(var);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A plugin binary, optionally run through a wrapper command (e.g. `unshare -m ...`).
#[derive(Debug, Clone)]
pub struct Plugin {
    pub bin: PathBuf,
    pub wrapper: Vec<String>,
}

/// What one call produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// stdout parsed as one JSON value; `None` when stdout is empty.
    pub json: Option<Value>,
    pub what: String,
}

impl Plugin {
    pub fn sticky() -> Plugin {
        let bin = sticky_bin();
        assert!(
            bin.exists(),
            "{} is not built: run `cargo build` first",
            bin.display()
        );
        Plugin {
            bin,
            wrapper: Vec::new(),
        }
    }

    pub fn at(bin: impl Into<PathBuf>) -> Plugin {
        Plugin {
            bin: bin.into(),
            wrapper: Vec::new(),
        }
    }

    /// Runs the plugin in a private mount namespace where
    /// `/proc/sys/kernel/random/boot_id` reads as the content of `boot_id_file`: a simulated
    /// reboot, with no switch in the product. Root only.
    pub fn with_boot_id(mut self, boot_id_file: &Path) -> Plugin {
        self.wrapper = vec![
            "unshare".into(),
            "-m".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "mount --bind '{}' /proc/sys/kernel/random/boot_id && exec \"$0\"",
                boot_id_file.display()
            ),
        ];
        self
    }

    /// The same plugin run under `strace -f -e trace=<syscalls>`, its log written to `log`.
    /// Panics when strace is not installed.
    pub fn traced(&self, syscalls: &str, log: &Path) -> Plugin {
        super::bins::assert_installed("strace", "strace");
        Plugin {
            bin: self.bin.clone(),
            wrapper: vec![
                "strace".into(),
                "-f".into(),
                "-qq".into(),
                "-e".into(),
                format!("trace={syscalls}"),
                "-o".into(),
                log.to_str().expect("UTF-8 log path").into(),
            ],
        }
    }

    /// Starts the call without waiting (stdin is written and closed).
    pub fn spawn(&self, call: &Call) -> Child {
        let mut child = call
            .command_for(&self.bin, &self.wrapper)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A plugin that dies early (a crash test) closes its stdin: ignore EPIPE.
        let _ = stdin.write_all(&call.stdin);
        drop(stdin);
        child
    }

    pub fn run(&self, call: &Call) -> Outcome {
        let child = self.spawn(call);
        finish(child, describe(call))
    }
}

pub fn describe(call: &Call) -> String {
    format!(
        "{} cid={:?} if={:?} args={:?}",
        call.command,
        call.container_id.as_deref().unwrap_or(""),
        call.ifname.as_deref().unwrap_or(""),
        call.args
    )
}

/// Waits for a spawned call and parses its stdout.
pub fn finish(child: Child, what: String) -> Outcome {
    let out = child.wait_with_output().expect("wait for plugin");
    let text = String::from_utf8_lossy(&out.stdout);
    let json = if text.trim().is_empty() {
        None
    } else {
        Some(
            serde_json::from_str(text.trim())
                .unwrap_or_else(|e| panic!("{what}: stdout is not one JSON value ({e}): {text:?}")),
        )
    };
    Outcome {
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        json,
        what,
    }
}

impl Outcome {
    /// Asserts success and returns the JSON (`Null` for an empty stdout).
    pub fn ok(&self) -> Value {
        assert!(
            self.status.success(),
            "{} failed: status {:?}, stdout {}, stderr {}",
            self.what,
            self.status,
            String::from_utf8_lossy(&self.stdout),
            self.stderr
        );
        self.json.clone().unwrap_or(Value::Null)
    }

    /// Asserts success with nothing on stdout (DEL, CHECK).
    pub fn ok_empty(&self) {
        let v = self.ok();
        assert_eq!(v, Value::Null, "{}: expected no output", self.what);
    }

    /// Asserts a CNI error: non-zero exit, one error object on stdout. Returns its code.
    pub fn err_code(&self) -> u64 {
        assert!(
            !self.status.success(),
            "{} succeeded but an error was expected: stdout {}",
            self.what,
            String::from_utf8_lossy(&self.stdout)
        );
        let v = self.json.clone().unwrap_or_else(|| {
            panic!(
                "{}: failed without an error object on stdout (status {:?}, stderr {})",
                self.what, self.status, self.stderr
            )
        });
        let code = v["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: error without a numeric code: {v}", self.what));
        let msg = v["msg"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "{}: error without msg: {v}", self.what);
        assert!(
            v["cniVersion"].is_string(),
            "{}: error without cniVersion: {v}",
            self.what
        );
        code
    }

    /// Asserts the given error code.
    pub fn expect_code(&self, code: u64) {
        let got = self.err_code();
        assert_eq!(
            got,
            code,
            "{}: wrong error code; error was {}",
            self.what,
            String::from_utf8_lossy(&self.stdout)
        );
    }
}

/// The addresses (`10.1.0.5`, without prefix) of a result of any version.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Some(ips) = result["ips"].as_array() {
        for ip in ips {
            out.push(addr_of(ip["address"].as_str().expect("ips[].address")));
        }
    } else {
        for key in ["ip4", "ip6"] {
            if let Some(s) = result[key]["ip"].as_str() {
                out.push(addr_of(s));
            }
        }
    }
    out
}

/// The one address of a single-family result.
pub fn result_ip(result: &Value) -> IpAddr {
    let ips = result_ips(result);
    assert_eq!(ips.len(), 1, "expected one address in {result}");
    ips[0]
}

pub fn addr_of(cidr: &str) -> IpAddr {
    let a = cidr.split('/').next().unwrap_or("");
    a.parse()
        .unwrap_or_else(|e| panic!("bad address {cidr:?}: {e}"))
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
