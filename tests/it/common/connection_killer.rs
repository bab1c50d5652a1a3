//! Fault injection: client connections killed under a running test, the way a network blip or
//! a proxy restart would drop them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::redis_server::redis_cli;

/// Kills every normal client connection of the server on `port` (not redis-cli's own);
/// returns how many were killed.
pub fn kill_clients(port: u16) -> u64 {
    redis_cli(port, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .parse()
        .unwrap_or(0)
}

/// A thread killing every client connection of a server every ~5 ms, for at most `rounds`
/// rounds (bounded, so a test that forgets to stop it still ends), until stopped or dropped.
pub struct ConnectionKiller {
    stop: Arc<AtomicBool>,
    kills: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl ConnectionKiller {
    /// Starts killing the connections of the server on `port`.
    pub fn start(port: u16, rounds: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, kills) = (stop.clone(), kills.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    kills.fetch_add(kill_clients(port), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Self {
            stop,
            kills,
            thread: Some(thread),
        }
    }

    /// Stops the thread and waits for it; returns how many connections it killed in all.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.kills.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for ConnectionKiller {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop.store(true, Ordering::Relaxed);
            // Not `halt`: a join error must not panic again while a test is panicking.
            let _ = self.thread.take().map(JoinHandle::join);
        }
    }
}
