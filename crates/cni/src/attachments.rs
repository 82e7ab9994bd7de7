//! The runtime's list of live attachments that a GC must keep: `cni.dev/valid-attachments`
//! (spec 1.1; `cni.dev/attachments` in its drafts).
//!
//! One parser for both plugins, and it is strict: a GC removes everything the list does not
//! name, so a list read loosely (an entry skipped because a key is misspelt) would remove a
//! live pod. The whole list is checked before the caller removes anything.

use serde_json::Value;

/// The keys a runtime may carry the list under, in order of preference.
pub const KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

/// One live attachment: a container's interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttachmentsError {
    #[error("{key} must be a list of {{\"containerID\", \"ifname\"}} objects, not {found}")]
    NotAList { key: &'static str, found: String },
    #[error(
        "{key}[{index}] must be an object with string \"containerID\" and \"ifname\", not {found}; nothing was collected"
    )]
    BadEntry {
        key: &'static str,
        index: usize,
        found: String,
    },
}

/// The valid attachments of a GC config: `None` when neither key is present (the caller
/// decides what that means; it is never "nothing is valid"), the empty list for `null` (how
/// libcni marshals CRI-O's list for a network without a live pod).
pub fn valid_attachments(raw: &Value) -> Result<Option<Vec<Attachment>>, AttachmentsError> {
    let Some((key, list)) = KEYS
        .iter()
        .find_map(|key| raw.get(*key).map(|list| (*key, list)))
    else {
        return Ok(None);
    };
    let entries = match list {
        Value::Null => return Ok(Some(Vec::new())),
        Value::Array(entries) => entries,
        other => {
            return Err(AttachmentsError::NotAList {
                key,
                found: short(other),
            });
        }
    };
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            entry_of(entry).ok_or_else(|| AttachmentsError::BadEntry {
                key,
                index,
                found: short(entry),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn entry_of(entry: &Value) -> Option<Attachment> {
    let field = |name: &str| {
        entry
            .get(name)?
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Some(Attachment {
        container_id: field("containerID")?,
        ifname: field("ifname")?,
    })
}

/// The offending JSON, cut short enough for an error message.
fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(cid: &str, ifname: &str) -> Attachment {
        Attachment {
            container_id: cid.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn either_key_null_and_missing() {
        let v = json!({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]});
        assert_eq!(valid_attachments(&v), Ok(Some(vec![one("a", "eth0")])));
        let old = json!({"cni.dev/attachments": []});
        assert_eq!(valid_attachments(&old), Ok(Some(vec![])));
        let null = json!({"cni.dev/valid-attachments": null});
        assert_eq!(valid_attachments(&null), Ok(Some(vec![])), "CRI-O, no pods");
        assert_eq!(valid_attachments(&json!({"name": "x"})), Ok(None));
    }

    #[test]
    fn the_spec_key_wins_over_the_draft_key() {
        let v = json!({
            "cni.dev/attachments": "garbage",
            "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
        });
        assert_eq!(valid_attachments(&v), Ok(Some(vec![one("a", "eth0")])));
    }

    #[test]
    fn one_bad_entry_refuses_the_whole_list() {
        for bad in [
            json!({"containerID": "b", "ifName": "eth0"}),
            json!({"containerID": 7, "ifname": "eth0"}),
            json!({"containerID": "", "ifname": "eth0"}),
            json!({"containerID": "b", "ifname": null}),
            json!(null),
            json!("b"),
        ] {
            let v =
                json!({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}, bad]});
            let err = valid_attachments(&v).expect_err(&bad.to_string());
            assert!(
                matches!(err, AttachmentsError::BadEntry { index: 1, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn extra_keys_in_an_entry_are_ignored_as_libcni_does() {
        let v =
            json!({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0", "x": 1}]});
        assert_eq!(valid_attachments(&v), Ok(Some(vec![one("a", "eth0")])));
    }

    #[test]
    fn a_list_that_is_not_a_list_is_refused() {
        for bad in [json!({}), json!("all"), json!(1), json!(true)] {
            let v = json!({"cni.dev/attachments": bad});
            assert!(matches!(
                valid_attachments(&v),
                Err(AttachmentsError::NotAList {
                    key: "cni.dev/attachments",
                    ..
                })
            ));
        }
    }
}
