//! A builder for an IPAM network config.

use std::path::Path;

use serde_json::{Value, json};

/// A network config for an IPAM plugin: a main plugin entry with an `ipam` section.
#[derive(Debug, Clone)]
pub struct Conf {
    pub value: Value,
}

impl Conf {
    /// `cniVersion` 1.0.0, network `name`, `ipam.type` sticky-ipam, `dataDir` set, and the
    /// given range sets.
    pub fn new(name: &str, data_dir: &Path, ranges: Value) -> Conf {
        Conf {
            value: json!({
                "cniVersion": "1.0.0",
                "name": name,
                "type": "bridge",
                "ipam": {
                    "type": "sticky-ipam",
                    "dataDir": data_dir.to_str().expect("utf-8 temp path"),
                    "ranges": ranges,
                }
            }),
        }
    }

    /// One IPv4 range set with one range.
    pub fn v4(name: &str, data_dir: &Path, subnet: &str) -> Conf {
        Conf::new(name, data_dir, json!([[{ "subnet": subnet }]]))
    }

    pub fn version(mut self, v: &str) -> Conf {
        self.value["cniVersion"] = json!(v);
        self
    }

    pub fn ipam(mut self, key: &str, v: Value) -> Conf {
        self.value["ipam"][key] = v;
        self
    }

    pub fn top(mut self, key: &str, v: Value) -> Conf {
        self.value[key] = v;
        self
    }

    pub fn prev_result(self, result: &Value) -> Conf {
        self.top("prevResult", result.clone())
    }

    pub fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).unwrap()
    }

    pub fn name(&self) -> String {
        self.value["name"].as_str().unwrap().to_string()
    }
}

/// The CNI config of a Multus NetworkAttachmentDefinition written with `config: |` (a literal
/// block holding JSON), as Multus reads it from `spec.config`.
pub fn nad_config(yaml: &str) -> Value {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "config: |");
    let head = lines.next().expect("NAD has no `config: |` block");
    let indent = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .collect();
    serde_json::from_str(&body.join("\n")).expect("spec.config is JSON")
}

/// The newest CNI version a runtime on libcni ≥ 1.2 speaks (containerd ≥ 2.0.1, CRI-O).
pub const LIBCNI_1_2_MAX: &str = "1.1.0";

fn version_key(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let key = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(key)
}

/// The plugin entries of a conf or conflist as a runtime passes them: `name` and `cniVersion`
/// injected from the list. With `negotiate`, the version is libcni ≥ 1.2's choice: the
/// highest of `cniVersion` and the `cniVersions` entries up to [`LIBCNI_1_2_MAX`]; without,
/// libcni 1.1's (containerd 1.6/1.7, Debian's cnitool): `cniVersion` as written.
pub fn runtime_entries(doc: &Value, negotiate: bool) -> Vec<Value> {
    let mut version = doc["cniVersion"].clone();
    if negotiate && let Some(list) = doc["cniVersions"].as_array() {
        let max = version_key(LIBCNI_1_2_MAX);
        let best = list
            .iter()
            .chain([&doc["cniVersion"]])
            .filter_map(Value::as_str)
            .filter(|v| version_key(v).is_some_and(|k| Some(k) <= max))
            .max_by_key(|v| version_key(v));
        if let Some(best) = best {
            version = json!(best);
        }
    }
    match doc["plugins"].as_array() {
        Some(plugins) => plugins
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p["name"] = doc["name"].clone();
                p["cniVersion"] = version.clone();
                p
            })
            .collect(),
        None => vec![doc.clone()],
    }
}
