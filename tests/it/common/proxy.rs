//! A TCP proxy between a client and Redis that partitions the link on demand: the in-process
//! stand-in for `iptables -j DROP` on one client's traffic (no network namespace, no root).
//!
//! Two kinds of partition, both healed by [`Proxy::heal`]:
//! - [`Partition::Hold`]: bytes stop moving in both directions and are delivered when the link
//!   heals — what TCP does when a partition ends before its retransmissions give up. Commands
//!   a client timed out on still run, late.
//! - [`Partition::Cut`]: bytes stop moving and every connection open during the partition is
//!   closed at the heal without delivering what was held — the partition outlived the
//!   retransmissions. A command may have run with its reply lost, or never have arrived.
//!
//! New connections made during a partition are accepted and held like the others.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a partition treats the bytes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// Delivered when the link heals.
    Hold,
    /// Dropped with their connections when the link heals.
    Cut,
}

const PASS: u8 = 0;
const HOLD: u8 = 1;
const CUT: u8 = 2;

struct State {
    mode: AtomicU8,
    /// Bumped when a cut heals: connections opened before it close.
    epoch: AtomicU64,
}

/// A running proxy; stops accepting when dropped (open connections end with their peers).
pub struct Proxy {
    pub port: u16,
    upstream: u16,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            mode: AtomicU8::new(PASS),
            epoch: AtomicU64::new(0),
        });
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let st = st.clone();
                // The epoch at accept: a connection made during a cut is cut at its heal, even
                // when its upstream connect finishes after it.
                let epoch = st.epoch.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Either direction ending (EOF, error, cut) ends both.
                    tokio::select! {
                        _ = pump(cr, sw, &st, epoch) => {}
                        _ = pump(sr, cw, &st, epoch) => {}
                    }
                });
            }
        });
        Self {
            port,
            upstream,
            state,
            accept,
        }
    }

    /// `url` (a store URL of the upstream server: its scheme, user and password kept, so
    /// TLS and the ACL user go through the proxy too) pointed at the proxy instead.
    pub fn reroute(&self, url: &str) -> String {
        let (from, to) = (format!(":{}", self.upstream), format!(":{}", self.port));
        assert!(
            url.contains(&from),
            "{url} is not a URL of port {}",
            self.upstream
        );
        url.replace(&from, &to)
    }

    /// Starts a partition.
    pub fn partition(&self, how: Partition) {
        let m = match how {
            Partition::Hold => HOLD,
            Partition::Cut => CUT,
        };
        self.state.mode.store(m, Ordering::SeqCst);
    }

    /// Ends the partition: held bytes move again, or (after a cut) the connections that were
    /// open close.
    pub fn heal(&self) {
        if self.state.mode.load(Ordering::SeqCst) == CUT {
            self.state.epoch.fetch_add(1, Ordering::SeqCst);
        }
        self.state.mode.store(PASS, Ordering::SeqCst);
    }
}

impl Proxy {
    /// A nemesis loop: until `stop`, waits 0.3–1 s, partitions the link for a random time in
    /// `len_ms` (holding and cutting in turn), calls `before_heal`, heals. Returns how many
    /// partitions it made; the link is healed when it returns.
    pub async fn partition_repeatedly(
        &self,
        stop: &AtomicBool,
        len_ms: RangeInclusive<u64>,
        mut before_heal: impl FnMut(),
    ) -> u64 {
        let mut rng = fastrand::Rng::new();
        for k in 0..200 {
            let until = tokio::time::Instant::now() + Duration::from_millis(rng.u64(300..1000));
            while tokio::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if stop.load(Ordering::Relaxed) {
                return k;
            }
            self.partition(if k % 2 == 0 {
                Partition::Hold
            } else {
                Partition::Cut
            });
            tokio::time::sleep(Duration::from_millis(rng.u64(len_ms.clone()))).await;
            before_heal();
            self.heal();
        }
        200
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to` while the link passes; holds each chunk while partitioned; returns
/// when either side ends or a cut this connection lived through healed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: &State,
    epoch: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let cut = || st.epoch.load(Ordering::SeqCst) != epoch;
    loop {
        // Wake up now and then to notice a cut while idle.
        let n = match tokio::time::timeout(Duration::from_millis(20), from.read(&mut buf)).await {
            Err(_) if cut() => return,
            Err(_) => continue,
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        while st.mode.load(Ordering::SeqCst) != PASS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if cut() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
