//! A recording [`Device`] that keeps the device in memory and takes changes as a WireGuard
//! device does ([`sticky_sites::tunnel::apply`]): for the tests and the simulation, which read
//! and change what it holds (handshakes, endpoints, a device made anew).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use ipnet::IpNet;
use sticky_sites::keys::{PrivateKey, PublicKey};
use sticky_sites::tunnel::{self, DeviceState, PeerChange};

use super::{Device, Error};

/// One call made to the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Ensure {
        ifname: String,
        mtu: u32,
    },
    Get {
        ifname: String,
    },
    Set {
        ifname: String,
        /// The public key of the private key given.
        public_key: Option<PublicKey>,
        port: Option<u16>,
        changes: Vec<PeerChange>,
    },
    Routes {
        ifname: String,
        want: Vec<IpNet>,
    },
    Nudge(SocketAddr),
}

/// One device in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub mtu: u32,
    pub state: DeviceState,
    pub routes: Vec<IpNet>,
}

/// Devices in memory by name, every call recorded.
#[derive(Debug, Default)]
pub struct Fake {
    pub calls: RefCell<Vec<Call>>,
    pub devices: RefCell<BTreeMap<String, Held>>,
}

impl Fake {
    /// The calls made so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// What device `ifname` holds now, if it exists.
    pub fn held(&self, ifname: &str) -> Option<Held> {
        self.devices.borrow().get(ifname).cloned()
    }

    fn record(&self, call: Call) {
        self.calls.borrow_mut().push(call);
    }

    fn with<T>(&self, ifname: &str, f: impl FnOnce(&mut Held) -> T) -> Result<T, Error> {
        let mut devices = self.devices.borrow_mut();
        let held = devices
            .get_mut(ifname)
            .ok_or_else(|| Error::NoDevice(ifname.into()))?;
        Ok(f(held))
    }
}

impl Device for Fake {
    fn ensure(&self, ifname: &str, mtu: u32) -> Result<(), Error> {
        self.record(Call::Ensure {
            ifname: ifname.into(),
            mtu,
        });
        self.devices
            .borrow_mut()
            .entry(ifname.into())
            .or_default()
            .mtu = mtu;
        Ok(())
    }

    fn get(&self, ifname: &str) -> Result<DeviceState, Error> {
        self.record(Call::Get {
            ifname: ifname.into(),
        });
        self.with(ifname, |d| d.state.clone())
    }

    fn set(
        &self,
        ifname: &str,
        key: Option<&PrivateKey>,
        port: Option<u16>,
        changes: &[PeerChange],
    ) -> Result<(), Error> {
        if key.is_none() && port.is_none() && changes.is_empty() {
            return Ok(());
        }
        self.record(Call::Set {
            ifname: ifname.into(),
            public_key: key.map(PrivateKey::public_key),
            port,
            changes: changes.to_vec(),
        });
        self.with(ifname, |d| {
            if let Some(k) = key {
                d.state.public_key = Some(k.public_key());
            }
            if let Some(p) = port {
                d.state.listen_port = p;
            }
            tunnel::apply(&mut d.state, changes);
        })
    }

    fn routes(&self, ifname: &str, want: &[IpNet]) -> Result<(), Error> {
        self.record(Call::Routes {
            ifname: ifname.into(),
            want: want.to_vec(),
        });
        self.with(ifname, |d| d.routes = want.to_vec())
    }

    fn nudge(&self, to: SocketAddr) -> Result<(), Error> {
        self.record(Call::Nudge(to));
        Ok(())
    }
}
