//! nftables, as the node's kernel seam runs it ([`crate::kernel::Kernel::nft`]): a table's
//! name and family, an `nft -f -` script run in one transaction, and deleting the tables that
//! exist. What rules a mode wants is the mode's (sticky-vxlan's main mode writes them).

use std::io::Write;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running nft (needed by ipMasq/peerOnlyPort): {0}")]
    Spawn(#[source] std::io::Error),
    #[error("writing the rules to nft: {0}")]
    Write(#[source] std::io::Error),
    #[error("nft refused the rules ({status}): {stderr}")]
    Refused { status: String, stderr: String },
}

/// An nftables address family a table of the network lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    Ip,
    Ip6,
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        })
    }
}

/// One nftables table: `table <family> <name>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Table {
    pub family: Family,
    pub name: String,
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// Deletes those of `tables` that exist, in one transaction. Without `nft`, or where
/// `nft list tables` fails (no nf_tables in the kernel), there is no table to delete.
pub fn remove_present(tables: &[Table]) -> Result<(), Error> {
    let listed = match Command::new("nft")
        .args(["list", "tables"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::Spawn(e)),
    };
    let script: String = present(&listed, tables)
        .iter()
        .map(|t| format!("delete table {t}\n"))
        .collect();
    if script.is_empty() {
        return Ok(());
    }
    run(&script)
}

/// Those of `tables` that `nft list tables` printed (`table <family> <name>` a line).
fn present<'a>(listed: &str, tables: &'a [Table]) -> Vec<&'a Table> {
    tables
        .iter()
        .filter(|t| {
            listed.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words == ["table", &t.family.to_string(), t.name.as_str()]
            })
        })
        .collect()
}

/// Runs `script` with `nft -f -` (one transaction).
pub fn run(script: &str) -> Result<(), Error> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(Error::Write)?;
    }
    let out = child.wait_with_output().map_err(Error::Write)?;
    if !out.status.success() {
        return Err(Error::Refused {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_tables_of_the_network_are_removed() {
        let listed = "table ip sticky_vxlan_edge_2d1\ntable ip6 filter\ntable ip6 sticky_vxlan_edge_2d1x\ntable inet sticky_vxlan_edge_2d1\n";
        let ours = [Family::Ip, Family::Ip6].map(|family| Table {
            family,
            name: "sticky_vxlan_edge_2d1".to_string(),
        });
        let found: Vec<String> = present(listed, &ours)
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(found, ["ip sticky_vxlan_edge_2d1"]);
    }
}
