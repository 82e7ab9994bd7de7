//! Which proxy, if any, carries the agent's requests to its API server (pure): the rules of
//! Go's `golang.org/x/net/http/httpproxy`, which client-go follows (kubelet, kubectl, every
//! controller on the node), so the agent goes where the node's other clients of that API go.
//!
//! - `HTTPS_PROXY` is the proxy for an `https://` server, `HTTP_PROXY` for an `http://` one;
//!   neither is used for the other scheme, and `ALL_PROXY` is not read (Go does not read it).
//!   Each upper-case name is read first; its lower-case twin only when the upper-case one is
//!   unset or empty. With `REQUEST_METHOD` set (a CGI environment, where `HTTP_PROXY` may come
//!   from a request header), `HTTP_PROXY` is refused with an error, as Go refuses it.
//! - A proxy given as `host[:port]` is `http://host[:port]`.
//! - `NO_PROXY` is a comma-separated list, each entry trimmed of spaces and compared in lower
//!   case: `*` (no proxy at all); a CIDR (`10.96.0.0/12`, `2001:db8::/64`); an IP address
//!   (IPv6 without brackets), optionally with a port (`192.0.2.1:6443`, `[2001:db8::1]:6443`,
//!   then only that port matches); a domain `example.com` (itself and every subdomain),
//!   `.example.com` or `*.example.com` (subdomains only), optionally with a port. An entry Go
//!   cannot read matches nothing. A bracketed IPv6 address without a port is not an address
//!   to Go, and matches nothing here either.
//! - `localhost` and loopback addresses are never proxied.
//!
//! Non-ASCII host names are compared as written (Go first converts both sides to punycode).
//! ureq's own reading of the environment (which reads `ALL_PROXY`, splits `NO_PROXY` without
//! trimming and matches exact names only) is switched off: the agent gives ureq exactly the
//! proxy [`choose`] returns, or none.

use std::net::IpAddr;

use ipnet::IpNet;

/// The server a proxy is chosen for.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// `https://` (else `http://`).
    pub tls: bool,
    /// A name or an IP address, IPv6 without brackets.
    pub host: &'a str,
    pub port: u16,
}

/// The proxy chosen, and the variable it came from (for the log and the errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// `scheme://[user:password@]host[:port]` as the environment gave it, `http://` added
    /// when it named no scheme.
    pub url: String,
    pub from: &'static str,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "{from} is set and REQUEST_METHOD is too (a CGI environment, where HTTP_PROXY can come from a request): refusing to use it, as Go does (golang.org/s/cgihttpproxy)"
    )]
    Cgi { from: &'static str },
}

