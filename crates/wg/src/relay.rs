//! The forwarding relay under gotatun (issue 34): a UDP transport around gotatun's own socket
//! that acts on [`sticky_sites::relay`]'s rules. gotatun sends a relayed peer's datagrams to
//! its relayed endpoint; this sends them to the relay behind a header instead. A datagram with
//! a relay header that arrives is forwarded (this gateway relays it: the header rewritten in
//! place, no copy, no key), delivered to gotatun (relayed to this gateway, the header
//! stripped), or dropped and counted; everything else goes to gotatun as it came.
//!
//! The rules need each peer's current endpoint, which gotatun moves to wherever an
//! authenticated datagram came from: [`refresh`] reads them from gotatun after each
//! configuration change, and every [`REFRESH_EVERY`] while relayed datagrams come and go. A
//! peer that roams is forwarded to at its new address within that.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use gotatun::packet::{Packet, PacketBufPool};
use gotatun::udp::socket::{UdpSocket, UdpSocketFactory};
use gotatun::udp::{UdpRecv, UdpSend, UdpTransportFactory, UdpTransportFactoryParams};
use sticky_sites::keys::PublicKey;
use sticky_sites::relay::{self, Drop, HEADER, Id, Inbound, Outbound, Table};
use tokio::sync::Notify;

/// How often the peers' endpoints are read from gotatun when nothing changed them.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// What the transport shares with its refresher: the rules' table and the counts.
#[derive(Default)]
pub struct Relay {
    table: RwLock<Arc<Table>>,
    /// Where a relay saw each peer come from (its punching candidate), learned from the
    /// handshakes it forwarded; the table is built with them.
    candidates: std::sync::Mutex<HashMap<Id, SocketAddr>>,
    /// Told after a configuration change: the table is read again at once.
    changed: Notify,
    /// The data path asked the table since the last refresh: only then is it read again on the
    /// clock (a hub of 10,000 sites that relays nothing reads its peers only after a `set`).
    used: AtomicBool,
    forwarded: AtomicU64,
    delivered: AtomicU64,
    dropped: [AtomicU64; DROPS.len()],
}

/// Every reason a datagram is dropped, in the order of [`Relay::dropped`].
const DROPS: [Drop; 6] = [
    Drop::NotAPeer,
    Drop::UnknownPeer,
    Drop::NoEndpoint,
    Drop::ToItself,
    Drop::NotWireGuard,
    Drop::NoRelay,
];

impl Relay {
    pub fn new() -> Arc<Relay> {
        Arc::new(Relay::default())
    }

