//! The test API server (tests/kube_support) checked by a real client: kubectl lists, pages,
//! gets, watches and waits on Nodes through it, so the protocol the agent's tests rely on is
//! the one a real client speaks (discovery, `kind`/`apiVersion` of lists,
//! `metadata.resourceVersion`, `continue`, chunked watch streams, Status objects, 410 on a
//! watch from a compacted version, bookmarks, field selectors).
//!
//! kubectl is `STICKY_KUBECTL` when set (another build, e.g. Debian's 1.20 unpacked
//! elsewhere), else `kubectl` on `PATH` (`.ci/run` installs Debian's kubernetes-client). It
//! talks to the server on loopback with the server's CA and bearer token from a kubeconfig in
//! the test's temp dir; its discovery cache goes there too. A kubectl left running by a failed
//! test is killed when the test unwinds.

use sticky_testkit::kube_support;
use sticky_testkit::support;

use std::io::BufReader;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use kube_support::*;
use serde_json::{Value, json};
use support::assert_installed;

/// How long kubectl may take for anything: a request, an event, its exit.
const DEADLINE: Duration = Duration::from_secs(30);

/// The kubectl under test (see the module doc); fails, naming the package, when there is none.
fn kubectl_bin() -> String {
    match std::env::var("STICKY_KUBECTL") {
        Ok(bin) => bin,
        Err(_) => {
            assert_installed("kubectl", "kubernetes-client");
            "kubectl".to_string()
        }
    }
}

/// A Node as kubelet registers it, with a few container images: node `n` at 192.0.2.`n`.
fn node(n: u8, annotations: Value) -> Value {
    with_images(
        node_json(
            &format!("node-{n}"),
            &format!("192.0.2.{n}"),
            &[&format!("10.244.{n}.0/24")],
            annotations,
        ),
        3,
    )
}

