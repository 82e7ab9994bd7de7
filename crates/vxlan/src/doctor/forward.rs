//! The base chains on the IPv4 forward hook whose policy is drop, and what their rules accept,
//! read from nf_tables over netlink (dumps of chains and rules: what `nft list` prints), so
//! doctor needs no `nft` binary and writes nothing. iptables-nft (the default iptables of current distributions, and what
//! Docker's `FORWARD` policy DROP lands in) keeps its chains there too; iptables-legacy's own
//! tables are not read.

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::decide::DropChain;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("nf_tables netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("nf_tables refused the chain dump: errno {0}")]
    Refused(i32),
}

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NF_ACCEPT: u32 = 1;
const NF_INET_FORWARD: u32 = 2;
const NF_DROP: u32 = 0;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;

/// Every base chain of family `ip` or `inet` on the forward hook with policy drop, with what
/// its rules accept.
pub fn drop_chains() -> Result<Vec<DropChain>, Error> {
    let mut chains = Vec::new();
    dump(&request(NFT_MSG_GETCHAIN, 0, &[]), |body| {
        chains.extend(drop_chain(body));
    })?;
    for c in &mut chains {
        let family = if c.family == "inet" {
            NFPROTO_INET
        } else {
            NFPROTO_IPV4
        };
        let mut filter = attr(NFTA_RULE_TABLE, format!("{}\0", c.table).as_bytes());
        filter.extend(attr(NFTA_RULE_CHAIN, format!("{}\0", c.chain).as_bytes()));
        dump(&request(NFT_MSG_GETRULE, family, &filter), |body| {
            c.accepted.extend(accepted_values(body));
        })?;
    }
    Ok(chains)
}

/// Sends a dump request and hands every message body of the answer to `each`.
fn dump(request: &[u8], mut each: impl FnMut(&[u8])) -> Result<(), Error> {
    let mut sock = Socket::new(NETLINK_NETFILTER).map_err(Error::Socket)?;
    sock.bind_auto().map_err(Error::Socket)?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(Error::Socket)?;
    sock.send(request, 0).map_err(Error::Socket)?;
    loop {
        let (datagram, _) = sock.recv_from_full().map_err(Error::Socket)?;
        if messages(&datagram, &mut each)? {
            return Ok(());
        }
    }
}

/// A dump request of `kind` for `family` (0: every family), with filtering attributes.
fn request(kind: u16, family: u8, attrs: &[u8]) -> Vec<u8> {
    let len = 20 + attrs.len() as u32;
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, 0, 0, 0]); // NFNETLINK_V0, res_id 0
    m.extend_from_slice(attrs);
    m
}

/// A netlink attribute, padded.
fn attr(t: u16, v: &[u8]) -> Vec<u8> {
    let mut a = ((4 + v.len()) as u16).to_ne_bytes().to_vec();
    a.extend_from_slice(&t.to_ne_bytes());
    a.extend_from_slice(v);
    a.resize(align(a.len()), 0);
    a
}

/// The values a rule compares packets with (`cmp` data: an address, an interface name), when
/// the rule accepts; none for a rule that does not.
fn accepted_values(body: &[u8]) -> Vec<Vec<u8>> {
    let Some(rule) = body.get(4..) else {
        return Vec::new();
    };
    let attrs = attributes(rule);
    let Some((_, list)) = attrs.iter().find(|(k, _)| *k == NFTA_RULE_EXPRESSIONS) else {
        return Vec::new();
    };
    let mut values = Vec::new();
    let mut accepts = false;
    for (_, elem) in attributes(list) {
        let e = attributes(elem);
        let name = e
            .iter()
            .find(|(k, _)| *k == NFTA_EXPR_NAME)
            .map(|(_, v)| text(v));
        let Some((_, data)) = e.iter().find(|(k, _)| *k == NFTA_EXPR_DATA) else {
            continue;
        };
        let data = attributes(data);
        let nested = |outer: u16, inner: u16| {
            let (_, o) = data.iter().find(|(k, _)| *k == outer)?;
            attributes(o)
                .into_iter()
                .find(|(k, _)| *k == inner)
                .map(|(_, v)| v)
        };
        match name.as_deref() {
            Some("cmp") => {
                values.extend(nested(NFTA_CMP_DATA, NFTA_DATA_VALUE).map(<[u8]>::to_vec))
            }
            Some("immediate") => {
                let code = nested(NFTA_IMMEDIATE_DATA, NFTA_DATA_VERDICT)
                    .and_then(|v| {
                        attributes(v)
                            .into_iter()
                            .find(|(k, _)| *k == NFTA_VERDICT_CODE)
                    })
                    .and_then(|(_, c)| be32(c));
                accepts |= code == Some(NF_ACCEPT);
            }
            _ => {}
        }
    }
    if accepts { values } else { Vec::new() }
}

