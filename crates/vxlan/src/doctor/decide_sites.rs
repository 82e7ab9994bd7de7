//! The sites part of the decision (docs/sites.md): what the agent's status file says of each
//! remote site (its path, and on the active gateway the tunnel that carries it), what the
//! sites cache says of the NAT mappings, and what the probes through the tunnel found become
//! at most one finding per remote site. Pure, like the rest of [`super`].
//!
//! The order is the order of harm: a site with no path at all (`site-unreachable`), a tunnel
//! the status shows down or that carries nothing now (`relay-unreachable` when the leg to the
//! relay is the broken one, else `tunnel-down`), a tunnel that carries small packets but not
//! full-size ones (`wan-mtu`), and last a punch that keeps failing while the relay carries the
//! traffic (`punch-failing`: nothing is broken, the traffic takes the longer way).

use std::net::{Ipv4Addr, SocketAddr};

use super::{Cause, Finding};

/// What was learnt of the sites from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitesFacts {
    /// This node's site.
    pub site: String,
    /// The status file's role ("active gateway", "member, through gateway G", ...).
    pub role: String,
    /// This node is its site's active gateway: it holds the tunnels and sees their state.
    pub gateway: bool,
    /// The tunnel device (`sites.interface`).
    pub interface: String,
    /// `sites.listenPort`.
    pub listen_port: u16,
    /// `sites.wanMtu`.
    pub wan_mtu: u32,
    /// The tunnel's overhead on the WAN (72 IPv4, 92 IPv6: WireGuard's and a relayed path's
    /// header): the full probe is `wan_mtu` less it.
    pub overhead: u32,
    /// The network's config file, for the fixes that change it.
    pub config: String,
    pub remotes: Vec<RemoteFacts>,
}

/// One remote site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFacts {
    pub site: String,
    /// Its active gateway, as the status names it.
    pub gateway: Option<String>,
    /// The status's path text: "direct", "direct (punched)", "relayed via <site>[ (...)]",
    /// "unreachable: <why>".
    pub path: String,
    /// On the active gateway: the tunnel carrying this site's traffic.
    pub tunnel: Option<TunnelFacts>,
    /// The probes through the tunnel to its gateway; `None` when not probed (no address of it
    /// is known, or the site has no path).
    pub probe: Option<WanProbe>,
    /// The NAT mappings the sites cache holds of this pair's gateways.
    pub nat: Vec<Mapped>,
}

/// The carrying tunnel, as the agent last read it from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelFacts {
    /// The carrier's gateway (the remote site's, or the relay's).
    pub peer: String,
    pub up: bool,
    /// Seconds since its latest handshake; `None`: never.
    pub handshake_age: Option<u64>,
}

/// Echoes through the tunnel to the remote gateway's VTEP address, DF set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WanProbe {
    pub target: Ipv4Addr,
    /// A small echo was answered.
    pub small: bool,
    /// An echo of the size a full pod packet has inside the tunnel (`wanMtu` − overhead).
    pub full: bool,
    /// The largest smaller size answered, when the full one was not.
    pub largest: Option<u32>,
}

/// Where a reachable gateway saw a gateway behind NAT come from (its NAT mapping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub gateway: String,
    pub seen: SocketAddr,
}

/// One finding per remote site at most, in the status's order.
pub fn decide(s: &SitesFacts) -> Vec<Finding> {
    s.remotes.iter().filter_map(|r| remote(s, r)).collect()
}

fn finding(r: &RemoteFacts, cause: Cause, detail: String, fix: String) -> Option<Finding> {
    Some(Finding {
        cause,
        peer: None,
        site: Some(r.site.clone()),
        detail,
        fix,
    })
}

/// The relay site of a path "relayed via <site>[ (...)]".
fn relay_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("relayed via ")?;
    rest.split_whitespace().next()
}

