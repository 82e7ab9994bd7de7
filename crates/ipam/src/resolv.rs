//! `resolvConf`: the DNS part of the result, read from a resolv.conf-style file as host-local
//! does (`nameserver`, `domain`, `search`, `options`).

use std::path::{Path, PathBuf};

use cni_protocol::Dns;

/// In host-local's words (Go's `*PathError`): `open /etc/x: no such file or directory`.
#[derive(Debug, thiserror::Error)]
#[error("open {}: {}", path.display(), go_errno(source))]
pub struct ResolvError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Go spells errno texts in lower case and without Rust's "(os error N)".
fn go_errno(e: &std::io::Error) -> String {
    let text = match e.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_string(),
        None => e.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

pub fn read(path: &Path) -> Result<Dns, ResolvError> {
    let text = std::fs::read_to_string(path).map_err(|source| ResolvError {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse(&text))
}

pub fn parse(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.nameservers.extend(words.next().map(str::to_string)),
            Some("domain") => dns.domain = words.next().map(str::to_string),
            Some("search") => dns.search = words.map(str::to_string).collect(),
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_four_keys_and_ignores_comments() {
        let dns = super::parse(
            "# c\nnameserver 192.0.2.53\nnameserver 2001:db8::53 ; x\ndomain example.org\nsearch a.example b.example\noptions ndots:5 edns0\nbogus\n",
        );
        assert_eq!(dns.nameservers, ["192.0.2.53", "2001:db8::53"]);
        assert_eq!(dns.domain.as_deref(), Some("example.org"));
        assert_eq!(dns.search, ["a.example", "b.example"]);
        assert_eq!(dns.options, ["ndots:5", "edns0"]);
    }
}
