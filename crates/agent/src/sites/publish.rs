//! The sites part of what the main loop carries between the API and the sites run: this node's
//! sites annotations on its own Node ([`Annotations`]: the gateway's public key as its key file
//! says, where its peers behind NAT come from as its tunnel shows), and what the probes saw
//! handed to the one place that makes the plan again ([`observe`]). The annotations go out in
//! the flannel publisher's one PATCH (`crate::publish`); each function returns its log lines.

use crate::objects::Node;
use crate::publish::Publishing;
use crate::sync::Keeper;

use super::run::SitesRun;

/// This node's sites annotations, kept as the key file and the tunnel say.
#[derive(Debug, Default)]
pub struct Annotations {
    /// Why this node's gateway key cannot be used, as last logged (a standing error is logged
    /// once, and again when it changes or clears).
    key_error: Option<String>,
}

impl Annotations {
    /// Both annotations, once a round (they read the key file and the tunnel): when one
    /// changes, the own Node `own` is offered to the publisher `p` again (patched only if it
    /// differs).
    pub fn keep(&mut self, p: &mut Publishing, own: &Node, run: &mut SitesRun) -> Vec<String> {
        let mut lines = self.keep_key(p, own, run);
        lines.extend(keep_observed(p, own, run));
        lines
    }

    /// Keeps the key this node publishes as its gateway key file says (made when its Node is
    /// first labelled a gateway; a rotated one is taken here).
    fn keep_key(&mut self, p: &mut Publishing, own: &Node, run: &mut SitesRun) -> Vec<String> {
        let read = run.public_key(own).transpose();
        let mut lines: Vec<String> = self.key_said(read.as_ref().err()).into_iter().collect();
        let Ok(key) = read else {
            return lines;
        };
        if p.publisher.public_key != key {
            if let Some(k) = &key {
                lines.push(format!(
                    "sites: this node's gateway public key is {}",
                    k.to_base64()
                ));
            }
            p.publisher.public_key = key;
            p.offer(own.clone());
            run.key_changed();
        } else if let Some(line) = key.and_then(|k| run.confirm_published(own, &k)) {
            lines.push(line);
        }
        lines
    }
}

impl Annotations {
    /// The line to log for the key as last read (`error`: why it cannot be used, None: it can):
    /// a standing error once, and again when it changes; its end once.
    fn key_said(&mut self, error: Option<&String>) -> Option<String> {
        match error {
            Some(e) if self.key_error.as_ref() == Some(e) => None,
            Some(e) => {
                self.key_error = Some(e.clone());
                Some(format!("sites: this node's gateway key: {e}"))
            }
            None => self
                .key_error
                .take()
                .map(|_| "sites: this node's gateway key is usable again".into()),
        }
    }
}

/// Keeps the NAT discovery annotation this node publishes as its tunnel shows it.
fn keep_observed(p: &mut Publishing, own: &Node, run: &SitesRun) -> Vec<String> {
    let now = run.observed_endpoints();
    if now.is_none() || p.publisher.observed_endpoints == now {
        return Vec::new();
    }
    let line = format!(
        "sites: peers behind NAT come from {}",
        now.as_deref().unwrap_or_default()
    );
    p.publisher.observed_endpoints = now;
    p.offer(own.clone());
    vec![line]
}

/// Takes what the probes saw: when it changed, the plan is made again in one place, the
/// keeper's (with the Nodes it holds, API or not), or from the cache when it has none yet.
/// Returns the log lines, and true when the keeper took it: its next write makes the plan
/// again.
pub fn observe(run: &mut SitesRun, keeper: Option<&mut Keeper>) -> (Vec<String>, bool) {
    let (seen, mut lines) = run.observe();
    if seen.is_none() {
        return (lines, false);
    }
    match keeper {
        // The run's shaper has the observation: the keeper's next write makes the plan with it.
        Some(keeper) if keeper.listed() => (lines, true),
        _ => {
            lines.extend(run.recompute());
            (lines, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36: a key that cannot be used is said once, not every round; a new reason and
    /// its end are said once each.
    #[test]
    fn a_key_error_is_logged_once_and_its_end_once() {
        let mut a = Annotations::default();
        let denied = "key dir: permission denied".to_string();
        let said = a.key_said(Some(&denied)).unwrap_or_default();
        assert!(said.contains("permission denied"), "{said}");
        for _ in 0..5 {
            assert_eq!(
                a.key_said(Some(&denied)),
                None,
                "every round after the first"
            );
        }
        let other = "key file: not 44 bytes".to_string();
        assert!(a.key_said(Some(&other)).is_some(), "a new reason");
        assert_eq!(
            a.key_said(None).as_deref(),
            Some("sites: this node's gateway key is usable again")
        );
        assert_eq!(a.key_said(None), None);
    }
}
