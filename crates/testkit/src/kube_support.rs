//! A test Kubernetes API server, written for the tests: it speaks the part of the real
//! protocol the agent uses, over TLS with a CA made at test time, with a bearer token.
//!
//! - Discovery (`/api`, `/apis`, `/api/v1`: the legacy documents), as kubectl reads it
//!   before anything else.
//! - `GET /api/v1/nodes?limit=&continue=`: a NodeList with `metadata.resourceVersion`, paged;
//!   an expired `continue` is `410 Gone`. `GET /api/v1/nodes/<name>`: one Node, or the
//!   NotFound Status.
//! - `fieldSelector=metadata.name=<name>` on lists and watches (kubectl's one-Node watch);
//!   any other field selector is refused (400), never ignored.
//! - `GET /api/v1/nodes?watch=1&resourceVersion=&allowWatchBookmarks=true&timeoutSeconds=`:
//!   a chunked stream of `ADDED/MODIFIED/DELETED/BOOKMARK` events after that version; a
//!   version older than the kept history is an `ERROR` event with a 410 Status, as the real
//!   server sends it.
//! - `PATCH /api/v1/nodes/<name>/status` with a JSON merge patch of annotations (the whole
//!   Node is refused: the agent's RBAC allows `nodes/status` only, as flannel's).
//! - Misbehaviour on demand: close every watch stream ([`ApiServer::close_watches`]), cut the
//!   next lists half-way ([`ApiServer::cut_lists`]), stop listening altogether and come back
//!   on the same address ([`ApiServer::stop`], [`ApiServer::start`]), forget the history
//!   (a restore, [`ApiServer::restore`]; between a client's list and its watch,
//!   [`ApiServer::compact_after_next_list`]).
//!
//! Node objects are full Node JSON as a real API server returns them ([`node_json`]). One
//! request per connection (`Connection: close`). tests/kube_kubectl.rs holds it to kubectl.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sticky_netlink::netns;

use super::kube_proto;

/// `node` with `count` container images in `status.images`, as kubelet reports them (a real
/// cluster's Nodes are 10-40 KB, mostly this list).
pub fn with_images(mut node: Value, count: usize) -> Value {
    let images: Vec<Value> = (0..count)
        .map(|i| {
            json!({
                "names": [
                    format!("registry.example.com/team-{i}/service-{i}@sha256:{:064x}", i * 7919),
                    format!("registry.example.com/team-{i}/service-{i}:v1.{i}.0"),
                ],
                "sizeBytes": 20_000_000 + i * 1_000_003,
            })
        })
        .collect();
    node["status"]["images"] = json!(images);
    node
}

/// `node` with these `InternalIP` addresses, in this order, then its `Hostname`: a
/// dual-stack kubelet (`--node-ip=192.0.2.1,2001:db8::1`) lists its IPv4 address first.
pub fn with_internal_ips(mut node: Value, ips: &[&str]) -> Value {
    let mut addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": node["metadata"]["name"]}));
    node["status"]["addresses"] = json!(addresses);
    node
}

/// A Node as a real API server returns it (kubeadm worker): metadata with labels,
/// annotations and managedFields, spec with podCIDR(s) and taints, status with capacity,
/// conditions, addresses, daemonEndpoints and nodeInfo.
pub fn node_json(name: &str, internal_ip: &str, cidrs: &[&str], annotations: Value) -> Value {
    let mut spec = json!({"providerID": format!("kind://docker/edge/{name}")});
    if let Some(first) = cidrs.first() {
        spec["podCIDR"] = json!(first);
        spec["podCIDRs"] = json!(cidrs);
    }
    let mut annotations = annotations;
    for (k, v) in [
        (
            "kubeadm.alpha.kubernetes.io/cri-socket",
            "unix:///run/containerd/containerd.sock",
        ),
        ("node.alpha.kubernetes.io/ttl", "0"),
        (
            "volumes.kubernetes.io/controller-managed-attach-detach",
            "true",
        ),
    ] {
        annotations[k] = json!(v);
    }
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("6f1c7a52-9d7e-4c1e-9a51-{:012x}", name.len() * 7919),
            "resourceVersion": "0",
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux"
            },
            "annotations": annotations,
            "managedFields": [{
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-25T01:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {}}},
                "subresource": "status"
            }]
        },
        "spec": spec,
        "status": {
            "capacity": {"cpu": "2", "ephemeral-storage": "20134592Ki", "memory": "4026372Ki", "pods": "110"},
            "allocatable": {"cpu": "2", "ephemeral-storage": "18556039957", "memory": "3923972Ki", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-11-25T01:00:00Z", "lastTransitionTime": "2026-11-20T10:00:00Z", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available"},
                {"type": "DiskPressure", "status": "False", "lastHeartbeatTime": "2026-11-25T01:00:00Z", "lastTransitionTime": "2026-11-20T10:00:00Z", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure"},
                {"type": "PIDPressure", "status": "False", "lastHeartbeatTime": "2026-11-25T01:00:00Z", "lastTransitionTime": "2026-11-20T10:00:00Z", "reason": "KubeletHasSufficientPID", "message": "kubelet has sufficient PID available"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-25T01:00:00Z", "lastTransitionTime": "2026-11-20T10:01:00Z", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
            ],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0c9d3c2a5b4e4f5d8a7b6c5d4e3f2a1b",
                "systemUUID": "0c9d3c2a-5b4e-4f5d-8a7b-6c5d4e3f2a1b",
                "bootID": "b1a2c3d4-e5f6-4711-8899-aabbccddeeff",
                "kernelVersion": "6.1.0-27-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.31.4",
                "kubeProxyVersion": "v1.31.4",
                "operatingSystem": "linux",
                "architecture": "amd64"
            },
            "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}]
        }
    })
}

