//! A gateway's WireGuard key pair: the key types, their base64 and x25519, nothing of files.
//! A key that changes at every start is what breaks Raven's and flannel's tunnels after an
//! offline restart (issue 28, "Keys that outlive everything"), so the agent keeps the private
//! key in a file (`sticky_vxlan_agent::sites::keys`); this module gives it the format, `wg
//! genkey`'s (base64 of 32 bytes and a newline, so `wg set IF private-key FILE` reads it too).
//!
//! The private key never appears in `Debug` output (there is no `Display`), is never quoted in
//! an error, and is zeroed when dropped.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

/// Length of a key in `wg genkey`'s base64 (32 bytes, padded).
pub const BASE64_LEN: usize = 44;

/// Errors of key parsing and generation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("key {value:?} is not base64 of 32 bytes (like `wg pubkey` prints)")]
    NotAKey { value: String },
    #[error("key {value:?} is all zeros: not a usable WireGuard key")]
    ZeroKey { value: String },
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

/// A WireGuard public key (Curve25519, 32 bytes). Shown as base64, as `wg` shows it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// Parses base64 of 32 bytes (surrounding white space ignored); the all-zero key is refused.
    pub fn from_base64(text: &str) -> Result<Self, Error> {
        let bytes = decode_key(text.trim()).ok_or_else(|| Error::NotAKey {
            value: text.to_string(),
        })?;
        if bytes.iter().all(|b| *b == 0) {
            return Err(Error::ZeroKey {
                value: text.to_string(),
            });
        }
        Ok(Self(*bytes))
    }

    /// Base64, as published in the Node annotation.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

fn decode_key(text: &str) -> Option<Zeroizing<[u8; 32]>> {
    if text.len() != BASE64_LEN {
        return None;
    }
    let bytes = Zeroizing::new(STANDARD.decode(text).ok()?);
    let mut key = Zeroizing::new([0u8; 32]);
    if bytes.len() != 32 {
        return None;
    }
    key.copy_from_slice(&bytes);
    Some(key)
}

/// A WireGuard private key: redacted in `Debug`, zeroed on drop, no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey(Zeroizing<[u8; 32]>);

impl PrivateKey {
    /// A new key from the operating system's randomness (clamped as Curve25519 wants).
    pub fn generate() -> Result<Self, Error> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut *bytes).map_err(|e| Error::Random(e.to_string()))?;
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        Ok(Self(bytes))
    }

    /// A key from its 32 bytes (as read back from a device).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The raw bytes, for the one place that sends them to the tunnel.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public key to publish.
    pub fn public_key(&self) -> PublicKey {
        let secret = x25519_dalek::StaticSecret::from(*self.0);
        PublicKey(*x25519_dalek::PublicKey::from(&secret).as_bytes())
    }

    /// Parses `wg genkey`'s base64 of 32 bytes (no white space); `None` when it is not one,
    /// and no error quoting the text: it is a secret.
    pub fn from_base64(text: &str) -> Option<Self> {
        decode_key(text).map(Self)
    }

    /// `wg genkey`'s format, as the key file holds it: base64 of the 32 bytes and a newline.
    pub fn to_file_text(&self) -> Zeroizing<String> {
        let mut text = Zeroizing::new(String::with_capacity(BASE64_LEN + 1));
        STANDARD.encode_string(*self.0, &mut text);
        text.push('\n');
        text
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_key_parse_table() {
        let good = STANDARD.encode([7u8; 32]);
        let zero = STANDARD.encode([0u8; 32]);
        let short = STANDARD.encode([7u8; 31]);
        let cases: &[(&str, bool)] = &[
            (&good, true),
            (&format!(" {good}\n"), true),
            (&zero, false),
            (&short, false),
            ("not base64 at all, not base64 at all, xxxxx", false),
            ("", false),
        ];
        for (text, ok) in cases {
            assert_eq!(PublicKey::from_base64(text).is_ok(), *ok, "{text:?}");
        }
        assert!(matches!(
            PublicKey::from_base64(&zero),
            Err(Error::ZeroKey { .. })
        ));
    }

    #[test]
    fn public_key_matches_rfc7748_vector() {
        // RFC 7748 section 6.1: Alice's private and public key.
        let private: [u8; 32] =
            hex32("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(
            PrivateKey::from_bytes(private).public_key(),
            PublicKey(public)
        );
    }

    fn hex32(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    #[test]
    fn private_key_is_redacted_in_debug() {
        let k = PrivateKey::from_bytes([0xab; 32]);
        let shown = format!("{k:?}");
        assert_eq!(shown, "PrivateKey(<redacted>)");
        assert!(!shown.contains(&STANDARD.encode([0xab; 32])));
    }

    #[test]
    fn file_text_is_wg_genkey_format_and_reads_back() {
        let k = PrivateKey::from_bytes([0xab; 32]);
        let text = k.to_file_text();
        assert_eq!(text.len(), BASE64_LEN + 1);
        assert_eq!(text.as_str(), format!("{}\n", STANDARD.encode([0xab; 32])));
        assert_eq!(PrivateKey::from_base64(text.trim_end()), Some(k));
        for bad in [
            "",
            "abc",
            &"!".repeat(BASE64_LEN),
            &STANDARD.encode([1u8; 31]),
        ] {
            assert_eq!(PrivateKey::from_base64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn generated_keys_differ_and_are_clamped() {
        let a = PrivateKey::generate().unwrap();
        let b = PrivateKey::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.bytes()[0] & 7, 0);
        assert_eq!(a.bytes()[31] & 0xc0, 0x40);
    }
}
