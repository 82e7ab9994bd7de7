//! The operator's entry points (run without `CNI_COMMAND`): `mac`, `reconcile`, `show`.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

use serde_json::Value;

use super::config::Config;
use super::mac::vtep_mac;
use super::{Error, ROUTE_PROTOCOL, pod};
use crate::netlink::link::format_mac;
use crate::netlink::{Socket, addr, link, neigh, route};

pub const HELP: &str = "\
sticky-vxlan: CNI plugin for a VXLAN overlay whose VTEP MAC never changes.

Run by a container runtime with CNI_COMMAND set, it is a CNI plugin (ADD, DEL, CHECK, GC,
STATUS, VERSION). Run by hand:

  sticky-vxlan mac --local <underlay IPv4> --vni <n>
      print the kept VTEP MAC of a node (to annotate flannel nodes, or to check a peer)
  sticky-vxlan reconcile --config <file.conflist|file.conf>
      create/repair the VTEP and bridge and program the peers, without a pod
      (for a boot-time unit, before kubelet starts)
  sticky-vxlan show [--state-dir /run/sticky-vxlan]
      print every VXLAN device of this namespace, its MAC, the programmed peers,
      the pods attached by sticky-vxlan, and where the agent got the peers from
  sticky-vxlan agent --config <file.conflist> ...   (see sticky-vxlan agent --help)
      keep the peers file current from the Kubernetes API and reconcile on every change
  sticky-vxlan --help | --version
";

/// Runs one operator command and returns what to print.
pub fn run(args: &[String]) -> Result<String, Error> {
    let usage = |msg: &str| Error::Usage(format!("{msg}\n\n{HELP}"));
    match args.first().map(String::as_str) {
        None | Some("--help" | "-h" | "help") => Ok(HELP.to_string()),
        Some("--version" | "-V") => Ok(format!("sticky-vxlan {}\n", env!("CARGO_PKG_VERSION"))),
        Some("mac") => {
            let local: Ipv4Addr = flag(args, "--local")
                .ok_or_else(|| usage("mac needs --local <underlay IPv4>"))?
                .parse()
                .map_err(|_| {
                    usage("--local must be an IPv4 address (IPv6 underlays are not supported)")
                })?;
            let vni: u32 = flag(args, "--vni")
                .ok_or_else(|| usage("mac needs --vni <n>"))?
                .parse()
                .ok()
                .filter(|v| (1..=super::config::MAX_VNI).contains(v))
                .ok_or_else(|| usage("--vni must be an integer from 1 to 16777215"))?;
            Ok(format!("{}\n", format_mac(&vtep_mac(local, vni))))
        }
        Some("reconcile") => {
            let path =
                flag(args, "--config").ok_or_else(|| usage("reconcile needs --config <file>"))?;
            let cfg = load(Path::new(path))?;
            let report = super::reconcile::node(&cfg)?;
            let (node, vtep, bridge) = (&report.node, &report.vtep, &report.bridge);
            let mut out = format!(
                "{} up with MAC {} (local {}, vni {}, port {}), bridge {}, {} remote peer(s)\n",
                vtep.name,
                format_mac(&vtep_mac(node.local_ip, cfg.vni)),
                node.local_ip,
                cfg.vni,
                cfg.port,
                bridge.name,
                node.remote.len()
            );
            if let Some(e) = report.peers_file_error() {
                let _ = writeln!(out, "warning: {e}; programmed peers were left as they are");
            }
            Ok(out)
        }
        Some("show") => show(Path::new(
            flag(args, "--state-dir").unwrap_or(super::config::DEFAULT_STATE_DIR),
        )),
        Some(other) => Err(usage(&format!("unknown command {other:?}"))),
    }
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Reads a `.conf` (one plugin) or `.conflist` (the `sticky-vxlan` entry of its `plugins`).
pub fn load(path: &Path) -> Result<Config, Error> {
    let bad = |reason: String| Error::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    let doc: Value = serde_json::from_slice(&text).map_err(|e| bad(format!("is not JSON: {e}")))?;
    let name = doc
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("has no network \"name\"".into()))?;
    let conf = match doc.get("plugins").and_then(Value::as_array) {
        None => doc.clone(),
        Some(list) => {
            let mut found = list
                .iter()
                .find(|p| p.get("type").and_then(Value::as_str) == Some("sticky-vxlan"))
                .cloned()
                .ok_or_else(|| bad("has no plugin of type sticky-vxlan in \"plugins\"".into()))?;
            if let Some(obj) = found.as_object_mut() {
                obj.insert("name".into(), Value::String(name.to_string()));
            }
            found
        }
    };
    Config::from_json(name, &conf).map_err(Error::from)
}