/// The test CA and the server's certificate, made at test time.
pub struct Pki {
    pub ca_pem: String,
    server_cert: String,
    server_key: String,
}

impl Pki {
    pub fn new(server_ip: &str) -> Pki {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sticky-cni test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(
            ca_params,
            rcgen::KeyPair::generate().expect("key"),
        )
        .expect("CA");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![server_ip.to_string()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("server cert");
        Pki {
            ca_pem: ca.pem(),
            server_cert: cert.pem(),
            server_key: key.serialize_pem(),
        }
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        let chain: Vec<_> =
            rustls::pki_types::CertificateDer::pem_slice_iter(self.server_cert.as_bytes())
                .collect::<Result<_, _>>()
                .expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(self.server_key.as_bytes())
            .expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("server config"),
        )
    }
}

/// An endless list body, under `Content-Length: 10^12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endless {
    /// Real-sized Node objects, one after another, forever.
    Items,
    /// One Node whose name never ends.
    String,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Value>,
    rv: u64,
    /// Events after `oldest` (exclusive) are kept; a watch from before it is 410.
    oldest: u64,
    events: Vec<(u64, &'static str, Value)>,
    /// Bumped to end every open watch stream.
    watch_epoch: u64,
    cut_lists: usize,
    /// When set, every watch is answered with this HTTP status and message.
    watch_failure: Option<(u16, String)>,
    /// When set, every list page carries a new continue token: a list that never ends.
    endless_continue: bool,
    /// List pages served (every page, first or not).
    pages: u64,
    /// When set, every list is an endless body of this kind.
    endless_body: Option<Endless>,
    /// When set, the next complete list is followed at once by a compaction, so a watch from
    /// that list's resourceVersion is too old (410).
    compact_after_list: bool,
    /// Bookmarks sent, every stream together.
    bookmarks: u64,
    /// When set, every new watch is held open with a blank line this often and nothing else:
    /// no event, no bookmark, no end at its `timeoutSeconds` (a hostile server or proxy).
    keepalive_only: Option<Duration>,
    /// The next this many PATCHes are refused with 403 (RBAC not granted yet).
    refuse_patches: usize,
    /// PATCHes refused so far.
    patches_refused: usize,
    /// The most items the server puts in one page (it may return fewer than asked).
    page_size: usize,
    /// Lists and watches answered in JSON even to a client that accepts protobuf (a proxy or
    /// an aggregated server that speaks only JSON).
    json_only: bool,
    /// Lists and watches answered in protobuf.
    protobuf_answers: usize,
    down: bool,
    lists: usize,
    watches: usize,
    /// Bytes of watch events sent, every stream together.
    watch_bytes: u64,
    patches: Vec<(String, Value)>,
    user_agents: Vec<String>,
    /// Every request's method and target, as the client sent them.
    requests: Vec<String>,
    /// The source address of every connection accepted, as the server saw it (behind a NAT:
    /// the router's).
    clients: Vec<SocketAddr>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

pub struct ApiServer {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    netns: Option<PathBuf>,
    pub token: String,
    pki: Pki,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
    /// How often a bookmark is sent on an idle watch.
    pub bookmark_every: Duration,
}

impl ApiServer {
    /// A server on `ip` (port chosen by the kernel), in the network namespace at `netns`
    /// (the test's own namespace if none).
    pub fn new(ip: &str, netns: Option<&Path>) -> ApiServer {
        let mut s = ApiServer {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    rv: 100,
                    oldest: 100,
                    page_size: usize::MAX,
                    ..State::default()
                }),
                changed: Condvar::new(),
            }),
            addr: SocketAddr::new(ip.parse().expect("the server's IP address"), 0),
            netns: netns.map(Path::to_path_buf),
            token: format!("test-token-{}", std::process::id()),
            pki: Pki::new(ip),
            stop: Arc::new(AtomicBool::new(false)),
            accept: None,
            bookmark_every: Duration::from_millis(500),
        };
        s.start();
        s
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The agent's flags to reach this server as Node `name` with the config file `conf` and
    /// the files of [`ApiServer::credentials`] (and a resync every 60 s).
    pub fn agent_args(&self, conf: &Path, ca: &Path, token: &Path, name: &str) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        [
            "--config".to_string(),
            path(conf),
            "--server".to_string(),
            self.url(),
            "--ca-file".to_string(),
            path(ca),
            "--token-file".to_string(),
            path(token),
            "--node-name".to_string(),
            name.to_string(),
            "--resync".to_string(),
            "60".to_string(),
        ]
        .into()
    }

    /// Writes the CA and the token for the agent; returns (ca file, token file).
    pub fn credentials(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let ca = dir.join("api-ca.pem");
        let token = dir.join("api-token");
        std::fs::write(&ca, &self.pki.ca_pem).expect("ca");
        std::fs::write(&token, format!("{}\n", self.token)).expect("token");
        (ca, token)
    }

    /// A kubeconfig (YAML, CA inline as base64 would be; here by path) for the agent.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let (ca, _) = self.credentials(dir);
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: edge\nclusters:\n- name: edge\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: edge\n  context:\n    cluster: edge\n    user: agent\nusers:\n- name: agent\n  user:\n    token: {}\n",
                self.url(),
                ca.display(),
                self.token
            ),
        )
        .expect("kubeconfig");
        path
    }

    fn bind(&self) -> TcpListener {
        let addr = self.addr;
        let Some(netns) = self.netns.clone() else {
            return TcpListener::bind(addr).expect("bind");
        };
        // A socket belongs to the namespace it was made in: make it in a thread that entered
        // the namespace, and use it from anywhere.
        netns::run_in(&netns, || TcpListener::bind(addr))
            .expect("enter netns")
            .expect("bind in netns")
    }

    /// Listens (again, on the same address after [`stop`](Self::stop)).
    pub fn start(&mut self) {
        let listener = self.bind();
        self.addr = listener.local_addr().expect("local addr");
        listener.set_nonblocking(true).expect("nonblocking");
        self.stop.store(false, Ordering::SeqCst);
        self.shared.state.lock().unwrap().down = false;
        let stop = self.stop.clone();
        let shared = self.shared.clone();
        let tls = self.pki.server_config();
        let token = self.token.clone();
        let bookmark_every = self.bookmark_every;
        self.accept = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, peer)) => {
                        shared.state.lock().unwrap().clients.push(peer);
                        let (shared, tls, token) = (shared.clone(), tls.clone(), token.clone());
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            serve(conn, &shared, tls, &token, bookmark_every);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    /// Stops listening and cuts every open connection: the API is unreachable.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let mut s = self.shared.state.lock().unwrap();
            s.down = true;
            s.watch_epoch += 1;
        }
        self.shared.changed.notify_all();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.shared.state.lock().unwrap());
        self.shared.changed.notify_all();
    }

    /// Creates or replaces a node (ADDED or MODIFIED).
    pub fn put_node(&self, mut node: Value) {
        self.change(|s| {
            s.rv += 1;
            let name = node["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            node["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            let kind = if s.nodes.contains_key(&name) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            s.events.push((s.rv, kind, node.clone()));
            s.nodes.insert(name, node);
        });
    }

    pub fn delete_node(&self, name: &str) {
        self.change(|s| {
            if let Some(mut node) = s.nodes.remove(name) {
                s.rv += 1;
                node["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                s.events.push((s.rv, "DELETED", node));
            }
        });
    }

    /// Deletes a node and forgets the history in one step, so no watch sees the DELETED
    /// event: every watcher gets 410 Gone and must list to learn of it.
    pub fn delete_node_unwatched(&self, name: &str) {
        self.change(|s| {
            s.nodes.remove(name);
            s.rv += 1;
            s.oldest = s.rv;
            s.events.clear();
            s.watch_epoch += 1;
        });
    }

    /// Forgets the event history: every watch from before now gets 410 Gone.
    pub fn compact(&self) {
        self.change(|s| {
            s.rv += 1;
            s.oldest = s.rv;
            s.events.clear();
            s.watch_epoch += 1;
        });
    }

    /// An API restored from an old backup: these nodes, no history.
    pub fn restore(&self, nodes: Vec<Value>) {
        self.change(|s| {
            s.nodes.clear();
            s.rv += 1;
            for mut n in nodes {
                let name = n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                n["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                s.nodes.insert(name, n);
            }
            s.oldest = s.rv;
            s.events.clear();
            s.watch_epoch += 1;
        });
    }

    /// Compacts the history just after the next complete list is served: the client's watch
    /// from that list's resourceVersion is then too old, as when etcd compacts between a
    /// client's list and its watch (the watch gets an `ERROR` event with a 410 Status).
    pub fn compact_after_next_list(&self) {
        self.change(|s| s.compact_after_list = true);
    }

    /// Ends every open watch stream cleanly (as the server does at timeoutSeconds).
    pub fn close_watches(&self) {
        self.change(|s| s.watch_epoch += 1);
    }

    /// The next `n` lists are cut half-way through the body of their last page.
    pub fn cut_lists(&self, n: usize) {
        self.change(|s| s.cut_lists = n);
    }

    /// Every watch is answered with HTTP `code` and a Status saying `message` (504 "Too large
    /// resource version" after a restore at a lower resourceVersion, 410, 500...), until
    /// called with `None`.
    pub fn fail_watches(&self, failure: Option<(u16, &str)>) {
        self.change(|s| s.watch_failure = failure.map(|(c, m)| (c, m.to_string())));
    }

    /// Every new watch is held open with a blank line every `every` and nothing else, past
    /// its `timeoutSeconds` (`None`: normal watches again).
    pub fn keepalive_watches(&self, every: Option<Duration>) {
        self.change(|s| s.keepalive_only = every);
    }

    /// Deletes a node with no event on any watch (its history keeps no DELETED): only a new
    /// list tells a client it is gone.
    pub fn delete_node_unseen(&self, name: &str) {
        self.change(|s| {
            if s.nodes.remove(name).is_some() {
                s.rv += 1;
            }
        });
    }

    /// The next `n` PATCHes are answered 403 Forbidden, as before the agent's RBAC is fixed.
    pub fn refuse_patches(&self, n: usize) {
        self.change(|s| s.refuse_patches = n);
    }

    /// PATCHes answered 403 by [`refuse_patches`](Self::refuse_patches) so far.
    pub fn patches_refused(&self) -> usize {
        self.shared.state.lock().unwrap().patches_refused
    }

    /// Every list is answered with an endless body (`None`: normal lists again).
    pub fn endless_body(&self, kind: Option<Endless>) {
        self.change(|s| s.endless_body = kind);
    }

    /// Every list page carries a new `continue` token, so a list never ends.
    pub fn endless_continue(&self, on: bool) {
        self.change(|s| s.endless_continue = on);
    }

    /// Lists come in pages of at most `n` nodes.
    /// Lists and watches in JSON, whatever the client accepts (by default a client that
    /// accepts protobuf gets it, as from a real API server).
    pub fn json_only(&self, on: bool) {
        self.change(|s| s.json_only = on);
    }

    /// Lists and watches answered in protobuf so far.
    pub fn protobuf_answers(&self) -> usize {
        self.shared.state.lock().unwrap().protobuf_answers
    }

    pub fn page_size(&self, n: usize) {
        self.change(|s| s.page_size = n);
    }

    /// Lists started (first pages).
    pub fn lists(&self) -> usize {
        self.shared.state.lock().unwrap().lists
    }

    /// List pages served, first pages and continued ones.
    pub fn pages(&self) -> u64 {
        self.shared.state.lock().unwrap().pages
    }

    /// Bytes of watch events sent so far (every stream together).
    pub fn watch_bytes(&self) -> u64 {
        self.shared.state.lock().unwrap().watch_bytes
    }

    /// Bookmarks sent so far (every stream together).
    pub fn bookmarks(&self) -> u64 {
        self.shared.state.lock().unwrap().bookmarks
    }

    pub fn watches(&self) -> usize {
        self.shared.state.lock().unwrap().watches
    }

    pub fn patches(&self) -> Vec<(String, Value)> {
        self.shared.state.lock().unwrap().patches.clone()
    }

    /// Every request so far, as `METHOD target` (the target as sent: path and query).
    pub fn requests(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().requests.clone()
    }

    /// The source address of every connection accepted so far, oldest first.
    pub fn clients(&self) -> Vec<SocketAddr> {
        self.shared.state.lock().unwrap().clients.clone()
    }

    pub fn user_agents(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().user_agents.clone()
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.state.lock().unwrap().nodes.get(name).cloned()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Req {
    method: String,
    /// The request target as sent (path and query, still encoded).
    target: String,
    path: String,
    query: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

fn read_request(r: &mut impl BufRead) -> Option<Req> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let query = q
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect();
    Some(Req {
        method,
        path: path.to_string(),
        target: target.clone(),
        query,
        headers,
        body,
    })
}

/// A query component as a client encodes it (Go's `url.QueryEscape`: `%XX`, and `+` for a
/// space); a malformed escape is kept as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status_json(code: u16, reason: &str, message: &str) -> String {
    status_value(code, reason, message).to_string()
}

/// The `Status` object a real API server answers an error with.
fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// How a response body is framed.
enum Body {
    /// `Content-Length` bytes (which the server may then fail to send).
    Length(u64),
    /// `Transfer-Encoding: chunked`: a watch stream.
    Chunked,
}

/// The status line and headers of a JSON response. Every connection carries one request, and
/// says so (`Connection: close`): a client does not send its next request on it.
fn head(w: &mut impl Write, code: u16, body: Body) -> bool {
    head_as(w, code, body, "application/json")
}

/// [`head`] of a body of `content_type`.
fn head_as(w: &mut impl Write, code: u16, body: Body, content_type: &str) -> bool {
    let text = match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        415 => "Unsupported Media Type",
        500 => "Internal Server Error",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let framing = match body {
        Body::Length(n) => format!("Content-Length: {n}"),
        Body::Chunked => "Transfer-Encoding: chunked".to_string(),
    };
    write!(
        w,
        "HTTP/1.1 {code} {text}\r\nContent-Type: {content_type}\r\nConnection: close\r\n{framing}\r\n\r\n"
    )
    .is_ok()
}

fn respond(w: &mut impl Write, code: u16, body: &str) {
    respond_as(w, code, body.as_bytes(), "application/json");
}

fn respond_as(w: &mut impl Write, code: u16, body: &[u8], content_type: &str) {
    if head_as(w, code, Body::Length(body.len() as u64), content_type) {
        let _ = w.write_all(body);
    }
    let _ = w.flush();
}

/// Whether `req` is answered in protobuf: its client accepts it and the server is not
/// [`ApiServer::json_only`].
fn protobuf(req: &Req, s: &State) -> bool {
    !s.json_only
        && req
            .headers
            .get("accept")
            .is_some_and(|a| a.contains(kube_proto::MEDIA_TYPE))
}

/// A Status answer in the encoding `req` gets.
fn respond_status(w: &mut impl Write, proto: bool, code: u16, reason: &str, message: &str) {
    let status = status_value(code, reason, message);
    match proto {
        true => {
            let body = kube_proto::envelope("Status", &kube_proto::status(&status));
            respond_as(w, code, &body, kube_proto::MEDIA_TYPE);
        }
        false => respond(w, code, &status.to_string()),
    }
}

fn serve(
    conn: TcpStream,
    shared: &Shared,
    tls: Arc<rustls::ServerConfig>,
    token: &str,
    bookmark_every: Duration,
) {
    let Ok(session) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let stream = rustls::StreamOwned::new(session, conn);
    let mut r = BufReader::new(stream);
    let Some(req) = read_request(&mut r) else {
        return;
    };
    // Writes go through a 4 KiB buffer, as Go's net/http writes a connection (its `bufw`): a
    // watch event is then three writes (and three TLS records), its chunk header, its text and
    // its trailer, as a real API server sends it, not one record per piece of a format string.
    let mut w = BufWriter::with_capacity(4 << 10, r.into_inner());
    {
        let mut s = shared.state.lock().unwrap();
        if s.down {
            return;
        }
        s.user_agents
            .push(req.headers.get("user-agent").cloned().unwrap_or_default());
        s.requests.push(format!("{} {}", req.method, req.target));
    }
    if req.headers.get("authorization") != Some(&format!("Bearer {token}")) {
        respond(
            &mut w,
            401,
            &status_json(401, "Unauthorized", "Unauthorized"),
        );
        return;
    }
    if req.method == "GET"
        && req.path == "/api/v1/nodes"
        && req
            .query
            .get("watch")
            .is_some_and(|v| v == "1" || v == "true")
    {
        watch(&mut w, shared, &req, bookmark_every);
    } else if req.method == "GET" && req.path == "/api/v1/nodes" {
        list(&mut w, shared, &req);
    } else if let Some(name) = (req.method == "GET")
        .then(|| req.path.strip_prefix("/api/v1/nodes/"))
        .flatten()
        .filter(|n| !n.is_empty() && !n.contains('/'))
    {
        get_node(&mut w, shared, name);
    } else if req.method == "PATCH" && req.path.starts_with("/api/v1/nodes/") {
        patch(&mut w, shared, &req);
    } else if let Some(body) = discovery(&req) {
        respond(&mut w, 200, &body.to_string());
    } else {
        respond(
            &mut w,
            404,
            &status_json(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        );
    }
}

/// The discovery documents a client reads to learn that `nodes` is a cluster-scoped resource of
/// the core group `v1` (kubectl does, before any list): the legacy, unaggregated form, which a
/// client asking for aggregated discovery accepts by its `Content-Type`.
fn discovery(req: &Req) -> Option<Value> {
    if req.method != "GET" {
        return None;
    }
    match req.path.as_str() {
        "/api" => Some(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})),
        "/apis" => Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})),
        "/api/v1" => Some(
            json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
                 "verbs": ["get", "list", "patch", "watch"], "shortNames": ["no"]},
                {"name": "nodes/status", "singularName": "", "namespaced": false, "kind": "Node",
                 "verbs": ["patch"]}
            ]}),
        ),
        _ => None,
    }
}