/// Hands each message body of one datagram to `each`; `true` once the dump is done.
fn messages(datagram: &[u8], each: &mut impl FnMut(&[u8])) -> Result<bool, Error> {
    let mut rest = datagram;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if len < 16 || len > rest.len() {
            return Ok(true);
        }
        let body = &rest[16..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = body
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                return match errno {
                    0 => Ok(true),
                    e => Err(Error::Refused(-e)),
                };
            }
            _ => each(body),
        }
        rest = &rest[align(len).min(rest.len())..];
    }
    Ok(false)
}

/// The chain a `NFT_MSG_NEWCHAIN` body describes, if it is an IPv4 forward-hook chain with
/// policy drop.
fn drop_chain(body: &[u8]) -> Option<DropChain> {
    let family = match *body.first()? {
        NFPROTO_INET => "inet",
        NFPROTO_IPV4 => "ip",
        _ => return None,
    };
    let attrs = attributes(body.get(4..)?);
    let get = |t: u16| attrs.iter().find(|(k, _)| *k == t).map(|(_, v)| *v);
    let hook = attributes(get(NFTA_CHAIN_HOOK)?);
    let hooknum = hook.iter().find(|(k, _)| *k == NFTA_HOOK_HOOKNUM)?.1;
    if be32(hooknum)? != NF_INET_FORWARD || be32(get(NFTA_CHAIN_POLICY)?)? != NF_DROP {
        return None;
    }
    Some(DropChain {
        family: family.into(),
        table: text(get(NFTA_CHAIN_TABLE)?),
        chain: text(get(NFTA_CHAIN_NAME)?),
        accepted: Vec::new(),
    })
}

/// `(type, value)` of each netlink attribute (the nested flag masked off).
fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        if len < 4 || len > data.len() {
            break;
        }
        out.push((
            u16::from_ne_bytes([data[2], data[3]]) & 0x3fff,
            &data[4..len],
        ));
        data = &data[align(len).min(data.len())..];
    }
    out
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(family: u8, table: &str, name: &str, hook: u32, policy: u32) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        body.extend(attr(NFTA_CHAIN_TABLE, format!("{table}\0").as_bytes()));
        body.extend(attr(NFTA_CHAIN_NAME, format!("{name}\0").as_bytes()));
        let hook = attr(NFTA_HOOK_HOOKNUM, &hook.to_be_bytes());
        body.extend(attr(NFTA_CHAIN_HOOK | 0x8000, &hook));
        body.extend(attr(NFTA_CHAIN_POLICY, &policy.to_be_bytes()));
        message(0x0a03, &body)
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn only_ipv4_forward_chains_that_drop_are_kept() {
        let mut datagram = chain(NFPROTO_INET, "fw", "forward", 2, NF_DROP);
        datagram.extend(chain(NFPROTO_IPV4, "filter", "FORWARD", 2, 1));
        datagram.extend(chain(NFPROTO_IPV4, "filter", "INPUT", 1, NF_DROP));
        datagram.extend(chain(10, "filter6", "forward", 2, NF_DROP));
        datagram.extend(chain(NFPROTO_IPV4, "docker", "FORWARD", 2, NF_DROP));
        let mut found = Vec::new();
        let mut each = |b: &[u8]| found.extend(drop_chain(b));
        assert!(!messages(&datagram, &mut each).unwrap(), "no DONE yet");
        let names: Vec<String> = found
            .iter()
            .map(|c| format!("{} {} {}", c.family, c.table, c.chain))
            .collect();
        assert_eq!(names, ["inet fw forward", "ip docker FORWARD"]);
        let mut ignore = |_: &[u8]| {};
        assert!(messages(&message(NLMSG_DONE, &[0; 4]), &mut ignore).unwrap());
        let refused = message(NLMSG_ERROR, &(-1i32).to_ne_bytes());
        assert!(matches!(
            messages(&refused, &mut ignore),
            Err(Error::Refused(1))
        ));
    }

    fn expr(name: &str, data: Vec<u8>) -> Vec<u8> {
        let mut e = attr(NFTA_EXPR_NAME, format!("{name}\0").as_bytes());
        e.extend(attr(NFTA_EXPR_DATA, &data));
        attr(1, &e)
    }

    fn rule(exprs: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![NFPROTO_INET, 0, 0, 0];
        body.extend(attr(NFTA_RULE_EXPRESSIONS, &exprs.concat()));
        body
    }

    #[test]
    fn an_accepting_rules_compared_values_are_kept() {
        let cmp = expr(
            "cmp",
            attr(NFTA_CMP_DATA, &attr(NFTA_DATA_VALUE, &[10, 244, 0, 0])),
        );
        let verdict = |code: u32| {
            let v = attr(
                NFTA_DATA_VERDICT,
                &attr(NFTA_VERDICT_CODE, &code.to_be_bytes()),
            );
            expr("immediate", attr(NFTA_IMMEDIATE_DATA, &v))
        };
        assert_eq!(
            accepted_values(&rule(&[cmp.clone(), verdict(NF_ACCEPT)])),
            [vec![10, 244, 0, 0]]
        );
        assert!(accepted_values(&rule(&[cmp, verdict(NF_DROP)])).is_empty());
    }
}