/// The first of `names` set to a non-empty value, and which one it was (Go's `getEnvAny`).
fn env_any(
    env: &impl Fn(&str) -> Option<String>,
    names: [&'static str; 2],
) -> Option<(&'static str, String)> {
    names
        .into_iter()
        .find_map(|n| env(n).filter(|v| !v.is_empty()).map(|v| (n, v)))
}

/// The proxy for `target` from the environment `env` looks up, by Go's rules (see the module
/// docs): `None` means connect directly.
pub fn choose(
    env: impl Fn(&str) -> Option<String>,
    target: Target,
) -> Result<Option<Chosen>, Error> {
    let proxy = if target.tls {
        env_any(&env, ["HTTPS_PROXY", "https_proxy"])
    } else {
        let proxy = env_any(&env, ["HTTP_PROXY", "http_proxy"]);
        if let Some((from, _)) = &proxy
            && env("REQUEST_METHOD").is_some_and(|m| !m.is_empty())
        {
            return Err(Error::Cgi { from });
        }
        proxy
    };
    let Some((from, value)) = proxy else {
        return Ok(None);
    };
    let no_proxy = env_any(&env, ["NO_PROXY", "no_proxy"]).map_or(String::new(), |(_, v)| v);
    if !use_proxy(&no_proxy, target.host, target.port) {
        return Ok(None);
    }
    Ok(Some(Chosen {
        url: with_scheme(&value),
        from,
    }))
}

/// `value` as a URL: Go reads a value with no scheme (or one it does not know) as
/// `http://` + value.
fn with_scheme(value: &str) -> String {
    let known = ["http://", "https://", "socks5://"];
    if known
        .iter()
        .any(|s| value.len() >= s.len() && value[..s.len()].eq_ignore_ascii_case(s))
    {
        value.to_string()
    } else {
        format!("http://{value}")
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[host]:port` (the brackets removed); `None` when
/// `s` holds no port or is not of that shape.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return (!port.contains([':', '[', ']'])).then_some((host, port));
    }
    let (host, port) = s.rsplit_once(':')?;
    (!host.contains([':', '[', ']']) && !port.contains([':', '[', ']'])).then_some((host, port))
}

/// One `NO_PROXY` entry, as Go reads it.
#[derive(Debug, PartialEq)]
enum Entry {
    All,
    Cidr(IpNet),
    Ip {
        ip: IpAddr,
        port: Option<String>,
    },
    /// `suffix` starts with a dot; `itself`: the name without it matches too.
    Domain {
        suffix: String,
        itself: bool,
        port: Option<String>,
    },
}

/// An entry of `NO_PROXY` (already trimmed and in lower case); `None` for one Go ignores.
fn entry(p: &str) -> Option<Entry> {
    if p == "*" {
        return Some(Entry::All);
    }
    if let Ok(net) = p.parse::<IpNet>() {
        return Some(Entry::Cidr(net));
    }
    let (host, port) = match split_host_port(p) {
        Some(("", _)) => return None,
        Some((h, port)) => (h, Some(port.to_string())),
        None => (p, None),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(Entry::Ip { ip, port });
    }
    let host = host
        .strip_prefix('*')
        .filter(|h| h.starts_with('.'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    let (suffix, itself) = match host.starts_with('.') {
        true => (host.to_string(), false),
        false => (format!(".{host}"), true),
    };
    Some(Entry::Domain {
        suffix,
        itself,
        port,
    })
}

/// Go's `useProxy`: false for `localhost`, a loopback address and a host `no_proxy` names.
fn use_proxy(no_proxy: &str, host: &str, port: u16) -> bool {
    let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
    if host.eq_ignore_ascii_case("localhost") || ip.is_some_and(|ip| ip.is_loopback()) {
        return false;
    }
    let host = host.trim().to_ascii_lowercase();
    let port = port.to_string();
    let port_matches = |p: &Option<String>| p.as_ref().is_none_or(|p| *p == port);
    let entries = no_proxy
        .split(',')
        .map(|p| p.trim().to_lowercase())
        .filter(|p| !p.is_empty())
        .filter_map(|p| entry(&p));
    for e in entries {
        let matched = match &e {
            Entry::All => true,
            Entry::Cidr(net) => ip.is_some_and(|ip| net.contains(&ip)),
            Entry::Ip { ip: want, port: p } => {
                ip.is_some_and(|ip| ip == want.to_canonical()) && port_matches(p)
            }
            Entry::Domain {
                suffix,
                itself,
                port: p,
            } => {
                (host.ends_with(suffix.as_str()) || (*itself && host == suffix[1..]))
                    && port_matches(p)
            }
        };
        if matched {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Environment variables, as (name, value).
    type Vars<'a> = &'a [(&'a str, &'a str)];

    fn env<'a>(vars: Vars<'a>) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    /// `url` split as the agent's endpoint splits it.
    fn target(url: &str) -> Target<'_> {
        let (tls, rest) = match url.strip_prefix("https://") {
            Some(r) => (true, r),
            None => (false, url.strip_prefix("http://").unwrap()),
        };
        let rest = rest.trim_end_matches('/');
        let default = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']').unwrap();
            (
                h,
                after
                    .strip_prefix(':')
                    .map_or(default, |p| p.parse().unwrap()),
            )
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().unwrap()),
                None => (rest, default),
            }
        };
        Target { tls, host, port }
    }

    fn chosen(vars: &[(&str, &str)], url: &str) -> Result<Option<String>, Error> {
        choose(env(vars), target(url)).map(|c| c.map(|c| c.url))
    }

    /// Go's `proxyForURLTests` (golang.org/x/net/http/httpproxy/proxy_test.go), the cases
    /// that apply to the agent (not IDNA, not an ftp:// server), as (environment, request
    /// URL, proxy or `None`).
    #[test]
    fn go_proxy_for_url_cases() {
        let cases: &[(Vars, &str, Option<&str>)] = &[
            (
                &[("HTTP_PROXY", "127.0.0.1:8080")],
                "http://example.com",
                Some("http://127.0.0.1:8080"),
            ),
            (
                &[("HTTP_PROXY", "cache.corp.example.com:1234")],
                "http://example.com",
                Some("http://cache.corp.example.com:1234"),
            ),
            (
                &[("HTTP_PROXY", "cache.corp.example.com")],
                "http://example.com",
                Some("http://cache.corp.example.com"),
            ),
            (
                &[("HTTP_PROXY", "localhost")],
                "http://example.com",
                Some("http://localhost"),
            ),
            (
                &[("HTTP_PROXY", "https://cache.corp.example.com")],
                "http://example.com",
                Some("https://cache.corp.example.com"),
            ),
            (
                &[("HTTP_PROXY", "http://127.0.0.1:8080")],
                "http://example.com",
                Some("http://127.0.0.1:8080"),
            ),
            (
                &[("HTTP_PROXY", "https://127.0.0.1:8080")],
                "http://example.com",
                Some("https://127.0.0.1:8080"),
            ),
            (
                &[("HTTP_PROXY", "socks5://127.0.0.1")],
                "http://example.com",
                Some("socks5://127.0.0.1"),
            ),
            // Don't use the https proxy for http, use it for https.
            (
                &[
                    ("HTTP_PROXY", "http.proxy.tld"),
                    ("HTTPS_PROXY", "secure.proxy.tld"),
                ],
                "http://insecure.tld/",
                Some("http://http.proxy.tld"),
            ),
            (
                &[
                    ("HTTP_PROXY", "http.proxy.tld"),
                    ("HTTPS_PROXY", "secure.proxy.tld"),
                ],
                "https://secure.tld/",
                Some("http://secure.proxy.tld"),
            ),
            (
                &[
                    ("HTTP_PROXY", "http.proxy.tld"),
                    ("HTTPS_PROXY", "https://secure.proxy.tld"),
                ],
                "https://secure.tld/",
                Some("https://secure.proxy.tld"),
            ),
            // An http proxy is not one for https.
            (
                &[("HTTP_PROXY", "http.proxy.tld")],
                "https://secure.tld/",
                None,
            ),
            // In a CGI environment the https proxy is still used (Go's historical behaviour).
            (
                &[
                    ("HTTPS_PROXY", "https://secure.proxy.tld"),
                    ("REQUEST_METHOD", "GET"),
                ],
                "https://secure.tld/",
                Some("https://secure.proxy.tld"),
            ),
            (&[], "http://example.com", None),
            (
                &[("NO_PROXY", "example.com"), ("HTTP_PROXY", "proxy")],
                "http://example.com/",
                None,
            ),
            (
                &[("NO_PROXY", ".example.com"), ("HTTP_PROXY", "proxy")],
                "http://example.com/",
                Some("http://proxy"),
            ),
            (
                &[("NO_PROXY", "ample.com"), ("HTTP_PROXY", "proxy")],
                "http://example.com/",
                Some("http://proxy"),
            ),
            (
                &[("NO_PROXY", "example.com"), ("HTTP_PROXY", "proxy")],
                "http://foo.example.com/",
                None,
            ),
            (
                &[("NO_PROXY", ".foo.com"), ("HTTP_PROXY", "proxy")],
                "http://example.com/",
                Some("http://proxy"),
            ),
        ];
        for (vars, url, want) in cases {
            assert_eq!(
                chosen(vars, url),
                Ok(want.map(String::from)),
                "{vars:?} for {url}"
            );
        }
    }

    /// Go refuses HTTP_PROXY for an http server when REQUEST_METHOD is set (issue 16405).
    #[test]
    fn http_proxy_in_a_cgi_environment_is_refused() {
        let vars = [
            ("HTTP_PROXY", "http://10.1.2.3:8080"),
            ("REQUEST_METHOD", "GET"),
        ];
        let err = chosen(&vars, "http://example.com").unwrap_err();
        assert_eq!(err, Error::Cgi { from: "HTTP_PROXY" });
        assert!(err.to_string().contains("REQUEST_METHOD"), "{err}");
        // An empty REQUEST_METHOD is not set.
        let vars = [
            ("HTTP_PROXY", "http://10.1.2.3:8080"),
            ("REQUEST_METHOD", ""),
        ];
        assert_eq!(
            chosen(&vars, "http://example.com"),
            Ok(Some("http://10.1.2.3:8080".into()))
        );
    }

    fn via(url: &str, from: &'static str) -> Option<Chosen> {
        Some(Chosen {
            url: url.into(),
            from,
        })
    }

    /// Go's `FromEnvironment` tests: the upper-case name first, the lower-case one when the
    /// upper-case one is unset or empty; `ALL_PROXY` is never read.
    #[test]
    fn names_are_read_as_go_reads_them() {
        let https = "https://198.51.100.1:6443";
        let cases: Vec<(Vars, &str, Option<Chosen>)> = vec![
            (
                &[("HTTPS_PROXY", "upper"), ("https_proxy", "lower")],
                https,
                via("http://upper", "HTTPS_PROXY"),
            ),
            (
                &[("https_proxy", "lower")],
                https,
                via("http://lower", "https_proxy"),
            ),
            (
                &[("HTTPS_PROXY", ""), ("https_proxy", "lower")],
                https,
                via("http://lower", "https_proxy"),
            ),
            (
                &[("HTTP_PROXY", "upper"), ("http_proxy", "lower")],
                "http://192.0.2.1",
                via("http://upper", "HTTP_PROXY"),
            ),
            (
                &[("http_proxy", "lower")],
                "http://192.0.2.1",
                via("http://lower", "http_proxy"),
            ),
            (&[("ALL_PROXY", "p"), ("all_proxy", "p")], https, None),
            (
                &[("ALL_PROXY", "p"), ("all_proxy", "p")],
                "http://192.0.2.1",
                None,
            ),
            (&[("HTTP_PROXY", "p"), ("http_proxy", "p")], https, None),
            (
                &[("HTTPS_PROXY", "p"), ("https_proxy", "p")],
                "http://192.0.2.1",
                None,
            ),
            // NO_PROXY wins over no_proxy, which is read only without it.
            (
                &[
                    ("HTTPS_PROXY", "p"),
                    ("NO_PROXY", "example.com"),
                    ("no_proxy", "198.51.100.1"),
                ],
                https,
                via("http://p", "HTTPS_PROXY"),
            ),
            (
                &[
                    ("HTTPS_PROXY", "p"),
                    ("NO_PROXY", ""),
                    ("no_proxy", "198.51.100.1"),
                ],
                https,
                None,
            ),
        ];
        for (vars, url, want) in cases {
            let got = choose(env(vars), target(url)).unwrap();
            assert_eq!(got, want, "{vars:?} for {url}");
        }
    }

    /// Go's `UseProxyTests` against its `noProxy` list (every host on port 80), then `*`,
    /// then a malformed entry.
    #[test]
    fn go_use_proxy_cases() {
        let no_proxy = "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, 192.168.1.3:80, 10.0.0.0/30, 2001:db8::52:0:1, [2001:db8::52:0:2]:443, [2001:db8::52:0:3]:80, 2002:db8:a::45/64";
        let cases = [
            // Never proxy localhost.
            ("localhost", false),
            ("127.0.0.1", false),
            ("127.0.0.2", false),
            ("::1", false),
            ("::2", true),
            ("192.168.1.1", false), // an exact IPv4 address
            ("192.168.1.2", true),  // the ports do not match
            ("192.168.1.3", false), // an exact IPv4:port
            ("192.168.1.4", true),
            ("10.0.0.2", false),         // IPv4/CIDR
            ("2001:db8::52:0:1", false), // an exact IPv6 address
            ("2001:db8::52:0:2", true),  // the ports do not match
            ("2001:db8::52:0:3", false), // an exact [IPv6]:port
            ("2002:db8:a::123", false),  // IPv6/CIDR
            ("fe80::424b:c8be:1643:a1b6", true),
            ("barbaz.net", true), // .barbaz.net is subdomains only
            ("www.barbaz.net", false),
            ("foobar.com", false),     // foobar.com is itself
            ("www.foobar.com", false), // and its subdomains
            ("foofoobar.com", true),   // not a part of a name
            ("baz.com", true),
            ("localhost.net", true),
            ("local.localhost", true),
            ("barbarbaz.net", true),
            ("wildcard.io", true), // *.wildcard.io is subdomains only
            ("nested.wildcard.io", false),
            ("awildcard.io", true),
        ];
        for (host, want) in cases {
            assert_eq!(
                use_proxy(no_proxy, host, 80),
                want,
                "{host} with {no_proxy:?}"
            );
            assert!(!use_proxy("*", host, 80), "{host} with *");
            assert!(
                !use_proxy("example.com, * ,", host, 80),
                "{host} with a * in the list"
            );
        }
        // A malformed entry matches nothing (and does not panic).
        for bad in [":1", "[", "[]:80", "*", "", " , ", "[2001:db8::1", "a:b:c"] {
            let want = bad.trim() != "*";
            assert_eq!(use_proxy(bad, "example.com", 80), want, "{bad:?}");
        }
    }

    /// The review's forms (issue 27): a CIDR, an entry after a space, an unbracketed IPv6
    /// address, upper and lower case; and what Go does not read as an address.
    #[test]
    fn the_forms_a_cluster_writes() {
        let cases = [
            ("198.51.100.0/24", "198.51.100.1", 6443, false),
            ("10.96.0.0/12", "10.96.0.1", 443, false),
            ("10.96.0.0/12", "10.112.0.1", 443, true),
            ("localhost, 198.51.100.1", "198.51.100.1", 6443, false),
            ("  198.51.100.1  ,x", "198.51.100.1", 6443, false),
            ("2001:db8:aa::1", "2001:db8:aa::1", 6443, false),
            ("2001:DB8:AA::1", "2001:db8:aa::1", 6443, false),
            ("2001:db8:aa::/48", "2001:db8:aa::1", 6443, false),
            ("[2001:db8:aa::1]:6443", "2001:db8:aa::1", 6443, false),
            ("[2001:db8:aa::1]:443", "2001:db8:aa::1", 6443, true),
            // Not an address to Go: a bracketed IPv6 address without a port.
            ("[2001:db8:aa::1]", "2001:db8:aa::1", 6443, true),
            ("198.51.100.1:6443", "198.51.100.1", 6443, false),
            ("198.51.100.1:443", "198.51.100.1", 6443, true),
            ("Example.COM", "api.example.com", 6443, false),
            (".example.com:6443", "api.example.com", 6443, false),
            (".example.com:443", "api.example.com", 6443, true),
            // An IPv4-mapped IPv6 address is that IPv4 address, both ways.
            ("198.51.100.1", "::ffff:198.51.100.1", 6443, false),
            ("::ffff:198.51.100.1", "198.51.100.1", 6443, false),
            ("198.51.100.0/24", "::ffff:198.51.100.1", 6443, false),
            // A loopback server is never proxied, whatever the list says.
            ("", "127.0.0.1", 6443, false),
            ("", "LocalHost", 6443, false),
            ("", "::ffff:127.0.0.1", 6443, false),
            ("", "198.51.100.1", 6443, true),
        ];
        for (no_proxy, host, port, want) in cases {
            assert_eq!(
                use_proxy(no_proxy, host, port),
                want,
                "{host}:{port} with {no_proxy:?}"
            );
        }
    }
}