/// `GET /api/v1/nodes/<name>`: the Node, or a NotFound Status naming it.
fn get_node(w: &mut impl Write, shared: &Shared, name: &str) {
    let node = shared.state.lock().unwrap().nodes.get(name).cloned();
    match node {
        Some(node) => respond(w, 200, &node.to_string()),
        None => respond(w, 404, &not_found(name)),
    }
}

/// The Status a real API server answers for a Node that does not exist.
fn not_found(name: &str) -> String {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("nodes \"{name}\" not found"), "reason": "NotFound",
           "details": {"name": name, "kind": "nodes"}, "code": 404})
    .to_string()
}

/// The Node name a `fieldSelector` picks (`metadata.name=<name>`, as kubectl sends it for one
/// Node), `None` when there is none; any other selector is refused with the Status a real API
/// server sends for a field it cannot select Nodes by.
fn name_selector(req: &Req) -> Result<Option<String>, String> {
    let Some(selector) = req.query.get("fieldSelector").filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let term = selector
        .split_once("==")
        .or_else(|| selector.split_once('='));
    match term {
        Some(("metadata.name", name)) if !name.contains(',') => Ok(Some(name.to_string())),
        _ => Err(status_json(
            400,
            "BadRequest",
            &format!("field label not supported: {selector}"),
        )),
    }
}