fn remote(s: &SitesFacts, r: &RemoteFacts) -> Option<Finding> {
    if let Some(why) = r.path.strip_prefix("unreachable") {
        return unreachable(r, why.trim_start_matches(':').trim());
    }
    // A direct tunnel still being punched, and no relay carrying the site meanwhile (a relayed
    // path reads "relayed via ..."): until a punch crosses, and through a port-randomising
    // NAT none ever does, nothing reaches the site.
    let dead =
        r.tunnel.as_ref().is_some_and(|t| !t.up) || r.probe.as_ref().is_some_and(|p| !p.small);
    if r.path.starts_with("punch") && dead {
        return unreachable(
            r,
            &format!(
                "a direct tunnel is being punched ({}) and nothing crosses it, and no relay site carries the site meanwhile",
                r.path
            ),
        );
    }
    if let Some(t) = r.tunnel.as_ref().filter(|t| !t.up) {
        return tunnel_down(s, r, t);
    }
    match &r.probe {
        Some(p) if !p.small => nothing_crosses(s, r, p),
        Some(p) if !p.full => wan_mtu(s, r, p),
        _ if r.path.contains("punch paused") => punch_failing(s, r),
        _ => None,
    }
}

fn unreachable(r: &RemoteFacts, why: &str) -> Option<Finding> {
    let site = &r.site;
    finding(
        r,
        Cause::SiteUnreachable,
        format!("no path to site {site}: {why}"),
        "give both sites an active gateway (a node labelled with sites.gatewayLabel=true running sticky-wg and the agent); if both are behind NAT, name a relay site whose gateway has an endpoint in sites.relays (check with: sticky-vxlan show)".into(),
    )
}

fn age(t: &TunnelFacts) -> String {
    match t.handshake_age {
        None => "no handshake ever".into(),
        Some(a) => format!("last handshake {a} s ago"),
    }
}

/// The fix for a tunnel to `gateway` that does not pass.
fn tunnel_fix(s: &SitesFacts, gateway: &str) -> String {
    format!(
        "check that sticky-wg runs on {gateway} and on this site's gateway (systemctl status sticky-wg@{if_}), that UDP {port} reaches {gateway}'s endpoint (its firewall, the router's forwarded port), and wg show {if_} on both",
        if_ = s.interface,
        port = s.listen_port
    )
}

/// The status shows the carrying tunnel down: the relay's leg when relayed, else the direct.
fn tunnel_down(s: &SitesFacts, r: &RemoteFacts, t: &TunnelFacts) -> Option<Finding> {
    if let Some(relay) = relay_of(&r.path) {
        return finding(
            r,
            Cause::RelayUnreachable,
            format!(
                "site {} is relayed via {relay}, and the tunnel to {relay}'s gateway {} is down ({})",
                r.site,
                t.peer,
                age(t)
            ),
            tunnel_fix(s, &t.peer),
        );
    }
    finding(
        r,
        Cause::TunnelDown,
        format!(
            "the tunnel to site {}'s gateway {} is down ({})",
            r.site,
            t.peer,
            age(t)
        ),
        tunnel_fix(s, &t.peer),
    )
}

/// Nothing small crosses to the remote gateway. Relayed: when the relay site's own gateway
/// does not answer either, the relay is the broken part; else the relay's leg to the site is.
fn nothing_crosses(s: &SitesFacts, r: &RemoteFacts, p: &WanProbe) -> Option<Finding> {
    let gateway = r.gateway.as_deref().unwrap_or("its gateway");
    let seen = match &r.tunnel {
        Some(t) => format!(" (the tunnel to {} shows {})", t.peer, age(t)),
        None if s.gateway => String::new(),
        None => format!(
            " (seen from a member: run doctor on this site's active gateway for the tunnel's state; role: {})",
            s.role
        ),
    };
    if let Some(relay) = relay_of(&r.path) {
        let relay_site = s.remotes.iter().find(|o| o.site == relay);
        let relay_dead = relay_site
            .and_then(|o| o.probe.as_ref())
            .is_some_and(|o| !o.small);
        let relay_gateway = relay_site
            .and_then(|o| o.gateway.clone())
            .unwrap_or_else(|| format!("{relay}'s gateway"));
        if relay_dead {
            return finding(
                r,
                Cause::RelayUnreachable,
                format!(
                    "site {} is relayed via {relay}, and nothing crosses the tunnel to {relay}'s gateway either{seen}",
                    r.site
                ),
                tunnel_fix(s, &relay_gateway),
            );
        }
        return finding(
            r,
            Cause::TunnelDown,
            format!(
                "site {} is relayed via {relay}: {relay}'s gateway answers through the tunnel, {gateway} ({}) does not: the tunnel between {relay} and {} is down{seen}",
                r.site, p.target, r.site
            ),
            format!(
                "{}; sticky-vxlan doctor on {relay}'s gateway names it",
                tunnel_fix(s, gateway)
            ),
        );
    }
    finding(
        r,
        Cause::TunnelDown,
        format!(
            "nothing crosses the tunnel to site {}: {gateway} ({}) does not answer through it{seen}",
            r.site, p.target
        ),
        tunnel_fix(s, gateway),
    )
}

