//! Site A's second gateway for the failover tests (issue 29): node a3 (192.0.2.3, pod subnet
//! 198.18.13.0/24), gateway-labelled, added to a [`Sites`] only when a test asks for it
//! ([`Sites::add_standby`]; the node is [`STANDBY`]), so the other sites tests keep their six nodes. Its namespace and
//! links are the topology's (deleted on drop, also on failure).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::sites_support::*;

impl Sites {
    /// Adds a3 to site A (its namespace on A's LAN, its config, its Node object on the API
    /// server); no daemon is started.
    pub fn add_standby(&mut self) {
        let n = &STANDBY;
        let router = self.router_ns(n.site);
        let ns = self.ns(n.name);
        join_lan(
            &mut self.topo,
            &router,
            n.name,
            &ns,
            &lan_addr(n.ip, n.site),
            "192.0.2.126",
        );
        // a2's config with a3's own files and pod range (and whatever else the site has).
        let mut conf = self.confs["a2"].clone();
        let dir = self.topo.dir.path();
        conf["stateDir"] = json!(self.topo.state_dir(n.k));
        conf["peersFile"] = json!(dir.join(format!("peers-{}.json", n.name)));
        conf["ipam"]["dataDir"] = json!(dir.join(format!("ipam-{}", n.name)));
        conf["ipam"]["ranges"] = json!([[{"subnet": pod_subnet(n.name)}]]);
        let file = dir.join(format!("{}.conf", n.name));
        std::fs::write(&file, conf.to_string()).expect("write a3's config");
        self.confs.insert(n.name, conf);
        self.conf_files.insert(n.name, file);
        self.api.put_node(node_object(n));
    }

    /// Node `name`'s sites status as its agent last wrote it (`<stateDir>/<network>.agent.json`),
    /// or Null.
    pub fn sites_status(&self, name: &str) -> Value {
        let conf = &self.confs[site_node(name).name];
        let (Some(dir), Some(net)) = (conf["stateDir"].as_str(), conf["name"].as_str()) else {
            panic!("no stateDir or name in {name}'s config: {conf}");
        };
        let file = std::path::Path::new(dir).join(format!("{net}.agent.json"));
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .map_or(Value::Null, |v| v["sites"].clone())
    }

    /// Node `name`'s role in its site, as its status says ("active gateway", "member, through
    /// gateway G"), or "" when none yet.
    pub fn site_role(&self, name: &str) -> String {
        self.sites_status(name)["role"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits (120 s) until node `name`'s status says `role`; panics with every log otherwise.
    pub fn wait_for_role(&self, name: &str, role: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = self.site_role(name);
            if now == role {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{name}'s role is {now:?}, not {role:?}, after 120 s; logs: {:#?}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