/// True when `node` is one the selector `name` picks.
fn picks(name: Option<&str>, node: &Value) -> bool {
    name.is_none_or(|n| node["metadata"]["name"].as_str() == Some(n))
}

fn list(w: &mut impl Write, shared: &Shared, req: &Req) {
    let selector = match name_selector(req) {
        Ok(s) => s,
        Err(status) => return respond(w, 400, &status),
    };
    let mut s = shared.state.lock().unwrap();
    let proto = protobuf(req, &s);
    s.protobuf_answers += usize::from(proto);
    if !req.query.contains_key("continue") {
        s.lists += 1;
    }
    let limit: usize = req
        .query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(usize::MAX);
    if let Some(kind) = s.endless_body {
        s.pages += 1;
        drop(s);
        endless(w, kind);
        return;
    }
    if s.endless_continue {
        s.pages += 1;
        let page = s.pages;
        let items: Vec<&Value> = s.nodes.values().collect();
        let body = json!({"kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": s.rv.to_string(), "continue": format!("endless-{page}")},
            "items": items})
        .to_string();
        drop(s);
        respond(w, 200, &body);
        return;
    }
    let (offset, rv) = match req.query.get("continue") {
        None => (0, s.rv),
        Some(t) => {
            let mut parts = t.split(';');
            let offset = parts.next().and_then(|o| o.parse().ok()).unwrap_or(0);
            let rv: u64 = parts.next().and_then(|o| o.parse().ok()).unwrap_or(0);
            if rv != s.rv {
                drop(s);
                respond_status(
                    w,
                    proto,
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                );
                return;
            }
            (offset, rv)
        }
    };
    s.pages += 1;
    let limit = limit.min(s.page_size);
    let picked: Vec<&Value> = s
        .nodes
        .values()
        .filter(|n| picks(selector.as_deref(), n))
        .collect();
    let items: Vec<&Value> = picked.iter().copied().skip(offset).take(limit).collect();
    let last_page = offset + items.len() >= picked.len();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if !last_page {
        metadata["continue"] = json!(format!("{};{}", offset + items.len(), rv));
        metadata["remainingItemCount"] = json!(picked.len() - offset - items.len());
    }
    let (body, content_type) = match proto {
        true => {
            let items: Vec<Vec<u8>> = items.iter().map(|n| kube_proto::node(n)).collect();
            (
                kube_proto::node_list(&metadata, &items),
                kube_proto::MEDIA_TYPE,
            )
        }
        false => (
            json!({"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": items})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
    };
    let cut = s.cut_lists > 0 && last_page;
    if cut {
        s.cut_lists -= 1;
    }
    if last_page && !cut && s.compact_after_list {
        // etcd compacts the history between this list and the client's watch.
        s.compact_after_list = false;
        s.rv += 1;
        s.oldest = s.rv;
        s.events.clear();
    }
    drop(s);
    if cut {
        if head_as(w, 200, Body::Length(body.len() as u64), content_type) {
            let _ = w.write_all(&body[..body.len() / 2]);
        }
        let _ = w.flush();
        return;
    }
    respond_as(w, 200, &body, content_type);
}

