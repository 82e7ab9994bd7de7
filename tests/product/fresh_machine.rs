//! Checks of `scripts/fresh-machine.sh`, which CI runs as root on every run: it must not be
//! able to hurt its host.
//!
//! The script takes the host paths it reads or overlays from `STICKY_FRESH_*` variables
//! (cargo and rustup homes, the apt dir, the temp dir, the bootstrap cache); every test points
//! them at a throw-away layout, puts fakes of `debootstrap`, `rustc` and `rustup` first on
//! `PATH`, and runs the script in a private mount namespace with a tmpfs over the real
//! `/root/.cargo` and `/root/.rustup`, so even a script that ignored the variables could not
//! reach the host's toolchain. No test runs a real debootstrap: the fake one "bootstraps" a
//! tiny root (bash and its libraries, static busybox, fake rustc/rustup/git). Each layout is a
//! tmpfs mounted on a temp dir and unmounted on drop.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a stage may take on a loaded 2-core machine (it takes about a second).
const DEADLINE: Duration = Duration::from_secs(120);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fresh-machine.sh")
}

fn write_exec(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The files of the throw-away cargo and rustup homes: what stage 3 would delete on a host.
const HOST_FILES: [&str; 5] = [
    "cargo/bin/cargo",
    "cargo/bin/cargo-nextest",
    "cargo/registry/cache/crate",
    "cargo/.crates.toml",
    "rustup/toolchains/stable",
];

/// A throw-away stand-in for every host path the script touches.
struct Layout {
    dir: tempfile::TempDir,
    /// PID namespaces a run made, whose processes are killed on drop.
    pid_namespaces: Vec<String>,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        // A tmpfs of its own: the overlays stage 2 makes need an upper layer on a filesystem
        // that can hold one, and the temp dir may be on an overlay (the bare root CI runs in).
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512m,mode=0700", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mount tmpfs on {}", dir.path().display());
        let layout = Layout {
            dir,
            pid_namespaces: Vec::new(),
        };
        for d in [
            "cargo/bin",
            "cargo/registry/cache",
            "rustup/toolchains",
            "apt/sources.list.d",
            "apt/apt.conf.d",
            "apt/trusted.gpg.d",
            "cache",
            "runs",
            "fake-bin",
        ] {
            fs::create_dir_all(layout.path(d)).unwrap();
        }
        for f in HOST_FILES {
            fs::write(layout.path(f), "host file\n").unwrap();
        }
        symlink("rustup", layout.path("cargo/bin/rustup")).unwrap();
        let log = layout.path("calls.log");
        write_exec(
            &layout.path("fake-bin/rustc"),
            "#!/bin/sh\necho 'host: x86_64-unknown-linux-gnu'\n",
        );
        write_exec(
            &layout.path("fake-bin/rustup"),
            &format!(
                "#!/bin/sh\necho \"rustup $*\" >>{}\n{}",
                log.display(),
                FAKE_RUSTUP
            ),
        );
        layout
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.path("calls.log")).unwrap_or_default()
    }

    /// The files of the throw-away cargo and rustup homes, which nothing may delete.
    fn assert_homes_intact(&self) {
        for f in HOST_FILES {
            assert!(self.path(f).exists(), "{f} was deleted");
        }
    }

    /// The script run with `args`, its host paths pointed at this layout, in a private mount
    /// namespace whose `/root/.cargo` and `/root/.rustup` are empty tmpfs.
    fn command(&self, args: &[&str]) -> Command {
        let guard = "for d in /root/.cargo /root/.rustup; do \
                         if [ -d \"$d\" ]; then mount -t tmpfs tmpfs \"$d\" || exit 99; fi; \
                     done; exec \"$@\"";
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            guard,
            "sh",
        ])
        .arg(script())
        .args(args)
        .env("STICKY_FRESH_CARGO_HOME", self.path("cargo"))
        .env("STICKY_FRESH_RUSTUP_HOME", self.path("rustup"))
        .env("STICKY_FRESH_APT_DIR", self.path("apt"))
        .env("STICKY_FRESH_TMPDIR", self.path("runs"))
        .env("STICKY_FRESH_CACHE", self.path("cache"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                self.path("fake-bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // Nothing of a run outlives the test: its namespace's processes go before its files.
        for ns in &self.pid_namespaces {
            for pid in processes_in(ns) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

const FAKE_RUSTUP: &str = r#"case "$*" in
  "toolchain list") echo "stable-x86_64-unknown-linux-gnu (default)" ;;
  *"target list --installed") echo x86_64-unknown-linux-gnu; echo wasm32-unknown-unknown ;;
esac
"#;

/// PIDs (as this namespace sees them) of the processes whose PID namespace is `ns`
/// (`pid:[…]`).
fn processes_in(ns: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.parse::<u32>().ok()?;
            let link = fs::read_link(e.path().join("ns/pid")).ok()?;
            (link.to_string_lossy() == ns).then_some(name)
        })
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
#[ignore = "needs root: runs the script in a private mount namespace"]
fn in_root_run_on_the_host_refuses_and_deletes_nothing() {
    let layout = Layout::new();
    let out = layout.run(&["--in-root", "true"]);
    let all = text(&out);
    layout.assert_homes_intact();
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("--in-root: refusing"), "{all}");
    assert!(
        !layout.calls().contains("target remove"),
        "rustup was asked to remove targets: {}",
        layout.calls()
    );
}

