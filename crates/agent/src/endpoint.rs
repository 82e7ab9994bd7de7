//! Where the API is and how to talk to it: in-cluster (service account token re-read on every
//! request as it rotates, the cluster CA, `KUBERNETES_SERVICE_HOST/PORT`), a kubeconfig file
//! (kubectl's format: server, CA, token or client certificate), or a plain `--server URL`
//! (e.g. YurtHub's proxy on the node).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use ureq::Proxy;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

pub const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// A kubeconfig, a CA or a token larger than this is refused before it is parsed.
pub const MAX_FILE: u64 = 1024 * 1024;
/// YAML nested deeper than this is refused before it is parsed (a kubeconfig is 4 deep).
const MAX_YAML_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_FILE} bytes: not a kubeconfig, CA or token")]
    TooLarge { path: PathBuf },
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("server URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{what}: {reason}")]
    Pem { what: String, reason: String },
    #[error(
        "server URL {url:?}: {what} would be sent in clear over http:// to a host that is not this machine; use https:// (http:// is allowed only to a loopback address, e.g. YurtHub's proxy at http://127.0.0.1:10261)"
    )]
    Cleartext { url: String, what: &'static str },
    #[error(
        "token {from}: it holds a control character (a CR, LF or NUL would inject headers): refused"
    )]
    TokenControl { from: String },
    #[error(transparent)]
    Proxy(#[from] super::proxy::Error),
    #[error(
        "{from}={url:?}: {reason} (the agent reaches its API through an http:// proxy with CONNECT, or directly: see NO_PROXY)"
    )]
    ProxyUrl {
        from: &'static str,
        url: String,
        reason: String,
    },
}

/// How requests are authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    None,
    /// A token given literally (kubeconfig `token`).
    Token(String),
    /// A token read from this file before every request (it rotates).
    TokenFile(PathBuf),
}

/// An API server (or cache) to talk to.
#[derive(Clone)]
pub struct Endpoint {
    /// `scheme://host:port[/base]`, without a trailing `/`.
    pub base: String,
    /// The proxy from the environment for this server, by client-go's rules
    /// ([`super::proxy`]); `None`: connect directly.
    pub proxy: Option<EndpointProxy>,
    /// For https: whom to trust (the cluster CA only) and the client certificate.
    pub tls: Option<TlsConfig>,
    pub auth: Auth,
    /// For the log: the URL as given.
    pub url: String,
}

/// A proxy the agent's requests to its server go through.
#[derive(Clone, Debug)]
pub struct EndpointProxy {
    /// For ureq, which is given this one and reads no environment itself.
    pub proxy: Proxy,
    /// For the log: `host:port` (never the credentials) and the variable it came from.
    pub shown: String,
}