fn wan_mtu(s: &SitesFacts, r: &RemoteFacts, p: &WanProbe) -> Option<Finding> {
    let full = sticky_overlay::sites::tunnel_mtu(s.wan_mtu, s.overhead);
    // What the measured path adds: a direct one carries no relay header. `wanMtu` set to the
    // path's MTU leaves room for both (the pod MTU keeps the relay's header free).
    let on_path = if relay_of(&r.path).is_some() {
        s.overhead
    } else {
        s.overhead
            .saturating_sub(sticky_overlay::sites::RELAY_HEADER)
    };
    let (passes, set) = match p.largest {
        Some(m) => (
            format!(", {m} bytes pass (a WAN path MTU of about {})", m + on_path),
            format!("set \"wanMtu\": {}", m + on_path),
        ),
        None => (String::new(), "lower \"wanMtu\"".into()),
    };
    finding(
        r,
        Cause::WanMtu,
        format!(
            "small packets reach site {}'s gateway ({}) through the tunnel, packets of {full} bytes (wanMtu {} less the tunnel's {}, DF) do not{passes}",
            r.site, p.target, s.wan_mtu, s.overhead
        ),
        format!(
            "{set} in the sites object of {} on every node, restart the agents and recreate the pods (they take the lower MTU); or make the WAN path carry {} bytes",
            s.config, s.wan_mtu
        ),
    )
}

/// The NAT kind the mappings tell: a gateway whose mapped port is not its listen port sits
/// behind a NAT that changes ports; with the punch failing, one that maps each destination to
/// a new port (endpoint-dependent, "symmetric") is likely.
fn nat_kind(s: &SitesFacts, r: &RemoteFacts) -> String {
    let changed: Vec<String> = r
        .nat
        .iter()
        .filter(|m| m.seen.port() != s.listen_port)
        .map(|m| {
            format!(
                "{}'s NAT maps UDP {} to {}",
                m.gateway, s.listen_port, m.seen
            )
        })
        .collect();
    if !changed.is_empty() {
        return format!(
            "{}: a port-changing NAT, endpoint-dependent (symmetric) likely",
            changed.join(", ")
        );
    }
    if r.nat.is_empty() {
        return "no NAT mapping is known: endpoint-dependent (symmetric) NAT likely".into();
    }
    let seen: Vec<String> = r
        .nat
        .iter()
        .map(|m| format!("{} as {}", m.gateway, m.seen))
        .collect();
    format!(
        "port-preserving NAT seen ({}): an inbound filter or a router that answers unsolicited UDP likely",
        seen.join(", ")
    )
}

fn punch_failing(s: &SitesFacts, r: &RemoteFacts) -> Option<Finding> {
    let relay = relay_of(&r.path).unwrap_or("the relay");
    finding(
        r,
        Cause::PunchFailing,
        format!(
            "no direct tunnel to site {} could be punched, traffic goes via {relay} ({}); {}",
            r.site,
            r.path,
            nat_kind(s, r)
        ),
        format!(
            "forward a UDP port to one of the two gateways on its router and annotate its Node sticky-cni.io/gateway-endpoint=<public address>:<port> (then the path is direct), or accept the relay ({relay} in sites.relays)"
        ),
    )
}