#[test]
#[ignore = "needs root: runs the script in a private mount namespace"]
fn in_namespace_run_on_the_host_refuses_and_mounts_nothing() {
    let layout = Layout::new();
    // A run dir as stage 1 leaves it, with a marker whose namespaces are this host's own.
    let run = layout.path("runs/sticky-fresh.test");
    fs::create_dir_all(run.join("up")).unwrap();
    fs::write(run.join("cache"), layout.path("cache").to_str().unwrap()).unwrap();
    let ns = |kind: &str| fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
    fs::write(
        run.join("up/.sticky-fresh-root"),
        format!(
            "host_pid_ns={}\nhost_mnt_ns={}\n",
            ns("pid").display(),
            ns("mnt").display()
        ),
    )
    .unwrap();
    let before: Vec<_> = fs::read_dir(&run)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let out = layout.run(&["--in-namespace", run.to_str().unwrap(), "true"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("--in-namespace: refusing"), "{all}");
    let after: Vec<_> = fs::read_dir(&run)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(before, after, "the stage made files in {}", run.display());
    layout.assert_homes_intact();
}

/// A `debootstrap` that records its arguments and fails.
fn failing_debootstrap(layout: &Layout) {
    write_exec(
        &layout.path("fake-bin/debootstrap"),
        &format!(
            "#!/bin/sh\necho \"debootstrap $*\" >>{}\necho 'E: no network here'\nexit 1\n",
            layout.path("calls.log").display()
        ),
    );
}

#[test]
#[ignore = "needs root: the script's first stage insists on root"]
fn the_mirror_is_read_from_classic_and_deb822_sources() {
    let cases: [(&str, &str, &str); 3] = [
        (
            "sources.list",
            "# a comment\ndeb-src http://192.0.2.9/debian bookworm main\n\
             deb [arch=amd64 signed-by=/x.gpg] http://192.0.2.1/debian bookworm main\n\
             deb http://192.0.2.2/debian-security bookworm-security main\n",
            "http://192.0.2.1/debian",
        ),
        (
            "sources.list.d/mirror.sources",
            "Types: deb-src\nURIs: http://198.51.100.9/debian\nSuites: bookworm\n\n\
             Types: deb\nURIs: http://198.51.100.2/debian-security\nSuites: bookworm-security\n\n\
             Types: deb deb-src\nURIs: http://198.51.100.1/debian\nSuites: bookworm\n\
             Components: main\n",
            "http://198.51.100.1/debian",
        ),
        (
            "sources.list.d/none.sources",
            "",
            "http://deb.debian.org/debian",
        ),
    ];
    for (file, content, mirror) in cases {
        let layout = Layout::new();
        fs::write(layout.path(&format!("apt/{file}")), content).unwrap();
        failing_debootstrap(&layout);
        let out = layout.run(&["true"]);
        let all = text(&out);
        let calls = layout.calls();
        assert!(
            calls.trim_end().ends_with(&format!(" {mirror}")),
            "{file}: debootstrap not given {mirror}: {calls:?}\n{all}"
        );
        assert_eq!(out.status.code(), Some(2), "{file}: {all}");
        assert!(all.contains("debootstrap failed"), "{file}: {all}");
        assert!(all.contains("E: no network here"), "{file}: {all}");
    }
}

#[test]
#[ignore = "needs root: runs the script in a private mount namespace"]
fn an_error_names_what_failed() {
    // No sources.list.d in the apt dir: the copy into the root fails, and says so.
    let layout = Layout::new();
    let root = tiny_root(&layout);
    fs::remove_dir(layout.path("apt/sources.list.d")).unwrap();
    fs::write(
        layout.path("apt/sources.list"),
        "deb http://192.0.2.1/debian bookworm main\n",
    )
    .unwrap();
    bootstrapping_debootstrap(&layout, &root);
    let out = layout.run(&["true"]);
    let all = text(&out);
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("failed") && all.contains("sources.list.d"),
        "{all}"
    );
    layout.assert_homes_intact();
}

/// Copies of the host's `bin` and the libraries it loads into `root`, at the same paths.
fn copy_with_libraries(bin: &str, root: &Path, dest: &str) {
    let out = Command::new("ldd").arg(bin).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(lib) = line.split_whitespace().find(|w| w.starts_with('/')) else {
            continue;
        };
        let to = root.join(lib.trim_start_matches('/'));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(lib, &to).unwrap();
    }
    fs::copy(bin, root.join(dest)).unwrap();
}