/// Writes an endless list body until the client goes away (or 10^6 items: a test must end).
fn endless(w: &mut impl Write, kind: Endless) {
    if !head(w, 200, Body::Length(1_000_000_000_000))
        || write!(
            w,
            "{{\"kind\":\"NodeList\",\"metadata\":{{\"resourceVersion\":\"1\"}},\"items\":["
        )
        .is_err()
    {
        return;
    }
    match kind {
        Endless::Items => {
            // One real-sized Node serialized once; each item is that text with its own name
            // and address, so the server's side costs little of a loaded machine's time.
            let (name, ip) = ("endless-0000000", "198.18.255.255");
            let template = node_json(name, ip, &["10.250.0.0/24"], json!({})).to_string();
            for i in 0..1_000_000u32 {
                let node = template
                    .replace(name, &format!("endless-{i:07}"))
                    .replace(ip, &format!("198.18.{}.{}", i / 250 % 250, i % 250 + 1));
                if write!(w, "{node},").is_err() {
                    return;
                }
            }
        }
        Endless::String => {
            if write!(w, "{{\"metadata\":{{\"name\":\"").is_err() {
                return;
            }
            let block = vec![b'a'; 64 * 1024];
            for _ in 0..100_000 {
                if w.write_all(&block).is_err() {
                    return;
                }
            }
        }
    }
}

