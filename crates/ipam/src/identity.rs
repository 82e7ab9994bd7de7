//! Who an allocation is for: the pod identity from `CNI_ARGS`, and its safe spelling in file
//! names.
//!
//! The sticky key is (namespace, pod name, interface) within one network. Names are untrusted:
//! in file names every byte outside `[a-z0-9.-]` is percent-encoded, so `_` (the separator),
//! `/`, `%`, upper case and control bytes can neither break the split nor leave the directory.
//! A component that would push a file name past 255 bytes is shortened to a prefix, `~` and a
//! hash (`~` never appears in an encoded name); the record body keeps the name whole.

use sha2::{Digest, Sha256};

use cni_protocol::Args;

/// The CNI_ARGS keys this plugin reads.
pub const KNOWN_ARGS: [&str; 5] = [
    "IP",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
];

/// The longest name component kept as is when names get long, in encoded bytes.
const MAX_COMPONENT: usize = 80;
/// How much of a shortened component is kept before the hash.
const KEPT_PREFIX: usize = 64;
/// Longest IP text (IPv6) + two separators: shortening never depends on the family.
const IP_AND_SEPARATORS: usize = 39 + 2;
const MAX_FILE_NAME: usize = 255;

/// A pod as the runtime names it. podman sends no namespace: it is then empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`, or empty when the runtime sends none.
    pub uid: String,
}

impl Pod {
    /// The pod named in `args`, or `None` without `K8S_POD_NAME` (then the plugin behaves
    /// exactly like host-local).
    pub(crate) fn from_args(args: &Args) -> Option<Pod> {
        let name = args.non_empty("K8S_POD_NAME")?;
        Some(Pod {
            namespace: args
                .get("K8S_POD_NAMESPACE")
                .unwrap_or_default()
                .to_string(),
            name: name.to_string(),
            uid: args.get("K8S_POD_UID").unwrap_or_default().to_string(),
        })
    }

    /// `_<namespace>_<pod>`, the part of a record's file name after the IP.
    pub fn suffix(&self) -> String {
        let (ns, pod) = (encode(&self.namespace), encode(&self.name));
        if IP_AND_SEPARATORS + ns.len() + pod.len() <= MAX_FILE_NAME {
            format!("_{ns}_{pod}")
        } else {
            format!(
                "_{}_{}",
                shorten(&ns, &self.namespace),
                shorten(&pod, &self.name)
            )
        }
    }
}

/// Percent-encodes every byte outside `[a-z0-9.-]`.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reverses [`encode`]; `None` for text that is not an encoding (or was shortened).
pub fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn shorten(encoded: &str, raw: &str) -> String {
    if encoded.len() <= MAX_COMPONENT {
        return encoded.to_string();
    }
    // Cut on a boundary that does not split a %XX escape.
    let mut cut = KEPT_PREFIX;
    while encoded.as_bytes()[cut - 1] == b'%' || encoded.as_bytes()[cut - 2] == b'%' {
        cut -= 1;
    }
    let digest = Sha256::digest(raw.as_bytes());
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{}~{hash}", &encoded[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: String::new(),
        }
    }

    #[test]
    fn kubernetes_names_pass_through() {
        assert_eq!(pod("default", "web-0.x").suffix(), "_default_web-0.x");
    }

    #[test]
    fn podman_names_and_hostile_bytes_are_encoded() {
        assert_eq!(pod("", "happy_turing").suffix(), "__happy%5Fturing");
        let s = pod("../..", "a/b%C").suffix();
        assert_eq!(s, "_..%2F.._a%2Fb%25%43");
        assert!(!s.contains('/'));
        assert_eq!(s.matches('_').count(), 2);
        assert_eq!(decode("a%2Fb%25%43").as_deref(), Some("a/b%C"));
    }

    #[test]
    fn long_names_are_shortened_deterministically_and_distinctly() {
        let long_a = "a".repeat(253);
        let mut long_b = long_a.clone();
        long_b.replace_range(200..201, "b");
        let a = pod(&"n".repeat(63), &long_a).suffix();
        let b = pod(&"n".repeat(63), &long_b).suffix();
        assert!(
            IP_AND_SEPARATORS + a.len() - 1 <= MAX_FILE_NAME,
            "{}",
            a.len()
        );
        assert_ne!(a, b, "same prefix, different names");
        assert_eq!(a, pod(&"n".repeat(63), &long_a).suffix());
        assert!(a.contains('~'));
        let upper = pod(&"N".repeat(100), &"P".repeat(100)).suffix();
        assert!(IP_AND_SEPARATORS + upper.len() - 1 <= MAX_FILE_NAME);
        assert!(!upper.contains("%~") && !upper.contains("%4~"));
    }

    #[test]
    fn identity_needs_a_pod_name() {
        let args = Args::parse("K8S_POD_NAMESPACE=x;K8S_POD_NAME=").unwrap();
        assert_eq!(Pod::from_args(&args), None);
        let args = Args::parse("IgnoreUnknown=1;K8S_POD_NAME=c1").unwrap();
        assert_eq!(Pod::from_args(&args), Some(pod("", "c1")));
    }
}
