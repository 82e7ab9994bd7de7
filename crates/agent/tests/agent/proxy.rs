//! The agent behind a proxy (issue 27, defect 4): it picks its proxy from the environment as
//! client-go does (Go's `httpproxy` rules), so an API server listed in `NO_PROXY` in any of
//! the forms Go reads is reached directly, and one that is not goes through the proxy with
//! the token inside TLS. A CONNECT proxy in the underlay namespace records every request;
//! the test API server records every request that reached it.

use sticky_testkit::agent_support;
use sticky_testkit::kube_support;

use std::path::PathBuf;
use std::time::Duration;

use agent_support::*;
use kube_support::*;

/// A loaded 2-core machine starts an agent and lists in well under this.
const DEADLINE: Duration = Duration::from_secs(90);

/// Node 1's agent's status file says that this process (`pid`) has heard the API.
fn reached_the_api(c: &Cluster, pid: u32) -> bool {
    let net = c.confs[0]["name"].as_str().expect("network name");
    let path = c.topo.state_dir(1).join(format!("{net}.agent.json"));
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    status["pid"] == pid && status["api_reachable"] == true
}

/// Starts node 1's agent with `env` (`{proxy}` replaced by the URL of a proxy made for this
/// agent alone, `{api}` by the API's `host:port`), waits until the agent has heard the API,
/// and returns the requests its proxy received and what went through it. The agent is
/// stopped before this returns.
fn proxied_requests(c: &Cluster, env: &[(&str, &str)]) -> (Vec<String>, Vec<u8>) {
    let ul = PathBuf::from(format!("/run/netns/{}", c.topo.underlay));
    let proxy = ConnectProxy::new(&c.api.addr.ip().to_string(), &ul);
    let api = c.api.addr.to_string();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| {
            let v = v.replace("{proxy}", &proxy.url()).replace("{api}", &api);
            (k.to_string(), v)
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut agent = c.agent_env(1, &[], &env);
    wait_for(
        &format!("the agent with {env:?} to hear the API"),
        DEADLINE,
        || reached_the_api(c, agent.pid()),
    );
    agent.kill();
    (proxy.requests(), proxy.sent())
}

/// Each form of `NO_PROXY` Go reads, and the proxy variables Go does not use for an https
/// server: the API is reached directly. Then a `NO_PROXY` that does not match: through the
/// proxy, only `CONNECT` to the API, and the token never in clear.
fn direct_unless_the_proxy_applies(c: &Cluster, direct: &[&[(&str, &str)]]) {
    c.api.put_node(Cluster::node(1));
    for env in direct {
        let (seen, _) = proxied_requests(c, env);
        assert!(
            seen.is_empty(),
            "with {env:?} the agent went through the proxy: {seen:?}"
        );
    }
    for env in [
        &[("HTTPS_PROXY", "{proxy}")][..],
        // The port is part of the entry: another port does not match.
        &[
            ("https_proxy", "{proxy}"),
            ("NO_PROXY", "example.com, {api}0"),
        ],
        &[("HTTPS_PROXY", "{proxy}"), ("no_proxy", "localhost,  ::1")],
    ] {
        let (seen, sent) = proxied_requests(c, env);
        let api = c.api.addr.to_string();
        assert!(
            !seen.is_empty() && seen.iter().all(|r| *r == format!("CONNECT {api} HTTP/1.1")),
            "with {env:?} the agent must CONNECT to {api} through the proxy, and only that: {seen:?}"
        );
        let sent = String::from_utf8_lossy(&sent).into_owned();
        assert!(!sent.is_empty(), "the proxy carried the agent's requests");
        assert!(
            !sent.contains(&c.api.token),
            "the token went through the proxy in clear"
        );
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn no_proxy_in_every_form_go_reads_sends_the_api_direct_ipv4() {
    let c = Cluster::new();
    direct_unless_the_proxy_applies(
        &c,
        &[
            // A CIDR.
            &[("HTTPS_PROXY", "{proxy}"), ("NO_PROXY", "192.0.2.0/24")],
            // An entry after a space.
            &[
                ("HTTPS_PROXY", "{proxy}"),
                ("NO_PROXY", "localhost, 192.0.2.254"),
            ],
            // host:port, the lower-case names.
            &[
                ("https_proxy", "{proxy}"),
                ("no_proxy", "example.com,{api}"),
            ],
            // `*`.
            &[("HTTPS_PROXY", "{proxy}"), ("NO_PROXY", "*")],
            // Upper case wins: NO_PROXY matches, no_proxy does not.
            &[
                ("HTTPS_PROXY", "{proxy}"),
                ("NO_PROXY", "192.0.2.254"),
                ("no_proxy", "example.com"),
            ],
            // Go uses HTTP_PROXY for http:// servers only and never reads ALL_PROXY.
            &[("HTTP_PROXY", "{proxy}")],
            &[("http_proxy", "{proxy}")],
            &[("ALL_PROXY", "{proxy}")],
            &[("all_proxy", "{proxy}")],
        ],
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn no_proxy_in_every_form_go_reads_sends_the_api_direct_ipv6() {
    let c = Cluster::new_ipv6(|_| serde_json::json!({}));
    direct_unless_the_proxy_applies(
        &c,
        &[
            // Unbracketed, as Go reads it.
            &[("HTTPS_PROXY", "{proxy}"), ("NO_PROXY", "2001:db8::fe")],
            // Bracketed with its port.
            &[("HTTPS_PROXY", "{proxy}"), ("NO_PROXY", "localhost,{api}")],
            // An IPv6 CIDR after a space.
            &[
                ("HTTPS_PROXY", "{proxy}"),
                ("NO_PROXY", "10.96.0.0/12, 2001:db8::/64"),
            ],
            &[("HTTP_PROXY", "{proxy}")],
            &[("ALL_PROXY", "{proxy}")],
        ],
    );
}
