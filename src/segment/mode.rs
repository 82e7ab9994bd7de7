//! Where `sticky-vxlan` chooses its mode: the network config's `"mode"` (absent: the main,
//! L3 mode; `"segment"`: an L2 segment).

use serde_json::Value;

use super::Error;
use super::plugin::Segment;
use crate::cni::{Call, CniError, CniResult, Plugin};
use crate::vxlan::plugin::StickyVxlan;

/// The plugin `sticky-vxlan` runs: the mode's.
pub struct ByMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Main,
    Segment,
}

pub fn mode(conf: &Value) -> Result<Mode, Error> {
    match conf.get("mode") {
        None | Some(Value::Null) => Ok(Mode::Main),
        Some(Value::String(s)) if s == "segment" => Ok(Mode::Segment),
        Some(v) => Err(Error::Mode(v.to_string())),
    }
}

/// Runs `op` on the plugin of the call's mode.
fn by_mode<T>(
    call: &Call,
    main: impl FnOnce(&StickyVxlan) -> Result<T, crate::vxlan::Error>,
    segment: impl FnOnce(&Segment) -> Result<T, Error>,
) -> Result<T, CniError> {
    match mode(&call.conf.raw)? {
        Mode::Main => Ok(main(&StickyVxlan)?),
        Mode::Segment => Ok(segment(&Segment)?),
    }
}

impl Plugin for ByMode {
    type Error = CniError;

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        by_mode(call, |p| p.add(call), |p| p.add(call))
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.del(call), |p| p.del(call))
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.check(call), |p| p.check(call))
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.gc(call), |p| p.gc(call))
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.status(call), |p| p.status(call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn modes() {
        assert_eq!(mode(&json!({})).unwrap(), Mode::Main);
        assert_eq!(mode(&json!({"mode": "segment"})).unwrap(), Mode::Segment);
        for bad in [json!("Segment"), json!("l2"), json!(1)] {
            assert!(matches!(mode(&json!({"mode": bad})), Err(Error::Mode(_))));
        }
    }
}
