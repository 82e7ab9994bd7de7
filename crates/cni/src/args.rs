//! `CNI_ARGS`: `K=V;K=V` pairs passed by the runtime.
//!
//! kubelet sends `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`, `K8S_POD_INFRA_CONTAINER_ID`
//! and `IgnoreUnknown=1`; podman sends `K8S_POD_NAME` only; `ctr run --cni` sends nothing. As in
//! the reference plugins, a key the plugin does not know is an error unless `IgnoreUnknown` is
//! true.

/// The parsed pairs, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    pairs: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("CNI_ARGS item {item:?} is not of the form KEY=VALUE")]
    NotAPair { item: String },
    #[error("CNI_ARGS has an empty key in {item:?}")]
    EmptyKey { item: String },
    #[error("CNI_ARGS sets {key} twice")]
    Repeated { key: String },
    /// The reference plugins' words (`types.LoadArgs`): `ARGS: unknown args ["FOO=bar"]`.
    #[error("ARGS: unknown args [{}]", go_quoted(.pairs))]
    Unknown { pairs: Vec<String> },
    #[error("CNI_ARGS IgnoreUnknown={value:?} is not a boolean (1, 0, true, false)")]
    BadBool { value: String },
}

impl Args {
    /// Parses `K=V;K=V`. Empty items (`a=1;;b=2`, a trailing `;`) are skipped, as libcni does.
    pub fn parse(text: &str) -> Result<Args, ArgsError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for item in text.split(';').filter(|item| !item.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ArgsError::NotAPair {
                    item: item.to_string(),
                });
            };
            if key.is_empty() {
                return Err(ArgsError::EmptyKey {
                    item: item.to_string(),
                });
            }
            if pairs.iter().any(|(k, _)| k == key) {
                return Err(ArgsError::Repeated {
                    key: key.to_string(),
                });
            }
            pairs.push((key.to_string(), value.to_string()));
        }
        Ok(Args { pairs })
    }

    /// The value of `key`, if it was given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` when given and not empty.
    pub fn non_empty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    /// Fails on a key outside `known` unless `IgnoreUnknown` is true.
    pub fn check_known(&self, known: &[&str]) -> Result<(), ArgsError> {
        let ignore = match self.get("IgnoreUnknown") {
            None => false,
            Some(v) if v == "1" || v.eq_ignore_ascii_case("true") => true,
            Some(v) if v == "0" || v.eq_ignore_ascii_case("false") => false,
            Some(v) => {
                return Err(ArgsError::BadBool {
                    value: v.to_string(),
                });
            }
        };
        if ignore {
            return Ok(());
        }
        let unknown: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| k != "IgnoreUnknown" && !known.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        match unknown.is_empty() {
            true => Ok(()),
            false => Err(ArgsError::Unknown { pairs: unknown }),
        }
    }
}

/// Go's `%q` of a string slice, for printable text: each quoted, separated by spaces.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| serde_json::Value::String(s.clone()).to_string())
        .collect();
    quoted.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_args() {
        let a = Args::parse(
            "K8S_POD_UID=u-1;IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc",
        )
        .unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(a.get("K8S_POD_NAMESPACE"), Some("default"));
        assert_eq!(a.get("missing"), None);
        assert_eq!(a.check_known(&[]), Ok(()));
    }

    #[test]
    fn values_may_hold_equals_and_be_empty() {
        let a = Args::parse("A=b=c;B=;").unwrap();
        assert_eq!(a.get("A"), Some("b=c"));
        assert_eq!(a.get("B"), Some(""));
        assert_eq!(a.non_empty("B"), None);
    }

    #[test]
    fn rejects_malformed_items() {
        assert!(matches!(
            Args::parse("novalue"),
            Err(ArgsError::NotAPair { .. })
        ));
        assert!(matches!(Args::parse("=v"), Err(ArgsError::EmptyKey { .. })));
        assert!(matches!(
            Args::parse("A=1;A=2"),
            Err(ArgsError::Repeated { .. })
        ));
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let a = Args::parse("FOO=1;IP=10.0.0.2").unwrap();
        assert_eq!(
            a.check_known(&["IP"]),
            Err(ArgsError::Unknown {
                pairs: vec!["FOO=1".into()]
            })
        );
        let a = Args::parse("FOO=1;IgnoreUnknown=true").unwrap();
        assert_eq!(a.check_known(&["IP"]), Ok(()));
        let a = Args::parse("FOO=1;IgnoreUnknown=0").unwrap();
        assert!(a.check_known(&[]).is_err());
        let a = Args::parse("IgnoreUnknown=maybe").unwrap();
        assert!(matches!(a.check_known(&[]), Err(ArgsError::BadBool { .. })));
    }
}
