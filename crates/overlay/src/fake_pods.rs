//! The pod side of the recording fake: [`Pods`] for [`Fake`] (a veth's host end joins the
//! fake node's links, its container end is kept per namespace, and every operation is
//! recorded in [`Fake::writes`] in order, failing where [`Fake::fail`] says), a recording
//! IPAM plugin ([`FakeIpam`]) and the calls to run them with: ADD, DEL and their rollbacks
//! are tested without root.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use serde_json::Value;

use super::Error;
use super::fake::{Fake, FakeContainer};
use super::kernel::Kernel;
use super::pods::{Pods, Setup, Veth};
use cni_protocol::delegate::{self, Answer, Exec, Running};
use cni_protocol::{Call, Env, NetConf};
use sticky_netlink::link::{self, Link};

impl Fake {
    /// The container end `ifname` in `netns`, if there is one.
    pub fn container(&self, netns: &str, ifname: &str) -> Option<&FakeContainer> {
        self.containers
            .iter()
            .find(|c| c.netns == Path::new(netns) && c.link.name == ifname)
    }

    fn container_mut(&mut self, index: u32) -> &mut FakeContainer {
        self.containers
            .iter_mut()
            .find(|c| c.link.index == index)
            .expect("fake container end")
    }
}

impl Pods for Fake {
    type Container = Link;

    fn create_veth(&mut self, v: &Veth<'_>) -> Result<Link, Error> {
        self.write(format!(
            "create veth {} on #{} peer {} in {}",
            v.host,
            v.bridge,
            v.ifname,
            v.netns.display()
        ))?;
        let index = self.add_link(v.host, "veth");
        let l = self.link_mut(v.host);
        l.master = Some(v.bridge);
        l.mtu = Some(v.mtu);
        l.up = false;
        let peer = Link {
            index: index + 1000,
            name: v.ifname.to_string(),
            mtu: Some(v.mtu),
            mac: Some(v.mac.unwrap_or([0x02, 0, 0, 0, 0x10, index as u8])),
            kind: Some("veth".into()),
            ..Link::default()
        };
        self.containers.push(FakeContainer {
            netns: v.netns.to_path_buf(),
            host: v.host.to_string(),
            link: peer,
            addresses: Vec::new(),
        });
        if v.ipv6_off {
            self.disable_ipv6(v.host)?;
        }
        let alias = (v.alias.len() < super::pods::MAX_ALIAS).then(|| v.alias.clone());
        self.write(format!("up {} alias {alias:?}", v.host))?;
        let l = self.link_mut(v.host);
        l.up = true;
        l.alias = alias;
        let host = l.clone();
        if v.hairpin {
            self.write(format!("hairpin {}", v.host))?;
        }
        Ok(host)
    }

    fn enter(&mut self, netns: &Path, ifname: &str, arp_notify: bool) -> Result<Link, Error> {
        self.write(format!("enter {} {ifname}", netns.display()))?;
        let found = self
            .container(&netns.to_string_lossy(), ifname)
            .map(|c| c.link.clone())
            .ok_or_else(|| link::Error::NotFound(ifname.to_string()))?;
        if arp_notify {
            self.write(format!("arp_notify {ifname}"))?;
        }
        Ok(found)
    }

    fn configure(&mut self, mut l: Link, s: &Setup<'_>) -> Result<Link, Error> {
        if let Some(mac) = s.mac.filter(|m| l.mac != Some(*m)) {
            self.write(format!("set {} mac {}", l.name, link::format_mac(&mac)))?;
            l.mac = Some(mac);
        }
        for net in s.addresses {
            self.write(format!("add address {net} on {}", l.name))?;
            self.container_mut(l.index).addresses.push(*net);
        }
        if s.up {
            self.write(format!("set {} up", l.name))?;
            l.up = true;
            for r in s.routes {
                let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
                self.write(format!("add route {}{via} on {}", r.dst, l.name))?;
            }
        }
        self.container_mut(l.index).link = l.clone();
        Ok(l)
    }