/// Every VXLAN device with its MAC (and whether it is the kept one) and the peers on it.
fn show(state_dir: &Path) -> Result<String, Error> {
    let mut sock = Socket::open()?;
    let links = link::list(&mut sock)?;
    let mut out = String::new();
    let name_of = |i: Option<u32>| {
        links
            .iter()
            .find(|l| Some(l.index) == i)
            .map(|l| l.name.clone())
            .unwrap_or_else(|| "-".into())
    };
    let routes = route::list(&mut sock)?;
    for vtep in links.iter().filter(|l| l.vxlan.is_some()) {
        let Some(v) = &vtep.vxlan else { continue };
        let mac = vtep
            .mac
            .map(|m| format_mac(&m))
            .unwrap_or_else(|| "-".into());
        let kept = match (v.local, v.vni) {
            (Some(local), Some(vni)) if vtep.mac == Some(vtep_mac(local, vni)) => {
                "kept MAC".to_string()
            }
            (Some(local), Some(vni)) => {
                format!("NOT the kept MAC {}", format_mac(&vtep_mac(local, vni)))
            }
            _ => "no local address: MAC cannot be checked".into(),
        };
        let _ = writeln!(
            out,
            "{} vni {} port {} local {} dev {} mtu {} {} mac {mac} ({kept})",
            vtep.name,
            v.vni.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            v.port.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            v.local.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            name_of(v.underlay),
            vtep.mtu.unwrap_or(0),
            if vtep.up { "up" } else { "DOWN" },
        );
        for a in addr::list(&mut sock, vtep.index)? {
            let _ = writeln!(out, "  own address {a}");
        }
        let neighbours = neigh::list(&mut sock, vtep.index)?;
        for f in neigh::list_fdb(&mut sock, vtep.index)? {
            let subnets: Vec<String> = routes
                .iter()
                .filter(|r| r.oif == Some(vtep.index) && r.protocol == ROUTE_PROTOCOL)
                .filter(|r| {
                    r.gateway
                        .is_some_and(|gw| neighbours.iter().any(|n| n.ip == gw && n.mac == f.mac))
                })
                .map(|r| r.dst.to_string())
                .collect();
            let _ = writeln!(
                out,
                "  peer {} mac {}{} subnets {}",
                f.dst,
                format_mac(&f.mac),
                if f.permanent { "" } else { " (not permanent)" },
                if subnets.is_empty() {
                    "NONE (no route/neighbour)".into()
                } else {
                    subnets.join(" ")
                }
            );
        }
    }
    if out.is_empty() {
        out.push_str("no VXLAN device in this network namespace\n");
    }
    out.push_str(&crate::segment::show::segments(&mut sock, &links)?);
    out.push_str(&crate::agent::state::describe(state_dir));
    for l in &links {
        if let Some((network, cid, ifname)) = l.alias.as_deref().and_then(pod::parse_alias) {
            let _ = writeln!(
                out,
                "pod {cid} {ifname} network {network} host {} on {}",
                l.name,
                name_of(l.master)
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn mac_help_version_and_usage_errors() {
        assert_eq!(
            run(&args(&["mac", "--local", "192.0.2.1", "--vni", "1"])).unwrap(),
            "0a:01:c0:00:02:01\n"
        );
        assert!(
            run(&args(&["--help"]))
                .unwrap()
                .contains("reconcile --config")
        );
        assert!(
            run(&args(&["--version"]))
                .unwrap()
                .starts_with("sticky-vxlan ")
        );
        for bad in [
            &["mac", "--local", "2001:db8::1", "--vni", "1"][..],
            &["mac", "--local", "192.0.2.1", "--vni", "0"],
            &["mac", "--vni", "1"],
            &["reconcile"],
            &["frobnicate"],
        ] {
            assert!(matches!(run(&args(bad)), Err(Error::Usage(_))), "{bad:?}");
        }
    }

    #[test]
    fn load_reads_conf_and_conflist() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("10-edge.conflist");
        std::fs::write(
            &list,
            r#"{"cniVersion":"1.0.0","name":"edge","plugins":[
                {"type":"sticky-vxlan","vni":7,"ipam":{"type":"sticky-ipam"}},
                {"type":"portmap"}]}"#,
        )
        .unwrap();
        let c = load(&list).unwrap();
        assert_eq!((c.name.as_str(), c.vni), ("edge", 7));
        let conf = dir.path().join("10-edge.conf");
        std::fs::write(
            &conf,
            r#"{"cniVersion":"1.0.0","name":"one","type":"sticky-vxlan","vni":2,"ipam":{"type":"x"}}"#,
        )
        .unwrap();
        assert_eq!(load(&conf).unwrap().vni, 2);
        std::fs::write(&conf, r#"{"name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert!(matches!(load(&conf), Err(Error::ConfigFile { .. })));
    }
}