    fn table(&self) -> Arc<Table> {
        self.used.store(true, Ordering::Relaxed);
        Arc::clone(&self.table.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The table of `peers` with the candidates learned.
    fn rebuild(&self, peers: Vec<(PublicKey, Option<SocketAddr>)>) {
        let table = {
            let mut candidates = self.candidates.lock().unwrap_or_else(|e| e.into_inner());
            let table = Table::new(peers, &candidates);
            // Those of peers gone are forgotten.
            candidates.retain(|id, _| table.has(id));
            table
        };
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
    }

    /// A relay said where it saw peer `id` come from: the table is built again with it when
    /// that is new.
    fn learn(&self, id: Id, at: SocketAddr) {
        let mut candidates = self.candidates.lock().unwrap_or_else(|e| e.into_inner());
        if candidates.insert(id, at) != Some(at) {
            self.changed.notify_one();
        }
    }

    /// Says that gotatun's peers changed (a `set`): the table is read again now.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    fn drop_one(&self, why: Drop) {
        if let Some(i) = DROPS.iter().position(|d| *d == why) {
            self.dropped[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Datagrams forwarded for others, delivered from a relay, and dropped by reason (since
    /// the device was attached).
    fn counts(&self) -> (u64, u64, Vec<(&'static str, u64)>) {
        let dropped = DROPS
            .iter()
            .zip(&self.dropped)
            .map(|(d, n)| (d.as_str(), n.load(Ordering::Relaxed)))
            .collect();
        (
            self.forwarded.load(Ordering::Relaxed),
            self.delivered.load(Ordering::Relaxed),
            dropped,
        )
    }
}

/// The counts are logged when they first change, then at most once per this.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Keeps `relay`'s table to gotatun's peers: `peers` reads them (key, current endpoint;
/// `None` when gotatun does not answer, and the table stays as it was). Logs the counts (see
/// [`REPORT_EVERY`]). Runs until aborted.
pub async fn refresh<F, Fut>(relay: Arc<Relay>, mut peers: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<Vec<(PublicKey, Option<SocketAddr>)>>>,
{
    let mut said = relay.counts();
    let mut said_at: Option<Instant> = None;
    let mut read = true;
    loop {
        if read && let Some(peers) = peers().await {
            relay.rebuild(peers);
        }
        let now = relay.counts();
        if now != said && said_at.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
            let (forwarded, delivered, dropped) = &now;
            let dropped: Vec<String> = dropped
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(why, n)| format!("{n} {why}"))
                .collect();
            eprintln!(
                "sticky-wg: relay: {forwarded} datagram(s) forwarded between peers, {delivered} \
                 delivered through a relay, dropped: {}",
                if dropped.is_empty() {
                    "none".to_string()
                } else {
                    dropped.join(", ")
                }
            );
            said = now;
            said_at = Some(Instant::now());
        }
        read = tokio::select! {
            _ = tokio::time::sleep(REFRESH_EVERY) => relay.used.swap(false, Ordering::Relaxed),
            _ = relay.changed.notified() => true,
        };
    }
}

/// gotatun's socket factory, its sockets wrapped.
pub struct Factory {
    inner: UdpSocketFactory,
    relay: Arc<Relay>,
}

impl Factory {
    pub fn new(relay: Arc<Relay>) -> Factory {
        Factory {
            inner: UdpSocketFactory::default(),
            relay,
        }
    }
}

impl UdpTransportFactory for Factory {
    type Send = Sender;
    type Recv = Receiver;

    async fn bind(&mut self, params: &UdpTransportFactoryParams) -> io::Result<(Sender, Receiver)> {
        let (tx, rx) = self.inner.bind(params).await?;
        let relay = Arc::clone(&self.relay);
        Ok((
            Sender {
                inner: tx.clone(),
                relay: Arc::clone(&relay),
            },
            Receiver {
                inner: rx,
                tx,
                relay,
                forward: Vec::new(),
                send_buf: Default::default(),
            },
        ))
    }
}

/// gotatun's sending half: a datagram to a relayed endpoint goes to the relay instead.
#[derive(Clone)]
pub struct Sender {
    inner: UdpSocket,
    relay: Arc<Relay>,
}

impl Sender {
    /// Where `packet`, which gotatun sends to relayed endpoint `to`, goes (see
    /// [`Table::outbound`]): to the relay behind its header, directly to the destination's
    /// candidate, or both; nowhere when there is no such relay (counted).
    fn route(&self, table: &Table, packet: Packet, to: SocketAddr) -> Vec<(Packet, SocketAddr)> {
        match table.outbound(&to, &packet) {
            None => vec![(packet, to)],
            Some(Ok(Outbound { relay, direct })) => {
                let mut out = Vec::with_capacity(2);
                if let Some(c) = direct {
                    out.push((Packet::from_bytes(BytesMut::from(&packet[..])), c));
                }
                if let Some((at, header)) = relay {
                    let h = header.as_bytes();
                    let mut framed = BytesMut::with_capacity(h.len() + packet.len());
                    framed.extend_from_slice(h);
                    framed.extend_from_slice(&packet);
                    out.push((Packet::from_bytes(framed), at));
                }
                out
            }
            Some(Err(why)) => {
                self.relay.drop_one(why);
                Vec::new()
            }
        }
    }
}

impl UdpSend for Sender {
    type SendManyBuf = <UdpSocket as UdpSend>::SendManyBuf;

    async fn send_to(&self, packet: Packet, destination: SocketAddr) -> io::Result<()> {
        if !relay::is_relayed(&destination) {
            return self.inner.send_to(packet, destination).await;
        }
        for (p, to) in self.route(&self.relay.table(), packet, destination) {
            self.inner.send_to(p, to).await?;
        }
        Ok(())
    }

    fn max_number_of_packets_to_send(&self) -> usize {
        self.inner.max_number_of_packets_to_send()
    }

    async fn send_many_to(
        &self,
        buf: &mut Self::SendManyBuf,
        packets: &mut Vec<(Packet, SocketAddr)>,
    ) -> io::Result<()> {
        if !packets.iter().any(|(_, to)| relay::is_relayed(to)) {
            return self.inner.send_many_to(buf, packets).await;
        }
        // Relayed ones go to the relay, which may be of the other family: one at a time.
        let table = self.relay.table();
        let mut direct = Vec::with_capacity(packets.len());
        for (p, to) in packets.drain(..) {
            if !relay::is_relayed(&to) {
                direct.push((p, to));
            } else {
                for (p, to) in self.route(&table, p, to) {
                    self.inner.send_to(p, to).await?;
                }
            }
        }
        if direct.is_empty() {
            return Ok(());
        }
        let sent = self.inner.send_many_to(buf, &mut direct).await;
        packets.append(&mut direct);
        sent
    }

    fn local_addr(&self) -> io::Result<Option<SocketAddr>> {
        UdpSend::local_addr(&self.inner)
    }

    fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        self.inner.set_fwmark(mark)
    }
}

/// gotatun's receiving half: relay datagrams are forwarded or delivered here.
pub struct Receiver {
    inner: UdpSocket,
    /// The same socket, to forward from.
    tx: UdpSocket,
    relay: Arc<Relay>,
    /// The datagrams of one read that this gateway forwards.
    forward: Vec<(Packet, SocketAddr)>,
    send_buf: <UdpSocket as UdpSend>::SendManyBuf,
}

impl Receiver {
    /// Acts on the rules for each datagram of `packets[from..]`, in order: keeps what gotatun
    /// gets (delivered ones stripped of the header), moves what is forwarded (its header
    /// rewritten) to `self.forward`, drops the rest.
    fn sort(&mut self, packets: &mut Vec<(Packet, SocketAddr)>, from: usize) {
        let relay = &self.relay;
        let mut table = None;
        let taken = packets.extract_if(from.., |(p, src)| {
            // Anything but a relay header (its first byte 0xf1 or 0xf2) is gotatun's.
            if p.len() < HEADER || p[0] & 0xf0 != 0xf0 {
                return false;
            }
            match table.get_or_insert_with(|| relay.table()).inbound(p, *src) {
                Inbound::Pass => false,
                Inbound::Deliver { from, strip, seen } => {
                    p.buf_mut().advance(strip);
                    *src = from;
                    if let Some((id, at)) = seen {
                        relay.learn(id, at);
                    }
                    relay.delivered.fetch_add(1, Ordering::Relaxed);
                    false
                }
                Inbound::Forward { to, header } => {
                    let h = header.as_bytes();
                    if h.len() == HEADER {
                        // Data: the header rewritten in place.
                        p.buf_mut()[..HEADER].copy_from_slice(h);
                    } else {
                        // A handshake, with where this relay saw its sender: a new buffer.
                        let mut framed = BytesMut::with_capacity(h.len() + p.len() - HEADER);
                        framed.extend_from_slice(h);
                        framed.extend_from_slice(&p[HEADER..]);
                        *p = Packet::from_bytes(framed);
                    }
                    *src = to;
                    true
                }
                Inbound::Drop(why) => {
                    relay.drop_one(why);
                    // Taken, and left empty: not forwarded.
                    p.truncate(0);
                    true
                }
            }
        });
        self.forward.extend(taken.filter(|(p, _)| !p.is_empty()));
    }

    /// Sends what this read forwards: in one `sendmmsg` when they fit one and are of one
    /// family, else one by one. A full send buffer loses datagrams as the network would;
    /// WireGuard resends.
    async fn send_forwarded(&mut self) {
        let n = self.forward.len();
        if n == 0 {
            return;
        }
        let one_family = self
            .forward
            .iter()
            .all(|(_, to)| to.is_ipv4() == self.forward[0].1.is_ipv4());
        if n > 1 && one_family && n <= self.tx.max_number_of_packets_to_send() {
            if self
                .tx
                .send_many_to(&mut self.send_buf, &mut self.forward)
                .await
                .is_err()
            {
                self.forward.clear();
            }
        } else {
            for (p, to) in self.forward.drain(..) {
                let _ = self.tx.send_to(p, to).await;
            }
        }
        self.relay.forwarded.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl UdpRecv for Receiver {
    type RecvManyBuf = <UdpSocket as UdpRecv>::RecvManyBuf;

    async fn recv_from(&mut self, pool: &mut PacketBufPool) -> io::Result<(Packet, SocketAddr)> {
        loop {
            let mut one = vec![self.inner.recv_from(pool).await?];
            self.sort(&mut one, 0);
            self.send_forwarded().await;
            if let Some(kept) = one.pop() {
                return Ok(kept);
            }
        }
    }

    async fn recv_many_from(
        &mut self,
        buf: &mut Self::RecvManyBuf,
        pool: &mut PacketBufPool,
        packets: &mut Vec<(Packet, SocketAddr)>,
    ) -> io::Result<()> {
        let from = packets.len();
        loop {
            self.inner.recv_many_from(buf, pool, packets).await?;
            self.sort(packets, from);
            self.send_forwarded().await;
            if packets.len() > from {
                return Ok(());
            }
        }
    }

    fn enable_udp_gro(&self) -> io::Result<()> {
        self.inner.enable_udp_gro()
    }
}