/// A root with what the script's stages 2 and 3 run: bash, busybox's tools, fake
/// rustc/rustup/git, and the directories stage 2 mounts on or copies into.
fn tiny_root(layout: &Layout) -> PathBuf {
    let root = layout.path("template");
    for d in [
        "usr/bin",
        "usr/lib",
        "usr/lib64",
        "proc",
        "sys",
        "dev",
        "run",
        "tmp",
        "root",
        "etc/ssl/certs",
        "etc/apt/sources.list.d",
        "etc/apt/apt.conf.d",
        "etc/apt/trusted.gpg.d",
        "usr/local/bin",
        "usr/local/share/ca-certificates",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        symlink(to, root.join(link)).unwrap();
    }
    copy_with_libraries("/bin/bash", &root, "usr/bin/bash");
    fs::copy("/bin/busybox", root.join("usr/bin/busybox")).unwrap();
    for applet in [
        "sh", "sed", "awk", "basename", "readlink", "rm", "cat", "stat", "sleep", "mkdir", "touch",
        "ls", "head", "umount", "rmdir", "mount", "kill",
    ] {
        symlink("busybox", root.join("usr/bin").join(applet)).unwrap();
    }
    for fake in ["rustc", "rustup"] {
        fs::copy(
            layout.path("fake-bin").join(fake),
            root.join("usr/bin").join(fake),
        )
        .unwrap();
    }
    // The rustup fake logs to a host path that does not exist in the root: point it inside.
    write_exec(
        &root.join("usr/bin/rustup"),
        &format!("#!/bin/sh\necho \"rustup $*\" >>/rustup.log\n{FAKE_RUSTUP}"),
    );
    write_exec(
        &root.join("usr/bin/git"),
        "#!/bin/sh\necho 'abc1234 the commit'\n",
    );
    root
}

/// A `debootstrap` that "bootstraps" a copy of `template` into its target directory.
fn bootstrapping_debootstrap(layout: &Layout, template: &Path) {
    write_exec(
        &layout.path("fake-bin/debootstrap"),
        &format!(
            "#!/bin/sh\necho \"debootstrap $*\" >>{log}\n\
             target=\nprev=\nfor a; do target=$prev; prev=$a; done\n\
             cp -a {template}/. \"$target\"/\n",
            log = layout.path("calls.log").display(),
            template = template.display()
        ),
    );
}

/// Lines of `child`'s stderr, as they come.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line for which `wanted` holds, keeping every line seen in `seen`.
fn wait_line(
    rx: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    let end = Instant::now() + DEADLINE;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        let Ok(line) = rx.recv_timeout(left) else {
            return None;
        };
        seen.push(line.clone());
        if wanted(&line) {
            return Some(line);
        }
    }
    None
}

#[test]
#[ignore = "needs root: namespaces, overlays and pivot_root"]
fn sigterm_is_forwarded_and_cleanup_waits_for_the_child() {
    let mut layout = Layout::new();
    let root = tiny_root(&layout);
    bootstrapping_debootstrap(&layout, &root);
    fs::write(
        layout.path("apt/sources.list.d/debian.sources"),
        "Types: deb\nURIs: http://192.0.2.1/debian\nSuites: bookworm\n",
    )
    .unwrap();
    let command = "echo \"ns $(readlink /proc/self/ns/pid)\" >&2; \
                   trap 'echo got TERM >&2; exit 0' TERM; \
                   sleep 600 & wait";
    let mut child = layout
        .command(&[command])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    let ns_line = wait_line(&lines, &mut seen, |l| l.starts_with("ns pid:["));
    let Some(ns_line) = ns_line else {
        let _ = child.kill();
        panic!("the command never started:\n{}", seen.join("\n"));
    };
    let ns = ns_line.trim_start_matches("ns ").to_string();
    layout.pid_namespaces.push(ns.clone());
    assert!(!processes_in(&ns).is_empty(), "no process in {ns}");

    // `unshare` without `--fork` execs `sh`, which execs the script: the same PID.
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let done = wait_line(&lines, &mut seen, |l| l.contains("exited"));
    let status = child.wait().unwrap();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(line);
    }
    let all = seen.join("\n");
    assert!(done.is_some(), "the script never said it was done:\n{all}");
    let at = |what: &str| seen.iter().position(|l| l.contains(what));
    assert!(
        at("got TERM").is_some(),
        "the command never got TERM:\n{all}"
    );
    assert!(
        at("got TERM") < at("exited"),
        "the script was done before its command:\n{all}"
    );
    assert_eq!(
        processes_in(&ns),
        Vec::<String>::new(),
        "processes of {ns} outlived the script:\n{all}"
    );
    let left: Vec<_> = fs::read_dir(layout.path("runs"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "cleanup left {left:?}:\n{all}");
    layout.assert_homes_intact();
    assert!(status.code().is_some(), "{status:?}\n{all}");
}