fn chunk(w: &mut impl Write, line: &str) -> bool {
    write!(w, "{:x}\r\n{line}\n\r\n", line.len() + 1)
        .and_then(|()| w.flush())
        .is_ok()
}

/// One watch event in the stream's encoding: a JSON line, or a protobuf frame.
fn send_event(w: &mut impl Write, event: &[u8], proto: bool) -> bool {
    if !proto {
        return chunk(w, std::str::from_utf8(event).unwrap());
    }
    write!(w, "{:x}\r\n", event.len())
        .and_then(|()| w.write_all(event))
        .and_then(|()| w.write_all(b"\r\n"))
        .and_then(|()| w.flush())
        .is_ok()
}

/// A watch event of type `kind` whose object is `object` (JSON), as `proto` says.
fn event_bytes(kind: &str, object: &Value, proto: bool) -> Vec<u8> {
    match (proto, kind) {
        (false, _) => json!({"type": kind, "object": object})
            .to_string()
            .into_bytes(),
        (true, "ERROR") => kube_proto::watch_frame(kind, "Status", &kube_proto::status(object)),
        (true, _) => kube_proto::watch_frame(kind, "Node", &kube_proto::node(object)),
    }
}

fn watch(w: &mut impl Write, shared: &Shared, req: &Req, bookmark_every: Duration) {
    let (failure, proto) = {
        let mut s = shared.state.lock().unwrap();
        s.watches += 1;
        // Keepalive lines are JSON's: a server sending them speaks JSON.
        let proto = protobuf(req, &s) && s.keepalive_only.is_none();
        s.protobuf_answers += usize::from(proto);
        (s.watch_failure.clone(), proto)
    };
    if let Some((code, message)) = failure {
        respond_status(w, proto, code, "Failure", &message);
        return;
    }
    let selector = match name_selector(req) {
        Ok(s) => s,
        Err(status) => return respond(w, 400, &status),
    };
    let from: u64 = req
        .query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        req.query
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1800),
    );
    let bookmarks = req
        .query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let content_type = match proto {
        true => "application/vnd.kubernetes.protobuf;stream=watch",
        false => "application/json",
    };
    if !head_as(w, 200, Body::Chunked, content_type) || w.flush().is_err() {
        return;
    }
    let keepalive = shared.state.lock().unwrap().keepalive_only;
    if let Some(every) = keepalive {
        // Blank lines only, for as long as the mode lasts: never an event, never the end.
        loop {
            {
                let s = shared.state.lock().unwrap();
                if s.down || s.keepalive_only.is_none() {
                    return;
                }
            }
            if !chunk(w, "") {
                return;
            }
            std::thread::sleep(every);
        }
    }
    let started = Instant::now();
    let mut s = shared.state.lock().unwrap();
    let epoch = s.watch_epoch;
    if from < s.oldest {
        let status = status_value(
            410,
            "Expired",
            &format!("too old resource version: {from} ({})", s.oldest),
        );
        drop(s);
        send_event(w, &event_bytes("ERROR", &status, proto), proto);
        let _ = write!(w, "0\r\n\r\n");
        let _ = w.flush();
        return;
    }
    let mut cursor = from;
    let mut last_sent = Instant::now();
    loop {
        if s.down {
            // The server died: the stream is cut, no last chunk.
            return;
        }
        if s.watch_epoch != epoch || started.elapsed() >= timeout {
            drop(s);
            let _ = write!(w, "0\r\n\r\n");
            let _ = w.flush();
            return;
        }
        let lines: Vec<Vec<u8>> = s
            .events
            .iter()
            .filter(|(rv, _, obj)| *rv > cursor && picks(selector.as_deref(), obj))
            .map(|(_, kind, obj)| event_bytes(kind, obj, proto))
            .collect();
        if let Some((rv, _, _)) = s.events.last() {
            cursor = cursor.max(*rv);
        }
        let bookmark = (bookmarks && lines.is_empty() && last_sent.elapsed() >= bookmark_every).then(|| {
            cursor = cursor.max(s.rv);
            event_bytes("BOOKMARK", &json!({"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": s.rv.to_string(), "annotations": {"k8s.io/initial-events-end": "false"}}}), proto)
        });
        s.watch_bytes += lines.iter().map(|l| l.len() as u64 + 1).sum::<u64>();
        s.bookmarks += u64::from(bookmark.is_some());
        drop(s);
        for line in lines.iter().chain(bookmark.iter()) {
            if !send_event(w, line, proto) {
                return;
            }
            last_sent = Instant::now();
        }
        s = shared.state.lock().unwrap();
        if !s.down && s.watch_epoch == epoch && !s.events.iter().any(|(rv, _, _)| *rv > cursor) {
            s = shared
                .changed
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }
}