/// The proxy the environment names for `u` by client-go's rules, checked as ureq will use it:
/// an `http://` proxy reached with CONNECT (ureq here speaks no SOCKS, and trusts only the
/// cluster CA, so an `https://` proxy could not be verified).
fn endpoint_proxy(
    u: &Url,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<EndpointProxy>, Error> {
    let target = super::proxy::Target {
        tls: u.tls,
        host: &u.host,
        port: u.port,
    };
    let Some(chosen) = super::proxy::choose(env, target)? else {
        return Ok(None);
    };
    let bad = |reason: &str| Error::ProxyUrl {
        from: chosen.from,
        url: chosen.url.clone(),
        reason: reason.to_string(),
    };
    if !chosen
        .url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    {
        return Err(bad("only an http:// proxy is supported"));
    }
    let proxy = Proxy::new(&chosen.url).map_err(|e| bad(&e.to_string()))?;
    let shown = format!("{}:{} (from {})", proxy.host(), proxy.port(), chosen.from);
    Ok(Some(EndpointProxy { proxy, shown }))
}

/// Refuses a token that could inject a header (CR, LF, NUL or any other control character).
fn checked_token(token: &str, from: impl FnOnce() -> String) -> Result<String, Error> {
    let token = token.trim();
    if token.chars().any(char::is_control) {
        return Err(Error::TokenControl { from: from() });
    }
    Ok(token.to_string())
}

impl Endpoint {
    /// The `Authorization` header for the next request, if any: a token file is read again
    /// every time (it rotates) and checked every time.
    pub fn authorization(&self) -> Result<Option<String>, Error> {
        match &self.auth {
            Auth::None => Ok(None),
            Auth::Token(t) => Ok(Some(format!("Bearer {t}"))),
            Auth::TokenFile(p) => {
                let t = read(p)?;
                let t = checked_token(&String::from_utf8_lossy(&t), || {
                    format!("file {}", p.display())
                })?;
                Ok(Some(format!("Bearer {t}")))
            }
        }
    }
}

/// `scheme://host[:port][/base]`.
struct Url {
    tls: bool,
    host: String,
    port: u16,
    base: String,
}

fn parse_url(url: &str) -> Result<Url, Error> {
    let bad = |reason: &str| Error::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("holds white space or a control character"));
    }
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad("must start with https:// or http://"));
    };
    let (authority, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    let default_port = if tls { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("unclosed [ in the host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None if after.is_empty() => default_port,
            None => return Err(bad("junk after the host")),
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("bad port"))?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(Url {
        tls,
        host,
        port,
        base: base.to_string(),
    })
}

/// True for `localhost` and loopback addresses: the only hosts http:// may carry
/// credentials to.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn pem_items(what: &str, pem: &[u8]) -> Result<Vec<PemItem<'static>>, Error> {
    ureq::tls::parse_pem(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            what: what.to_string(),
            reason: e.to_string(),
        })
}

fn pem_certs(what: &str, pem: &[u8]) -> Result<Vec<Certificate<'static>>, Error> {
    let certs: Vec<Certificate<'static>> = pem_items(what, pem)?
        .into_iter()
        .filter_map(|i| match i {
            PemItem::Certificate(c) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(Error::Pem {
            what: what.to_string(),
            reason: "no PEM certificate in it".into(),
        });
    }
    Ok(certs)
}

fn pem_key(pem: &[u8]) -> Result<PrivateKey<'static>, Error> {
    pem_items("client key", pem)?
        .into_iter()
        .find_map(|i| match i {
            PemItem::PrivateKey(k) => Some(k),
            _ => None,
        })
        .ok_or_else(|| Error::Pem {
            what: "client key".into(),
            reason: "no PEM private key in it".into(),
        })
}

/// TLS settings trusting only `ca_pem` (the cluster CA), with an optional client certificate.
pub fn tls_config(ca_pem: &[u8], client: Option<(&[u8], &[u8])>) -> Result<TlsConfig, Error> {
    let roots = RootCerts::Specific(Arc::new(pem_certs("cluster CA", ca_pem)?));
    let client = match client {
        None => None,
        Some((cert, key)) => Some(ClientCert::new_with_certs(
            &pem_certs("client certificate", cert)?,
            pem_key(key)?,
        )),
    };
    Ok(TlsConfig::builder()
        .root_certs(roots)
        .client_cert(client)
        .build())
}

fn endpoint(
    url: &str,
    ca: Option<&[u8]>,
    client: Option<(&[u8], &[u8])>,
    auth: Auth,
) -> Result<Endpoint, Error> {
    let u = parse_url(url)?;
    let loopback = is_loopback(&u.host);
    let proxy = endpoint_proxy(&u, |name| std::env::var(name).ok())?;
    if !u.tls && !loopback {
        let what = match (&auth, client) {
            (_, Some(_)) => Some("a client certificate"),
            (Auth::None, None) => None,
            _ => Some("the bearer token"),
        };
        if let Some(what) = what {
            return Err(Error::Cleartext {
                url: url.to_string(),
                what,
            });
        }
    }
    if let Auth::Token(t) = &auth {
        checked_token(t, || "in the kubeconfig".to_string())?;
    }
    let tls = match (u.tls, ca) {
        (false, _) => None,
        (true, Some(ca)) => Some(tls_config(ca, client)?),
        (true, None) => {
            return Err(Error::Url {
                url: url.to_string(),
                reason: "https needs the cluster CA (--ca-file, or certificate-authority in the kubeconfig)".into(),
            });
        }
    };
    let host = if u.host.contains(':') {
        format!("[{}]", u.host)
    } else {
        u.host
    };
    let scheme = if u.tls { "https" } else { "http" };
    Ok(Endpoint {
        base: format!("{scheme}://{host}:{}{}", u.port, u.base),
        proxy,
        tls,
        auth,
        url: url.to_string(),
    })
}

