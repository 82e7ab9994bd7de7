//! What sticky-vxlan sends its IPAM plugin: the call's stdin as received, or, when
//! [`Config::ranges_from_peers`] says nothing names a range, the same config with this node's
//! own subnets from the peer list filled in as `ipam.ranges` (one range set per subnet). One
//! conflist and one peers file then serve every node of a cluster. Running the plugin is
//! [`cni_protocol::delegate`]'s job; [`Runner`] says how.
//!
//! sticky-ipam is compiled into this binary, so for `ipam.type` `sticky-ipam` it runs in this
//! process ([`Linked`]) instead of being exec'd: the same code as `/opt/cni/bin/sticky-ipam`
//! (one package ships both), the same data dir and lock, the same stdin and environment, the
//! same answer; one exec less per call (about 0.8 ms of a 6 ms ADD). It must still be on
//! `CNI_PATH`, as for an exec, so a node without it fails the same way. Every other type is
//! exec'd from `CNI_PATH`.

use ipnet::IpNet;
use serde_json::{Value, json};

use cni_protocol::Call;
use cni_protocol::delegate::{
    self, Answer, Child, Exec, Linked, LinkedRun, Pending, Process, Running,
};
use sticky_ipam::plugin::IpamPlugin;
use sticky_overlay::Error;
use sticky_overlay::config::Config;

/// How an IPAM plugin runs: sticky-ipam in this process, anything else exec'd.
pub(crate) enum Runner {
    Exec(Process),
    Linked(Linked<IpamPlugin>),
}

/// An IPAM call under way, either way.
pub enum Run {
    Exec(Child),
    Linked(LinkedRun),
}

impl Runner {
    /// The runner for `ipam.type` `plugin_type`.
    pub(crate) fn for_type(plugin_type: &str) -> Runner {
        match plugin_type {
            "sticky-ipam" => Runner::Linked(Linked(IpamPlugin)),
            _ => Runner::Exec(Process),
        }
    }
}

impl Exec for Runner {
    type Running = Run;

    fn start(
        &self,
        plugin: &std::path::Path,
        command: &str,
        stdin: &[u8],
    ) -> Result<Run, delegate::Error> {
        match self {
            Runner::Exec(p) => p.start(plugin, command, stdin).map(Run::Exec),
            Runner::Linked(l) => l.start(plugin, command, stdin).map(Run::Linked),
        }
    }
}

impl Running for Run {
    fn finish(self) -> Result<Answer, delegate::Error> {
        match self {
            Run::Exec(c) => c.finish(),
            Run::Linked(l) => l.finish(),
        }
    }
}

/// The range a release-only DEL hands host-local (see [`Ipam::for_release`]): TEST-NET-1
/// (RFC 5737), which no node serves, so nothing can ever be allocated from it by mistake.
pub(crate) const RELEASE_ONLY_RANGE: IpNet = IpNet::V4(ipnet::Ipv4Net::new_assert(
    std::net::Ipv4Addr::new(192, 0, 2, 0),
    24,
));

/// How the IPAM plugin is run for this call: which plugin, with which stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipam {
    pub plugin_type: String,
    pub stdin: Vec<u8>,
}

impl Ipam {
    /// The call's stdin as received.
    pub(crate) fn verbatim(call: &Call, plugin_type: &str) -> Ipam {
        Ipam {
            plugin_type: plugin_type.to_string(),
            stdin: call.stdin.clone(),
        }
    }

    /// The call's stdin with `ipam.ranges` set to one range set per subnet of `local`.
    pub(crate) fn with_ranges(call: &Call, plugin_type: &str, local: &[IpNet]) -> Ipam {
        let mut conf = call.conf.raw.clone();
        let sets: Vec<Value> = local
            .iter()
            .map(|net| json!([{ "subnet": net.trunc().to_string() }]))
            .collect();
        conf["ipam"]["ranges"] = Value::Array(sets);
        Ipam {
            plugin_type: plugin_type.to_string(),
            stdin: conf.to_string().into_bytes(),
        }
    }

