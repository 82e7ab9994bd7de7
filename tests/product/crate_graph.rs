//! The workspace's crate graph, from `cargo metadata`, against the crate table in
//! docs/design.md ("Crates"): every crate is in the table, each depends (normal dependencies)
//! on exactly the crates its row names, and only on crates of the rows above it (imports point
//! down). Beside the table, the rules it exists for, which no edit of the doc can loosen: only
//! the agent links an HTTP client, TLS or YAML; sticky-ipam links no netlink; the CNI protocol
//! crate stands alone on serde, serde_json, thiserror and ipnet; the plugins link no crypto,
//! random, key-encoding or async crate, and nothing of sites.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// One row of the crate table.
#[derive(Debug)]
struct Row {
    name: String,
    ours: BTreeSet<String>,
    external: BTreeSet<String>,
}

/// The names in a table cell: the backquoted words, none for `—`.
fn names(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The rows of the table after the `<!-- crate-graph -->` marker in docs/design.md, in order.
fn table() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md");
    let text = std::fs::read_to_string(&path).expect("read docs/design.md");
    let (_, after) = text
        .split_once("<!-- crate-graph -->")
        .expect("docs/design.md has the <!-- crate-graph --> marker before the crate table");
    let rows: Vec<Row> = after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 6, "a crate row has 4 cells: {l}");
            // The crate is the cell's first backquoted word (its path and lib name follow).
            let name = cells[1]
                .split('`')
                .nth(1)
                .expect("a crate name in backquotes");
            Row {
                name: name.to_string(),
                ours: names(cells[3]),
                external: names(cells[4]),
            }
        })
        .collect();
    assert!(rows.len() > 5, "the crate table: {rows:?}");
    rows
}

/// The host's target triple (`rustc -vV`): the graph is the one built here.
fn host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// `cargo metadata` of the workspace, with the resolved graph for this host (offline: the
/// build has every package it needs; other platforms' are not downloaded).
fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// The workspace's packages: name → (our crates, external crates) among its normal
/// dependencies, as the manifests declare them.
fn declared(meta: &Value) -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let packages = meta["packages"].as_array().expect("packages");
    let ours: BTreeSet<&str> = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .filter_map(|p| p["name"].as_str())
        .collect();
    packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .map(|p| {
            let normal = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str());
            let (mine, external): (BTreeSet<String>, BTreeSet<String>) = (
                normal
                    .clone()
                    .filter(|n| ours.contains(n))
                    .map(str::to_string)
                    .collect(),
                normal
                    .filter(|n| !ours.contains(n))
                    .map(str::to_string)
                    .collect(),
            );
            let name = p["name"].as_str().expect("name").to_string();
            (name, (mine, external))
        })
        .collect()
}

/// Every package `name` links (its normal dependencies, transitively, itself included), from
/// the resolved graph.
fn linked(meta: &Value, name: &str) -> BTreeSet<String> {
    let packages = meta["packages"].as_array().expect("packages");
    let name_of = |id: &str| -> String {
        packages
            .iter()
            .find(|p| p["id"].as_str() == Some(id))
            .and_then(|p| p["name"].as_str())
            .unwrap_or(id)
            .to_string()
    };
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve.nodes");
    let start = nodes
        .iter()
        .find(|n| n["id"].as_str().is_some_and(|id| name_of(id) == name))
        .and_then(|n| n["id"].as_str())
        .unwrap_or_else(|| panic!("{name} is not in the resolved graph"))
        .to_string();
    let mut seen = BTreeSet::from([start.clone()]);
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        let node = nodes
            .iter()
            .find(|n| n["id"].as_str() == Some(&id))
            .expect("a resolved node");
        for dep in node["deps"].as_array().expect("deps") {
            let normal = dep["dep_kinds"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()));
            let Some(pkg) = dep["pkg"].as_str() else {
                continue;
            };
            if normal && seen.insert(pkg.to_string()) {
                todo.push(pkg.to_string());
            }
        }
    }
    seen.iter().map(|id| name_of(id)).collect()
}

