//! Where the API is and how to talk to it: in-cluster (service account token re-read on every
//! request as it rotates, the cluster CA, `KUBERNETES_SERVICE_HOST/PORT`), a kubeconfig file
//! (kubectl's format: server, CA, token or client certificate), or a plain `--server URL`
//! (e.g. YurtHub's proxy on the node).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::http::Target;

pub const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("server URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{what}: {reason}")]
    Pem { what: String, reason: String },
    #[error("TLS settings: {0}")]
    Tls(#[from] rustls::Error),
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
    pub target: Target,
    /// Path prefix of the server URL (usually empty).
    pub base: String,
    pub auth: Auth,
    /// For the log: the URL.
    pub url: String,
}

impl Endpoint {
    /// The `Authorization` header for the next request, if any.
    pub fn authorization(&self) -> Result<Option<String>, Error> {
        match &self.auth {
            Auth::None => Ok(None),
            Auth::Token(t) => Ok(Some(format!("Bearer {t}"))),
            Auth::TokenFile(p) => {
                let t = std::fs::read_to_string(p).map_err(|source| Error::Read {
                    path: p.clone(),
                    source,
                })?;
                Ok(Some(format!("Bearer {}", t.trim())))
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

fn pem_certs(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Pem {
            what: what.to_string(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            what: what.to_string(),
            reason: "no PEM certificate in it".into(),
        });
    }
    Ok(certs)
}

/// TLS settings trusting only `ca_pem` (the cluster CA), with an optional client certificate.
pub fn tls_config(
    ca_pem: &[u8],
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs("cluster CA", ca_pem)? {
        roots.add(c)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let cfg = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = pem_certs("client certificate", cert)?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::Pem {
                what: "client key".into(),
                reason: e.to_string(),
            })?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    Ok(Arc::new(cfg))
}

fn endpoint(
    url: &str,
    ca: Option<&[u8]>,
    client: Option<(&[u8], &[u8])>,
    auth: Auth,
) -> Result<Endpoint, Error> {
    let u = parse_url(url)?;
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
    Ok(Endpoint {
        target: Target {
            host: u.host,
            port: u.port,
            tls,
        },
        base: u.base,
        auth,
        url: url.to_string(),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
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
    let host = if host.contains(':') {
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
}