/// A small file read whole ([`sticky_primitives::nofollow::read_regular`]: a regular file of at most
/// [`MAX_FILE`] bytes; a FIFO or `/dev/zero` is refused, never read forever).
fn read(path: &Path) -> Result<Vec<u8>, Error> {
    sticky_primitives::nofollow::read_regular(path, MAX_FILE).map_err(|source| {
        if source.kind() == std::io::ErrorKind::FileTooLarge {
            Error::TooLarge {
                path: path.to_path_buf(),
            }
        } else {
            Error::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// How deeply `text` nests `[`/`{` or YAML indentation, cheaply over-estimated: refuses a
/// hostile kubeconfig before the YAML parser recurses through it.
fn nesting(text: &[u8]) -> usize {
    let mut depth: usize = 0;
    let mut max = 0;
    let mut indent_max = 0;
    let mut at_line_start = true;
    let mut indent = 0;
    for &b in text {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if b == b'\n' {
            at_line_start = true;
            indent = 0;
        } else if at_line_start && (b == b' ' || b == b'-') {
            indent += 1;
        } else if at_line_start {
            at_line_start = false;
            indent_max = indent_max.max(indent / 2);
        }
    }
    max.max(indent_max)
}

/// `--server URL` with an optional CA file and token file.
pub fn from_server(
    url: &str,
    ca_file: Option<&Path>,
    token_file: Option<&Path>,
) -> Result<Endpoint, Error> {
    let ca = ca_file.map(read).transpose()?;
    let auth = token_file.map_or(Auth::None, |p| Auth::TokenFile(p.to_path_buf()));
    endpoint(url, ca.as_deref(), None, auth)
}

/// In a pod: `KUBERNETES_SERVICE_HOST/PORT`, the service account's CA and token.
pub fn in_cluster(host: &str, port: &str) -> Result<Endpoint, Error> {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let ca = read(Path::new(IN_CLUSTER_CA))?;
    endpoint(
        &format!("https://{host}:{port}"),
        Some(&ca),
        None,
        Auth::TokenFile(PathBuf::from(IN_CLUSTER_TOKEN)),
    )
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(rename = "current-context", default)]
    current_context: String,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: T,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

#[derive(Deserialize)]
struct Cluster {
    server: String,
    #[serde(rename = "certificate-authority")]
    ca: Option<PathBuf>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure: bool,
}

#[derive(Deserialize, Default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(rename = "client-certificate")]
    cert: Option<PathBuf>,
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key")]
    key: Option<PathBuf>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
    exec: Option<serde_yaml_ng::Value>,
    #[serde(rename = "auth-provider")]
    auth_provider: Option<serde_yaml_ng::Value>,
}

/// A kubeconfig file (YAML or JSON), its current context.
pub fn from_kubeconfig(path: &Path) -> Result<Endpoint, Error> {
    let bad = |reason: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let text = read(path)?;
    if nesting(&text) > MAX_YAML_DEPTH {
        return Err(bad(format!(
            "nested more than {MAX_YAML_DEPTH} levels deep: not a kubeconfig"
        )));
    }
    let kc: Kubeconfig = serde_yaml_ng::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == kc.current_context)
        .ok_or_else(|| {
            bad(format!(
                "no context named current-context {:?}",
                kc.current_context
            ))
        })?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.value.cluster)
        .ok_or_else(|| bad(format!("no cluster named {:?}", ctx.value.cluster)))?;
    let no_user = User::default();
    let user = kc
        .users
        .iter()
        .find(|u| u.name == ctx.value.user)
        .map_or(&no_user, |u| &u.value);
    if cluster.value.insecure {
        return Err(bad(
            "insecure-skip-tls-verify is not supported: give the cluster CA".into(),
        ));
    }
    if user.exec.is_some() || user.auth_provider.is_some() {
        return Err(bad(
            "exec and auth-provider credentials are not supported: use a token, tokenFile or a client certificate".into(),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    // Relative paths in a kubeconfig are relative to the file, as kubectl reads them.
    let file = |p: &PathBuf| read(&dir.join(p));
    let data = |what: &str, s: &String| {
        base64_decode(s).ok_or_else(|| bad(format!("{what} is not base64")))
    };
    let pick = |what: &str,
                inline: &Option<String>,
                path: &Option<PathBuf>|
     -> Result<Option<Vec<u8>>, Error> {
        match (inline, path) {
            (Some(s), _) => data(what, s).map(Some),
            (None, Some(p)) => file(p).map(Some),
            (None, None) => Ok(None),
        }
    };
    let ca = pick(
        "certificate-authority-data",
        &cluster.value.ca_data,
        &cluster.value.ca,
    )?;
    let cert = pick("client-certificate-data", &user.cert_data, &user.cert)?;
    let key = pick("client-key-data", &user.key_data, &user.key)?;
    let client = match (&cert, &key) {
        (Some(c), Some(k)) => Some((c.as_slice(), k.as_slice())),
        (None, None) => None,
        _ => {
            return Err(bad(
                "a client certificate needs both the certificate and its key".into(),
            ));
        }
    };
    let auth = match (&user.token, &user.token_file) {
        (Some(t), _) => Auth::Token(t.clone()),
        (None, Some(p)) => Auth::TokenFile(dir.join(p)),
        (None, None) => Auth::None,
    };
    endpoint(&cluster.value.server, ca.as_deref(), client, auth)
}

/// Standard base64 (with or without padding; whitespace ignored), as kubeconfig `*-data`.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut padding = 0;
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            _ => return None,
        };
        if padding > 0 {
            return None;
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (padding <= 2 && acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_as_kubeconfig_writes_it() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8h").unwrap(), b"hello!");
        assert!(base64_decode("aGVsbG8*").is_none());
        assert!(base64_decode("aG=Vs").is_none());
    }

    #[test]
    fn a_token_file_is_read_again_for_every_request_as_it_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first\n").unwrap();
        let e = from_server("http://127.0.0.1:8080", None, Some(&token)).unwrap();
        assert_eq!(e.authorization().unwrap().unwrap(), "Bearer first");
        std::fs::write(&token, "second").unwrap();
        assert_eq!(e.authorization().unwrap().unwrap(), "Bearer second");
        assert!(
            from_server("https://127.0.0.1:6443", None, None).is_err(),
            "https needs a CA"
        );
    }

    #[test]
    fn urls() {
        let u = parse_url("https://10.96.0.1:6443").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.base.as_str()),
            (true, "10.96.0.1", 6443, "")
        );
        let u = parse_url("http://127.0.0.1:10261/").unwrap();
        assert_eq!((u.tls, u.port, u.base.as_str()), (false, 10261, ""));
        let u = parse_url("https://[2001:db8::1]/k8s").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.base.as_str()),
            ("2001:db8::1", 443, "/k8s")
        );
        for bad in ["ftp://x", "https://", "https://h:x", "https://[::1"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubeconfig_refuses_what_it_cannot_honour() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        let write = |user: &str, cluster_extra: &str| {
            std::fs::write(
                &kc,
                format!(
                    "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nclusters:\n- name: k\n  cluster:\n    server: http://127.0.0.1:8080\n{cluster_extra}users:\n- name: u\n  user:\n{user}"
                ),
            )
            .unwrap();
        };
        write("    token: abc\n", "");
        let e = from_kubeconfig(&kc).unwrap();
        assert_eq!(e.auth, Auth::Token("abc".into()));
        assert_eq!(e.authorization().unwrap().unwrap(), "Bearer abc");
        write("    tokenFile: tok\n", "");
        assert_eq!(
            from_kubeconfig(&kc).unwrap().auth,
            Auth::TokenFile(dir.path().join("tok"))
        );
        write("    exec:\n      command: aws\n", "");
        assert!(from_kubeconfig(&kc).is_err());
        write("    token: abc\n", "    insecure-skip-tls-verify: true\n");
        assert!(from_kubeconfig(&kc).is_err());
    }

    #[test]
    fn credentials_never_go_out_in_clear_except_to_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        for url in [
            "http://127.0.0.1:10261",
            "http://localhost:8080",
            "http://[::1]:80",
        ] {
            assert!(from_server(url, None, Some(&token)).is_ok(), "{url}");
        }
        let err = from_server("http://192.0.2.10:8080", None, Some(&token))
            .err()
            .unwrap();
        assert!(matches!(err, Error::Cleartext { .. }), "{err}");
        assert!(err.to_string().contains("bearer token"), "{err}");
        // Without credentials, plain http is only a choice (an unauthenticated cache).
        assert!(from_server("http://192.0.2.10:8080", None, None).is_ok());
    }

    #[test]
    fn a_token_with_a_control_character_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok\r\nX-Injected: yes").unwrap();
        let e = from_server("http://127.0.0.1:8080", None, Some(&token)).unwrap();
        let err = e.authorization().unwrap_err();
        assert!(matches!(err, Error::TokenControl { .. }), "{err}");
        // A trailing newline (how token files are written) is not a control character.
        std::fs::write(&token, "tok\n").unwrap();
        assert_eq!(e.authorization().unwrap().unwrap(), "Bearer tok");
    }

    #[test]
    fn the_proxy_is_one_ureq_can_use_or_a_clear_error() {
        let proxy_for = |url: &str, proxy: &str| {
            let env = |name: &str| (name == "HTTPS_PROXY").then(|| proxy.to_string());
            endpoint_proxy(&parse_url(url).unwrap(), env).map(|p| p.map(|p| p.shown))
        };
        assert_eq!(
            proxy_for(
                "https://198.51.100.1:6443",
                "http://u:secret@proxy.example:3128"
            )
            .unwrap()
            .as_deref(),
            Some("proxy.example:3128 (from HTTPS_PROXY)"),
            "the log shows where, never the credentials"
        );
        assert_eq!(
            proxy_for("https://198.51.100.1:6443", "proxy.example")
                .unwrap()
                .as_deref(),
            Some("proxy.example:80 (from HTTPS_PROXY)")
        );
        assert!(
            proxy_for("https://127.0.0.1:6443", "socks5://p")
                .unwrap()
                .is_none()
        );
        for bad in ["socks5://proxy.example", "https://proxy.example"] {
            let err = proxy_for("https://198.51.100.1:6443", bad).unwrap_err();
            assert!(matches!(err, Error::ProxyUrl { .. }), "{err}");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn files_that_are_not_small_regular_files_are_refused_at_once() {
        assert!(matches!(
            from_kubeconfig(Path::new("/dev/zero")),
            Err(Error::Read { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        std::fs::write(&kc, "[".repeat(100_000)).unwrap();
        let err = from_kubeconfig(&kc).err().unwrap();
        assert!(err.to_string().contains("nested more than"), "{err}");
        std::fs::write(&kc, vec![b' '; MAX_FILE as usize + 1]).unwrap();
        assert!(matches!(from_kubeconfig(&kc), Err(Error::TooLarge { .. })));
    }
}
