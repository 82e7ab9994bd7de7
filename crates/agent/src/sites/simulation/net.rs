//! The simulated network: hosts on site LANs, sites behind NAT routers (an
//! endpoint-independent mapping with address-and-port-dependent filtering, the "cone" most
//! home and shop routers are, or a mapping per destination, the "symmetric" carrier-grade NAT
//! that defeats punching), loss drawn from the seed, links cut, routers rebooted or given a
//! new public address. Datagrams only: `send` says who receives one and from which address
//! it appears to come.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How a router maps its LAN's flows to its public address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nat {
    /// One public port per LAN address and port, whatever the destination; inbound only from
    /// where that flow has sent to.
    Cone,
    /// A new public port per destination (punching cannot work through it).
    Symmetric,
}

/// A site's NAT router.
#[derive(Debug, Clone)]
pub struct Router {
    pub public: IpAddr,
    pub nat: Nat,
    pub up: bool,
    /// (LAN address, destination for a symmetric NAT) → public port.
    out: BTreeMap<(SocketAddr, Option<SocketAddr>), u16>,
    /// Public port → the LAN address and the destinations it sent to.
    into: BTreeMap<u16, (SocketAddr, BTreeSet<SocketAddr>)>,
    /// Where fresh public ports start (changes at every reboot: new mappings, new ports).
    base: u16,
}

impl Router {
    pub fn new(public: IpAddr, nat: Nat) -> Router {
        Router {
            public,
            nat,
            up: true,
            out: BTreeMap::new(),
            into: BTreeMap::new(),
            base: 40000,
        }
    }

    /// Every mapping is gone (a reboot, a new public address); new ones get new ports.
    pub fn forget(&mut self) {
        self.out.clear();
        self.into.clear();
        self.base = self.base.wrapping_add(1000).max(20000);
    }

    /// The public address `from` appears as when it sends to `to` (a mapping made or kept).
    fn map_out(&mut self, from: SocketAddr, to: SocketAddr) -> SocketAddr {
        let key = (from, (self.nat == Nat::Symmetric).then_some(to));
        let port = match self.out.get(&key) {
            Some(p) => *p,
            None => {
                let mut port = self.base;
                while self.into.contains_key(&port) {
                    port = port.wrapping_add(1).max(1024);
                }
                self.out.insert(key, port);
                self.into.insert(port, (from, BTreeSet::new()));
                port
            }
        };
        if let Some((_, sent_to)) = self.into.get_mut(&port) {
            sent_to.insert(to);
        }
        SocketAddr::new(self.public, port)
    }

    /// The LAN address a datagram from `src` to public `port` goes to, if the filter lets it.
    fn map_in(&self, port: u16, src: SocketAddr) -> Option<SocketAddr> {
        let (lan, sent_to) = self.into.get(&port)?;
        sent_to.contains(&src).then_some(*lan)
    }
}

/// A host: a node's underlay address on its site's LAN.
#[derive(Debug, Clone)]
pub struct Host {
    pub node: String,
    pub site: String,
    /// Its link is up.
    pub up: bool,
}

/// See the module doc.
#[derive(Debug, Clone, Default)]
pub struct Net {
    pub hosts: BTreeMap<IpAddr, Host>,
    /// By site; a site without a router is on the internet (its hosts are public).
    pub routers: BTreeMap<String, Router>,
    /// The chance that any one datagram is lost.
    pub loss: f64,
    /// Pairs of nodes that cannot reach each other (a fault between two hosts of a LAN).
    blocked: BTreeSet<(String, String)>,
}

impl Net {
    /// Blocks (or unblocks) everything between nodes `a` and `b`.
    pub fn block(&mut self, a: &str, b: &str, blocked: bool) {
        for pair in [
            (a.to_string(), b.to_string()),
            (b.to_string(), a.to_string()),
        ] {
            if blocked {
                self.blocked.insert(pair);
            } else {
                self.blocked.remove(&pair);
            }
        }
    }

    /// Sends a datagram from `from` (a host's address and port) to `to`: the node that
    /// receives it and the address it appears to come from, or None (lost, filtered, down).
    pub fn send(
        &mut self,
        rng: &mut ChaCha8Rng,
        from: SocketAddr,
        to: SocketAddr,
    ) -> Option<(String, SocketAddr)> {
        let sender = self.hosts.get(&from.ip()).filter(|h| h.up)?.clone();
        if self.loss > 0.0 && rng.random_bool(self.loss) {
            return None;
        }
        if let Some(h) = self.hosts.get(&to.ip())
            && h.site == sender.site
        {
            let pair = (sender.node.clone(), h.node.clone());
            return (h.up && !self.blocked.contains(&pair)).then(|| (h.node.clone(), from));
        }
        let src = match self.routers.get_mut(&sender.site) {
            None => from,
            Some(r) if r.up => r.map_out(from, to),
            Some(_) => return None,
        };
        if let Some(h) = self.hosts.get(&to.ip()) {
            let public = !self.routers.contains_key(&h.site);
            return (public && h.up).then(|| (h.node.clone(), src));
        }
        let router = self
            .routers
            .values()
            .find(|r| r.up && r.public == to.ip())?;
        let lan = router.map_in(to.port(), src)?;
        let h = self.hosts.get(&lan.ip()).filter(|h| h.up)?;
        Some((h.node.clone(), src))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn net(nat: Nat) -> Net {
        let mut n = Net::default();
        for (ip, node, site) in [
            ("198.51.100.1", "c1", "cloud"),
            ("192.0.2.1", "a1", "edge-a"),
            ("192.0.2.129", "b1", "edge-b"),
        ] {
            let h = Host {
                node: node.into(),
                site: site.into(),
                up: true,
            };
            n.hosts.insert(ip.parse().unwrap(), h);
        }
        let a = Router::new("203.0.113.1".parse().unwrap(), Nat::Cone);
        n.routers.insert("edge-a".into(), a);
        let b = Router::new("203.0.113.2".parse().unwrap(), nat);
        n.routers.insert("edge-b".into(), b);
        n
    }

    #[test]
    fn cone_nats_punch_and_a_symmetric_one_does_not() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (a1, b1, c1) = (
            addr("192.0.2.1:51820"),
            addr("192.0.2.129:51820"),
            addr("198.51.100.1:51820"),
        );
        for (nat, punches) in [(Nat::Cone, true), (Nat::Symmetric, false)] {
            let mut n = net(nat);
            let (_, a_seen) = n.send(&mut rng, a1, c1).unwrap();
            let (_, b_seen) = n.send(&mut rng, b1, c1).unwrap();
            assert_eq!(a_seen, addr("203.0.113.1:40000"));
            // Nobody answers what it never sent to.
            assert_eq!(n.send(&mut rng, c1, addr("203.0.113.1:51821")), None);
            // A's first datagram opens A's filter for B's mapping; B's then passes.
            assert_eq!(n.send(&mut rng, a1, b_seen), None);
            let got = n.send(&mut rng, b1, a_seen);
            assert_eq!(got.is_some(), punches, "{nat:?}");
        }
    }

    #[test]
    fn a_reboot_forgets_every_mapping() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut n = net(Nat::Cone);
        let (a1, c1) = (addr("192.0.2.1:51820"), addr("198.51.100.1:51820"));
        let (_, seen) = n.send(&mut rng, a1, c1).unwrap();
        assert_eq!(n.send(&mut rng, c1, seen).unwrap().0, "a1");
        n.routers.get_mut("edge-a").unwrap().forget();
        assert_eq!(n.send(&mut rng, c1, seen), None);
    }
}