fn patch(w: &mut impl Write, shared: &Shared, req: &Req) {
    // Only the status subresource, as flannel's RBAC (`nodes/status: patch`) allows: a patch
    // of the whole Node is refused as a real API server would refuse it to such an agent.
    let Some(name) = req
        .path
        .trim_start_matches("/api/v1/nodes/")
        .strip_suffix("/status")
        .map(str::to_string)
    else {
        respond(
            w,
            403,
            &status_json(
                403,
                "Forbidden",
                "nodes is forbidden: patch is allowed on nodes/status only",
            ),
        );
        return;
    };
    let Ok(p) = serde_json::from_slice::<Value>(&req.body) else {
        respond(w, 400, &status_json(400, "BadRequest", "not JSON"));
        return;
    };
    if req.headers.get("content-type").map(String::as_str) != Some("application/merge-patch+json") {
        respond(
            w,
            415,
            &status_json(415, "UnsupportedMediaType", "want a merge patch"),
        );
        return;
    }
    let mut s = shared.state.lock().unwrap();
    if s.refuse_patches > 0 {
        s.refuse_patches -= 1;
        s.patches_refused += 1;
        drop(s);
        respond(
            w,
            403,
            &status_json(
                403,
                "Forbidden",
                &format!("nodes \"{name}\" is forbidden: cannot patch resource \"nodes/status\""),
            ),
        );
        return;
    }
    s.patches.push((name.clone(), p.clone()));
    let Some(mut node) = s.nodes.get(&name).cloned() else {
        drop(s);
        respond(w, 404, &not_found(&name));
        return;
    };
    if let Some(a) = p["metadata"]["annotations"].as_object() {
        for (k, v) in a {
            node["metadata"]["annotations"][k] = v.clone();
        }
    }
    s.rv += 1;
    node["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    let rv = s.rv;
    s.events.push((rv, "MODIFIED", node.clone()));
    s.nodes.insert(name, node.clone());
    drop(s);
    shared.changed.notify_all();
    respond(w, 200, &node.to_string());
}

/// Resident memory of process `pid`, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Heartbeats as the kubelets send them, for `lasting`: every `every`, Node `node_of(beat)`
/// put again with a new `lastHeartbeatTime` on its Ready condition (as [`node_json`] makes it),
/// `beat` counting on from `next`. How many were sent.
pub fn heartbeats(
    api: &ApiServer,
    every: Duration,
    lasting: Duration,
    next: &mut usize,
    node_of: impl Fn(usize) -> Value,
) -> usize {
    let start = Instant::now();
    let first = *next;
    while start.elapsed() < lasting {
        let beat = *next;
        let mut node = node_of(beat);
        node["status"]["conditions"][3]["lastHeartbeatTime"] = json!(format!(
            "2026-11-25T03:{:02}:{:02}Z",
            beat / 60 % 60,
            beat % 60
        ));
        api.put_node(node);
        *next += 1;
        std::thread::sleep(every);
    }
    *next - first
}

/// CPU time process `pid` used so far, user and system, in clock ticks (USER_HZ, 100 a second).
pub fn cpu_ticks(pid: u32) -> u64 {
    ticks_in(&format!("/proc/{pid}/stat"))
}

/// CPU time the main thread of process `pid` used so far (the agent's main loop: its rounds
/// and writes, not the watch), in clock ticks.
pub fn main_thread_ticks(pid: u32) -> u64 {
    ticks_in(&format!("/proc/{pid}/task/{pid}/stat"))
}

fn ticks_in(stat_path: &str) -> u64 {
    let stat = std::fs::read_to_string(stat_path).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Polls `f` every 50 ms until it is true or `deadline` passes; returns how long it took.
pub fn wait_for(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// The agent's binary, built by cargo for the tests.
/// sticky-vxlan-agent as built for this test run ([`crate::support::bins::built`]).
pub fn agent_bin() -> &'static str {
    crate::support::bins::built("sticky-vxlan-agent")
}

/// `sticky-vxlan-agent` (or a daemon beside it, sticky-wg) running inside a node namespace,
/// its stderr kept in a file; killed on drop.
pub struct Agent {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(bin: &str, netns: &str, log: PathBuf, args: &[&str]) -> Agent {
        Agent::start_env(bin, netns, log, args, &[])
    }

    /// [`Agent::start`] with these environment variables besides `PATH` (a proxy, say).
    pub fn start_env(
        bin: &str,
        netns: &str,
        log: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        // STICKY_AGENT_BIN runs another build of the agent instead (to see a test fail on an
        // older agent); a daemon beside it (sticky-wg) runs as given.
        let bin = match std::env::var("STICKY_AGENT_BIN") {
            Ok(other) if bin.ends_with("/sticky-vxlan-agent") => other,
            _ => bin.to_string(),
        };
        let err = std::fs::File::create(&log).expect("agent log");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", netns, &bin])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn agent");
        Agent { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the agent (as a reboot or a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `GET path` from inside the network namespace at `netns` (a thread enters it): status line
/// and body.
pub fn get_in_netns(netns: &Path, addr: &str, path: &str) -> Option<String> {
    netns::run_in(netns, || {
        let mut conn = TcpStream::connect(addr).ok()?;
        write!(conn, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut out = String::new();
        std::io::Read::read_to_string(&mut conn, &mut out).ok()?;
        Some(out)
    })
    .ok()
    .flatten()
}

/// An HTTP CONNECT proxy in a network namespace that records what it is asked and what
/// clients send through it (to see that a proxy is used, or not, and sees only TLS).
pub struct ConnectProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<ProxySeen>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct ProxySeen {
    /// Each request line (`CONNECT host:port HTTP/1.1`, or whatever else came).
    requests: Vec<String>,
    /// Every byte clients sent through a tunnel.
    sent: Vec<u8>,
}

impl ConnectProxy {
    /// A proxy on `ip` (port chosen by the kernel) in the namespace at `netns`, which it also
    /// connects from.
    pub fn new(ip: &str, netns: &Path) -> ConnectProxy {
        let addr = SocketAddr::new(ip.parse().expect("the proxy's IP address"), 0);
        let listener = netns::run_in(netns, || TcpListener::bind(addr))
            .expect("enter netns")
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("local addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let seen = Arc::new(Mutex::new(ProxySeen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, ns) = (seen.clone(), stop.clone(), netns.to_path_buf());
        let accept = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (s, ns) = (s.clone(), ns.clone());
                        std::thread::spawn(move || tunnel(conn, &s, &ns));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        ConnectProxy {
            addr,
            seen,
            stop,
            accept: Some(accept),
        }
    }

    /// `http://<addr>`, for `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The request lines received so far.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().requests.clone()
    }

    /// Everything clients sent through the tunnels so far.
    pub fn sent(&self) -> Vec<u8> {
        self.seen.lock().unwrap().sent.clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// One proxied connection: the CONNECT request, the upstream connection (made in `netns`),
/// then bytes both ways, the client's recorded.
fn tunnel(conn: TcpStream, seen: &Mutex<ProxySeen>, netns: &Path) {
    let _ = conn.set_nonblocking(false);
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    seen.lock()
        .unwrap()
        .requests
        .push(line.trim_end().to_string());
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return;
        }
        if header == "\r\n" || header == "\n" {
            break;
        }
    }
    let mut conn = conn;
    let target = match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["CONNECT", target, _] => target.to_string(),
        _ => {
            let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n");
            return;
        }
    };
    let upstream = netns::run_in(netns, || TcpStream::connect(&target))
        .ok()
        .and_then(Result::ok);
    let Some(upstream) = upstream else {
        let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n");
        return;
    };
    if conn
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let (Ok(mut down), Ok(mut client)) = (upstream.try_clone(), conn.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut down, &mut client);
        let _ = client.shutdown(std::net::Shutdown::Both);
    });
    let mut up = upstream;
    let mut buf = reader.buffer().to_vec();
    loop {
        if !buf.is_empty() {
            seen.lock().unwrap().sent.extend_from_slice(&buf);
            if up.write_all(&buf).is_err() {
                break;
            }
        }
        buf.resize(16 * 1024, 0);
        let n = match std::io::Read::read(reader.get_mut(), &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.truncate(n);
    }
    let _ = up.shutdown(std::net::Shutdown::Both);
}