/// `node` without `metadata.managedFields`, which kubectl leaves out of its output since 1.21
/// (`--show-managed-fields`).
fn as_printed(mut node: Value) -> Value {
    if let Some(meta) = node["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    node
}

fn names(nodes: &[Value]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| {
            n["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// The test API server holding Nodes 1 to `n`, and a kubeconfig for it in a temp dir.
struct Fixture {
    api: ApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    bin: String,
}

impl Fixture {
    fn new(n: u8) -> Fixture {
        let bin = kubectl_bin();
        let dir = tempfile::tempdir().expect("tempdir");
        let api = ApiServer::new("127.0.0.1", None);
        for i in 1..=n {
            api.put_node(node(i, json!({})));
        }
        let kubeconfig = api.kubeconfig(dir.path());
        Fixture {
            api,
            dir,
            kubeconfig,
            bin,
        }
    }

    /// kubectl with this kubeconfig only: no environment of the caller's but `PATH`, `HOME`
    /// (so the discovery cache) in the temp dir.
    fn kubectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg(format!("--request-timeout={}s", DEADLINE.as_secs()))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs kubectl to its end (its own request timeout bounds it).
    fn run(&self, args: &[&str]) -> Output {
        self.kubectl(args).output().expect("run kubectl")
    }

    /// Runs kubectl, which must succeed and print one JSON document.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "kubectl {args:?} printed no JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Starts kubectl in the background, each JSON document it prints read as it comes.
    fn spawn(&self, args: &[&str]) -> Running {
        static SPAWNED: AtomicUsize = AtomicUsize::new(0);
        let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
        let stderr = self.dir.path().join(format!("kubectl-{n}.stderr"));
        let mut child = self
            .kubectl(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn kubectl");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, output) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let docs = serde_json::Deserializer::from_reader(BufReader::new(stdout));
            for doc in docs.into_iter::<Value>() {
                let end = doc.is_err();
                if tx.send(doc.map_err(|e| e.to_string())).is_err() || end {
                    return;
                }
            }
        });
        Running {
            child,
            output,
            stderr,
        }
    }

    /// The list requests (first pages and continued ones) made since `since` requests.
    fn lists_since(&self, since: usize) -> Vec<String> {
        self.api.requests()[since..]
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/nodes?") && !r.contains("watch="))
            .cloned()
            .collect()
    }

    /// The watch requests made since `since` requests.
    fn watches_since(&self, since: usize) -> Vec<String> {
        self.api.requests()[since..]
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/nodes?") && r.contains("watch=true"))
            .cloned()
            .collect()
    }
}

/// A kubectl running in the background; killed (and reaped) when dropped, so a failing test
/// leaves no kubectl behind.
struct Running {
    child: Child,
    output: Receiver<Result<Value, String>>,
    stderr: PathBuf,
}

impl Running {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next JSON document kubectl prints.
    fn next(&self, what: &str) -> Value {
        match self.output.recv_timeout(DEADLINE) {
            Ok(Ok(doc)) => doc,
            Ok(Err(e)) => panic!("waiting for {what}, kubectl printed no JSON: {e}"),
            Err(RecvTimeoutError::Timeout) => panic!(
                "kubectl printed nothing for {DEADLINE:?} while {what} was expected; stderr:\n{}",
                self.stderr()
            ),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "kubectl ended while {what} was expected; stderr:\n{}",
                self.stderr()
            ),
        }
    }

    /// The next watch event, which must be of `kind` about Node `name`.
    fn event(&self, kind: &str, name: &str) -> Value {
        let e = self.next(&format!("{kind} {name}"));
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some(kind), Some(name)),
            "watch event: {e}"
        );
        e
    }

    /// Waits for kubectl to close its output and exit on its own, printing nothing more.
    fn exit(&mut self, why: &str) -> ExitStatus {
        match self.output.recv_timeout(DEADLINE) {
            Err(RecvTimeoutError::Disconnected) => {}
            Ok(doc) => panic!("kubectl printed {doc:?} where it should exit ({why})"),
            Err(RecvTimeoutError::Timeout) => panic!(
                "kubectl still runs {DEADLINE:?} after {why}; stderr:\n{}",
                self.stderr()
            ),
        }
        self.child.wait().expect("wait for kubectl")
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn kubectl_lists_every_node_once_whole_and_in_pages_of_two() {
    let f = Fixture::new(5);
    let want: Vec<String> = (1..=5).map(|n| format!("node-{n}")).collect();

    let list = f.json(&["get", "nodes", "-o", "json"]);
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(names(&items), want, "kubectl's list: {list}");
    for item in &items {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        let stored = f.api.node(name).expect("a node the server holds");
        assert_eq!(as_printed(item.clone()), as_printed(stored), "{name}");
    }

    // Pages of two: the first page, then two more through `continue`; every node once.
    let before = f.api.requests().len();
    let paged = f.json(&["get", "nodes", "-o", "json", "--chunk-size=2"]);
    assert_eq!(
        paged["items"], list["items"],
        "the paged list is the whole list"
    );
    let pages = f.lists_since(before);
    assert_eq!(pages.len(), 3, "three pages of at most two: {pages:?}");
    assert!(
        pages[0].contains("limit=2") && !pages[0].contains("continue="),
        "{pages:?}"
    );
    assert!(
        pages[1..]
            .iter()
            .all(|p| p.contains("limit=2") && p.contains("continue=")),
        "the later pages continue the first: {pages:?}"
    );
}

#[test]
fn kubectl_gets_one_node_and_reads_the_servers_not_found() {
    let f = Fixture::new(3);
    let got = f.json(&["get", "node", "node-2", "-o", "json"]);
    assert_eq!(
        as_printed(got),
        as_printed(f.api.node("node-2").expect("node-2"))
    );

    let missing = f.run(&["get", "node", "node-9", "-o", "json"]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "node-9 does not exist");
    assert!(
        stderr.contains("(NotFound)") && stderr.contains(r#"nodes "node-9" not found"#),
        "kubectl reports the server's NotFound Status: {stderr}"
    );
}

#[test]
fn kubectl_watch_sees_nodes_added_modified_and_deleted_then_the_server_ending_it() {
    let f = Fixture::new(3);
    let mut watch = f.spawn(&[
        "get",
        "nodes",
        "--watch",
        "-o",
        "json",
        "--output-watch-events",
    ]);
    for n in 1..=3 {
        watch.event("ADDED", &format!("node-{n}"));
    }

    f.api.put_node(node(4, json!({})));
    let added = watch.event("ADDED", "node-4");
    f.api.put_node(node(4, json!({"example.com/zone": "b"})));
    let modified = watch.event("MODIFIED", "node-4");
    assert_eq!(
        modified["object"]["metadata"]["annotations"]["example.com/zone"], "b",
        "the MODIFIED event carries the new Node: {modified}"
    );
    let rv = |e: &Value| {
        e["object"]["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(rv(&modified) > rv(&added), "resourceVersions grow");
    f.api.delete_node("node-2");
    watch.event("DELETED", "node-2");

    // The server ends the stream (as it does at timeoutSeconds): kubectl's watch ends.
    f.api.close_watches();
    let status = watch.exit("the server ended the watch");
    assert!(status.success(), "{status}; stderr:\n{}", watch.stderr());
}

/// kubectl's watch starts at its list's resourceVersion; the history is compacted between the
/// two, so the watch gets an `ERROR` event with a 410 Status. kubectl (1.20 and 1.32 alike)
/// prints that event and ends with the stream: `get --watch` does not relist.
#[test]
fn kubectl_watch_from_a_compacted_version_gets_410_and_ends() {
    let f = Fixture::new(3);
    f.api.compact_after_next_list();
    let before = f.api.requests().len();
    let mut watch = f.spawn(&[
        "get",
        "nodes",
        "--watch",
        "-o",
        "json",
        "--output-watch-events",
    ]);
    for n in 1..=3 {
        watch.event("ADDED", &format!("node-{n}"));
    }
    let error = watch.next("the 410 ERROR event");
    assert_eq!(error["type"], "ERROR", "{error}");
    let status = &error["object"];
    assert_eq!(
        (&status["kind"], &status["code"], &status["reason"]),
        (&json!("Status"), &json!(410), &json!("Expired")),
        "{error}"
    );
    watch.exit("the 410 ended the stream");
    let (lists, watches) = (f.lists_since(before), f.watches_since(before));
    assert_eq!(
        (lists.len(), watches.len()),
        (1, 1),
        "{lists:?} {watches:?}"
    );
}

/// `kubectl wait --for=delete` watches one Node through a field selector; kubectl 1.32's
/// reflector asks for bookmarks and gets them while it waits (kubectl 1.20 does not ask, and
/// gets none). Deleting another Node does not end the wait; deleting this one does.
#[test]
fn kubectl_waits_for_one_node_deleted_over_bookmarks_and_a_field_selector() {
    let f = Fixture::new(3);
    let before = f.api.requests().len();
    let mut wait = f.spawn(&[
        "wait",
        "--for=delete",
        "node/node-3",
        "--timeout=60s",
        "-o",
        "json",
    ]);
    wait_for("kubectl to watch node-3 (or to end)", DEADLINE, || {
        !f.watches_since(before).is_empty() || !wait.running()
    });
    assert!(
        wait.running(),
        "kubectl ended before node-3 was deleted; stderr:\n{}",
        wait.stderr()
    );
    let watches = f.watches_since(before);
    assert!(
        watches[0].contains("fieldSelector=metadata.name%3Dnode-3"),
        "{watches:?}"
    );
    let asks_bookmarks = watches[0].contains("allowWatchBookmarks=true");

    f.api.delete_node("node-2");
    if asks_bookmarks {
        // Two bookmarks after node-2 went: the stream has gone past its deletion.
        let seen = f.api.bookmarks();
        wait_for(
            "two bookmarks on kubectl's watch (or kubectl to end)",
            DEADLINE,
            || f.api.bookmarks() >= seen + 2 || !wait.running(),
        );
    } else {
        assert_eq!(f.api.bookmarks(), 0, "bookmarks only to a watch that asks");
    }
    assert!(
        wait.running(),
        "node-2's deletion ended the wait for node-3; stderr:\n{}",
        wait.stderr()
    );

    f.api.delete_node("node-3");
    let gone = wait.next("the Node kubectl saw deleted");
    assert_eq!(gone["metadata"]["name"], "node-3", "{gone}");
    let status = wait.exit("node-3 was deleted");
    assert!(status.success(), "{status}; stderr:\n{}", wait.stderr());
}

/// A watch that asks for bookmarks, read by kubectl's own HTTP client (`get --raw`, which every
/// kubectl has; 1.20's commands never ask for bookmarks): the chunked stream is one JSON event
/// a line, the history after the asked version first, then bookmarks at the current version,
/// until the server ends the stream at `timeoutSeconds`.
#[test]
fn kubectl_reads_a_watch_stream_with_bookmarks_to_its_timeout() {
    let f = Fixture::new(3);
    let node2 = f.api.node("node-2").expect("node-2");
    let from = node2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let now = f.api.node("node-3").expect("node-3")["metadata"]["resourceVersion"].clone();
    let path = format!(
        "/api/v1/nodes?watch=true&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds=2"
    );
    let mut watch = f.spawn(&["get", "--raw", &path]);
    watch.event("ADDED", "node-3");
    let bookmark = watch.next("a BOOKMARK");
    assert_eq!(bookmark["type"], "BOOKMARK", "{bookmark}");
    let object = &bookmark["object"];
    assert_eq!(
        (
            &object["kind"],
            &object["apiVersion"],
            &object["metadata"]["resourceVersion"]
        ),
        (&json!("Node"), &json!("v1"), &now),
        "a bookmark is an empty Node at the current version: {bookmark}"
    );
    // More bookmarks may come before the timeout; then the stream ends and so does kubectl.
    loop {
        match watch.output.recv_timeout(DEADLINE) {
            Ok(Ok(more)) => assert_eq!(more["type"], "BOOKMARK", "{more}"),
            Ok(Err(e)) => panic!("kubectl printed no JSON: {e}"),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("the watch did not end at its timeout"),
        }
    }
    let status = watch.child.wait().expect("wait for kubectl");
    assert!(status.success(), "{status}; stderr:\n{}", watch.stderr());
}