    /// `verbatim`, or `with_ranges` from `local()` when the config wants them.
    pub(crate) fn for_call(
        call: &Call,
        cfg: &Config,
        local: impl FnOnce() -> Result<Vec<IpNet>, Error>,
    ) -> Result<Ipam, Error> {
        if cfg.ranges_from_peers {
            Ok(Ipam::with_ranges(call, &cfg.ipam_type, &local()?))
        } else {
            Ok(Ipam::verbatim(call, &cfg.ipam_type))
        }
    }

    /// For a DEL on a node that can no longer work out its own subnets (its peer entry gone,
    /// no `prevResult`): what lets the plugin release anyway. host-local refuses a config
    /// without ranges even for DEL, but its DEL releases by container id and ifname in the
    /// network's data dir whatever ranges it is given, so it gets [`RELEASE_ONLY_RANGE`], which
    /// it only parses. sticky-ipam releases without ranges, and any other plugin named its own
    /// ranges, so they get the call as it is.
    pub fn for_release(call: &Call, cfg: &Config) -> Ipam {
        if cfg.ranges_from_peers && cfg.ipam_type == "host-local" {
            Ipam::with_ranges(call, &cfg.ipam_type, &[RELEASE_ONLY_RANGE])
        } else {
            Ipam::verbatim(call, &cfg.ipam_type)
        }
    }

    /// How this plugin runs ([`Runner::for_type`]).
    pub fn runner(&self) -> Runner {
        Runner::for_type(&self.plugin_type)
    }

    /// Starts the plugin for `command`.
    pub fn start<E: Exec>(
        &self,
        exec: &E,
        call: &Call,
        command: &str,
    ) -> Result<Pending<E::Running>, Error> {
        Ok(delegate::start(
            exec,
            call,
            &self.plugin_type,
            command,
            &self.stdin,
        )?)
    }

    /// Runs the plugin for `command` and waits for its answer.
    pub fn run<E: Exec>(
        &self,
        exec: &E,
        call: &Call,
        command: &str,
    ) -> Result<Option<Value>, Error> {
        Ok(self.start(exec, call, command)?.wait()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::{Env, NetConf};

    fn call(ipam: Value) -> (Call, Config) {
        let doc = json!({"cniVersion": "1.0.0", "name": "n", "type": "sticky-vxlan", "vni": 1, "ipam": ipam});
        let stdin = doc.to_string().into_bytes();
        let env = Env::from_vars(|k| (k == "CNI_COMMAND").then(|| "STATUS".to_string())).unwrap();
        let conf = NetConf::parse(&stdin).unwrap();
        let cfg = Config::from_json("n", &conf.raw).unwrap();
        (Call { env, conf, stdin }, cfg)
    }

    #[test]
    fn local_subnets_become_one_range_set_each_and_the_rest_is_kept() {
        let (c, cfg) = call(json!({"type": "sticky-ipam", "dataDir": "/d"}));
        let nets: Vec<IpNet> = vec![
            "10.244.1.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ];
        let ipam = Ipam::for_call(&c, &cfg, || Ok(nets)).unwrap();
        let sent: Value = serde_json::from_slice(&ipam.stdin).unwrap();
        assert_eq!(
            sent["ipam"],
            json!({"type": "sticky-ipam", "dataDir": "/d",
                   "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:1::/64"}]]})
        );
        assert_eq!(sent["vni"], 1);
        let (verbatim, cfg) = call(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"}));
        let ipam = Ipam::for_call(&verbatim, &cfg, || panic!("not asked")).unwrap();
        assert_eq!(
            ipam.stdin, verbatim.stdin,
            "a config with ranges is passed on byte for byte"
        );
    }

    #[test]
    fn a_release_only_del_gives_host_local_a_range_and_sticky_ipam_the_call_as_it_is() {
        let (c, cfg) = call(json!({"type": "host-local", "dataDir": "/d"}));
        let sent: Value = serde_json::from_slice(&Ipam::for_release(&c, &cfg).stdin).unwrap();
        assert_eq!(
            sent["ipam"]["ranges"],
            json!([[{"subnet": "192.0.2.0/24"}]])
        );
        let (c, cfg) = call(json!({"type": "sticky-ipam", "dataDir": "/d"}));
        assert_eq!(Ipam::for_release(&c, &cfg).stdin, c.stdin);
        let (c, cfg) = call(json!({"type": "host-local", "subnet": "10.0.0.0/24"}));
        assert_eq!(Ipam::for_release(&c, &cfg).stdin, c.stdin);
    }
}