#[test]
fn the_crate_graph_is_the_table_in_design_md() {
    let rows = table();
    let meta = metadata();
    let declared = declared(&meta);
    let in_table: BTreeSet<String> = rows.iter().map(|r| r.name.clone()).collect();
    let in_workspace: BTreeSet<String> = declared.keys().cloned().collect();
    assert_eq!(
        in_table, in_workspace,
        "docs/design.md's crate table names every crate of the workspace, and only those"
    );
    for (i, row) in rows.iter().enumerate() {
        let (ours, external) = &declared[&row.name];
        assert_eq!(
            (ours, external),
            (&row.ours, &row.external),
            "{}: its manifest's normal dependencies (ours, external) against its row in docs/design.md",
            row.name
        );
        let above: BTreeSet<&String> = rows[..i].iter().map(|r| &r.name).collect();
        for dep in ours {
            assert!(
                above.contains(dep),
                "{} uses {dep}, which is not below it in the table: imports point down only",
                row.name
            );
        }
    }
}

#[test]
fn only_the_agent_links_http_tls_or_yaml() {
    let meta = metadata();
    let heavy = ["ureq", "rustls", "serde_yaml_ng"];
    for name in declared(&meta).keys() {
        let links = linked(&meta, name);
        let found: Vec<&str> = heavy.into_iter().filter(|h| links.contains(*h)).collect();
        match name.as_str() {
            "sticky-vxlan-agent" => assert_eq!(found, heavy, "{name} links {found:?}"),
            // The test support crate's fake API server speaks TLS; it is a dev-dependency
            // only (checked below), so no program links it.
            "sticky-testkit" => {}
            _ => assert!(found.is_empty(), "{name} links {found:?}"),
        }
    }
    for name in declared(&meta).keys() {
        assert!(
            name == "sticky-testkit" || !linked(&meta, name).contains("sticky-testkit"),
            "{name} links the test support crate"
        );
    }
}

/// The async runtime and the userspace WireGuard stay in the sites data-path daemon: the
/// plugins and the agent are blocking programs (docs/design.md).
#[test]
fn only_sticky_wg_links_tokio_or_gotatun() {
    let meta = metadata();
    for name in declared(&meta).keys() {
        let links = linked(&meta, name);
        let found: Vec<&str> = ["tokio", "gotatun"]
            .into_iter()
            .filter(|h| links.contains(*h))
            .collect();
        match name.as_str() {
            "sticky-wg" => assert_eq!(found, ["tokio", "gotatun"], "{name} links {found:?}"),
            _ => assert!(found.is_empty(), "{name} links {found:?}"),
        }
    }
}

#[test]
fn sticky_ipam_links_no_netlink_and_the_cni_crate_stands_alone() {
    let meta = metadata();
    let ipam = linked(&meta, "sticky-ipam");
    let netlink: Vec<&String> = ipam.iter().filter(|n| n.contains("netlink")).collect();
    assert!(netlink.is_empty(), "sticky-ipam links {netlink:?}");
    let (ours, external) = &declared(&meta)["cni-protocol"];
    assert!(ours.is_empty(), "cni-protocol uses our crates {ours:?}");
    let allowed = ["ipnet", "serde", "serde_json", "thiserror"];
    assert!(
        external.iter().all(|e| allowed.contains(&e.as_str())),
        "cni-protocol depends on {external:?}; only {allowed:?} are allowed"
    );
}

/// Every package `name` links when built alone, as the release build makes each binary
/// (`cargo rustc -p <binary>`, scripts/build-release.sh): `cargo tree -e normal -p`, whose
/// features are that package's, not the whole workspace's.
fn linked_alone(name: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .args(["--target", &host(), "-p", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The binaries kubelet executes per pod link nothing of sites but what they read (the MTU
/// bound and the carried subnets, in the overlay): no crypto, no random source, no key
/// encoding, no async runtime, and not the sites crate (issue 33).
#[test]
fn the_plugins_link_no_crypto_random_key_encoding_async_or_sites() {
    let forbidden = [
        "sticky-sites",
        "x25519-dalek",
        "curve25519-dalek",
        "ring",
        "getrandom",
        "rand",
        "rand_core",
        "zeroize",
        "base64",
        "tokio",
        "futures",
        "async-std",
        "gotatun",
    ];
    for plugin in ["sticky-ipam", "sticky-vxlan"] {
        let links = linked_alone(plugin);
        assert!(links.contains("sticky-overlay") || plugin == "sticky-ipam");
        let found: Vec<&str> = forbidden
            .into_iter()
            .filter(|f| links.contains(*f))
            .collect();
        assert!(found.is_empty(), "{plugin} links {found:?}");
    }
}