    fn delete_veth(&mut self, host: &str) -> Result<(), Error> {
        self.delete_link(host)?;
        self.containers.retain(|c| c.host != host);
        Ok(())
    }
}

/// One run: the command and the stdin it was given.
type Run = (String, Vec<u8>);

/// A recording IPAM plugin: ADD answers what it was given, every other command succeeds
/// unless told otherwise. Clones share one record.
#[derive(Clone)]
pub struct FakeIpam {
    /// Each command run, in order, with the stdin it was given.
    record: Rc<RefCell<Vec<Run>>>,
    add: Answer,
    del: Answer,
}

fn answer(success: bool, stdout: &str) -> Answer {
    Answer {
        success,
        status: if success { "exit 0" } else { "exit 1" }.into(),
        stdout: stdout.as_bytes().to_vec(),
    }
}

impl FakeIpam {
    /// ADD hands out `result` (a CNI result).
    pub fn handing_out(result: Value) -> FakeIpam {
        FakeIpam {
            record: Rc::default(),
            add: answer(true, &result.to_string()),
            del: answer(true, ""),
        }
    }

    /// ADD answers with CNI error `code` (nothing allocated).
    pub fn failing(code: u32) -> FakeIpam {
        let error = serde_json::json!({"cniVersion": "1.0.0", "code": code, "msg": "no"});
        FakeIpam {
            add: answer(false, &error.to_string()),
            ..FakeIpam::handing_out(Value::Null)
        }
    }

    /// ADD exits 0 but prints something that is not a result (it may have allocated).
    pub fn printing_garbage() -> FakeIpam {
        FakeIpam {
            add: answer(true, "garbage"),
            ..FakeIpam::handing_out(Value::Null)
        }
    }

    /// DEL fails as well.
    pub fn failing_del(self) -> FakeIpam {
        FakeIpam {
            del: answer(false, r#"{"code": 11, "msg": "try again"}"#),
            ..self
        }
    }

    /// The commands it was run for, in order.
    pub fn commands(&self) -> Vec<String> {
        self.record
            .borrow()
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// The stdin of the first run for `command`, as JSON.
    pub fn stdin_of(&self, command: &str) -> Value {
        let record = self.record.borrow();
        let (_, stdin) = record.iter().find(|(c, _)| c == command).expect("run");
        serde_json::from_slice(stdin).expect("JSON stdin")
    }
}

/// A fake run: the answer is ready at once.
pub struct Answered(Answer);

impl Running for Answered {
    fn finish(self) -> Result<Answer, delegate::Error> {
        Ok(self.0)
    }
}

impl Exec for FakeIpam {
    type Running = Answered;

    fn start(&self, _: &Path, command: &str, stdin: &[u8]) -> Result<Answered, delegate::Error> {
        self.record
            .borrow_mut()
            .push((command.to_string(), stdin.to_vec()));
        Ok(Answered(match command {
            "ADD" => self.add.clone(),
            "DEL" => self.del.clone(),
            _ => answer(true, ""),
        }))
    }
}

/// The pod's namespace in every [`call`].
pub const NETNS: &str = "/run/netns/pod-1";

/// A `command` call for container `c1`, interface `eth0` in [`NETNS`], with `conf` on stdin
/// and `CNI_ARGS` `args`; `CNI_PATH` is `dir`, where an empty `host-local` and `sticky-ipam`
/// are all that finding the plugin asks for.
pub fn call(command: &str, conf: &Value, args: &str, dir: &Path) -> Call {
    for plugin in ["host-local", "sticky-ipam"] {
        std::fs::write(dir.join(plugin), "").unwrap();
    }
    let vars = [
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", "c1".to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_NETNS", NETNS.to_string()),
        ("CNI_PATH", dir.display().to_string()),
        ("CNI_ARGS", args.to_string()),
    ];
    let env = Env::from_vars(|k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    let stdin = conf.to_string().into_bytes();
    let conf = NetConf::parse(&stdin).unwrap();
    Call { env, conf, stdin }
}
