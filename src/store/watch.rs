//! Stock notifications as the engine sees them: per SKU, a counter bumped by every message
//! saying units may be sellable again, and a connection epoch bumped whenever messages may
//! have been lost. The engine's sold-out flags (`engine/sold_out.rs`) hold a [`Seen`] and are
//! believed only while it is still current. A store with notifications (Redis:
//! `redis/invalidate.rs`) feeds a [`Watch`]; the others have none, and keep no flags.

use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// What one notification says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Units were added (restock) or a generation's segment was (re)written.
    Added,
    /// Units went back to stock (refund, cancel, expired reservation).
    Returned,
    /// The generation became ready (load committed).
    Loaded,
}

/// The hash the engine and the watch both key request ids by (a collision only sends an id
/// to its record).
pub(crate) fn id_hash(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// The notifications of every SKU, fed by one subscriber connection.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// Odd while the subscriber is subscribed; bumped on every loss of messages (disconnect,
    /// lagging) and every resubscription, so a [`Seen`] from before never matches again.
    conn: AtomicU64,
    skus: DashMap<String, Arc<SkuWatch>>,
}

/// One SKU's notifications.
#[derive(Debug, Default)]
pub(crate) struct SkuWatch {
    /// Bumped by every message about the SKU (after `load` is updated).
    epoch: AtomicU64,
    load: Mutex<LoadSeen>,
}

/// The last load of the SKU this subscriber saw, and whether units went back since.
#[derive(Debug, Default, Clone, Copy)]
struct LoadSeen {
    generation: u64,
    /// The connection epoch it arrived in (a later epoch may have missed messages).
    conn: u64,
    /// No `Returned` message for this generation since.
    clean: bool,
}

/// A moment of a SKU's notifications: equal snapshots mean no message arrived and none can
/// have been lost in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    conn: u64,
    epoch: u64,
}

impl Watch {
    /// The SKU's notifications (created on first use).
    pub(crate) fn sku(&self, sku: &str) -> Arc<SkuWatch> {
        if let Some(w) = self.skus.get(sku) {
            return Arc::clone(&w);
        }
        Arc::clone(self.skus.entry(sku.to_owned()).or_default().value())
    }

    /// Counts one message.
    pub(crate) fn notify(&self, sku: &str, event: Event, generation: u64) {
        let w = self.sku(sku);
        {
            let mut l = w.load.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                Event::Loaded => {
                    *l = LoadSeen {
                        generation,
                        conn: self.conn.load(SeqCst),
                        clean: true,
                    };
                }
                Event::Returned if l.generation == generation => l.clean = false,
                _ => {}
            }
        }
        w.epoch.fetch_add(1, SeqCst);
    }

    /// Messages may have been lost (disconnected, lagging): every [`Seen`] taken before is
    /// void, and no flag is set until [`up`](Self::up).
    pub(crate) fn down(&self) {
        let c = self.conn.load(SeqCst);
        if c % 2 == 1 {
            self.conn.store(c + 1, SeqCst);
        }
    }

    /// Subscribed again: messages flow from here on.
    pub(crate) fn up(&self) {
        self.down();
        self.conn.fetch_add(1, SeqCst);
    }

    /// Lost messages while staying subscribed (the receiver lagged).
    pub(crate) fn lost(&self) {
        self.down();
        self.up();
    }

    /// `sku`'s notifications now, bound to this watch's connection.
    pub(crate) fn seen(&self, w: &SkuWatch) -> Option<Seen> {
        let conn = self.conn.load(SeqCst);
        let epoch = w.epoch.load(SeqCst);
        // The connection epoch again: a loss between the two reads voids the snapshot.
        (conn % 2 == 1 && self.conn.load(SeqCst) == conn).then_some(Seen { conn, epoch })
    }

    /// True when this subscriber saw generation `generation` become ready, in connection
    /// epoch `seen`'s, and no units of it went back since.
    pub(crate) fn clean_since_load(&self, w: &SkuWatch, generation: u64, seen: Seen) -> bool {
        let l = *w.load.lock().unwrap_or_else(|e| e.into_inner());
        l.generation == generation && l.conn == seen.conn && l.clean
    }
}

/// A store's notifications for one SKU: the hub and the SKU's counters.
#[derive(Debug, Clone)]
pub struct StockWatch {
    pub(crate) hub: Arc<Watch>,
    pub(crate) sku: Arc<SkuWatch>,
}

impl StockWatch {
    /// The SKU's notifications now (`None` while not subscribed).
    pub(crate) fn seen(&self) -> Option<Seen> {
        self.hub.seen(&self.sku)
    }

    /// See [`Watch::clean_since_load`].
    pub(crate) fn clean_since_load(&self, generation: u64, seen: Seen) -> bool {
        self.hub.clean_since_load(&self.sku, generation, seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_losses_void_snapshots() {
        let hub = Arc::new(Watch::default());
        let w = StockWatch {
            sku: hub.sku("a"),
            hub: Arc::clone(&hub),
        };
        assert_eq!(w.seen(), None, "no subscriber: no snapshot");
        hub.up();
        let s = w.seen().unwrap();
        assert_eq!(w.seen(), Some(s));
        hub.notify("b", Event::Added, 1);
        assert_eq!(w.seen(), Some(s), "another SKU's message");
        hub.notify("a", Event::Added, 1);
        assert_ne!(w.seen(), Some(s));
        let s = w.seen().unwrap();
        hub.lost();
        assert_ne!(w.seen(), Some(s), "lagged: void");
        hub.down();
        assert_eq!(w.seen(), None);
    }

    #[test]
    fn clean_only_after_a_load_seen_and_until_a_return() {
        let hub = Arc::new(Watch::default());
        let w = StockWatch {
            sku: hub.sku("a"),
            hub: Arc::clone(&hub),
        };
        hub.up();
        assert!(!w.clean_since_load(7, w.seen().unwrap()), "load not seen");
        hub.notify("a", Event::Loaded, 7);
        assert!(w.clean_since_load(7, w.seen().unwrap()));
        assert!(
            !w.clean_since_load(8, w.seen().unwrap()),
            "other generation"
        );
        hub.notify("a", Event::Returned, 6);
        assert!(w.clean_since_load(7, w.seen().unwrap()), "older generation");
        hub.notify("a", Event::Returned, 7);
        assert!(!w.clean_since_load(7, w.seen().unwrap()));
        hub.notify("a", Event::Loaded, 8);
        let s = w.seen().unwrap();
        hub.notify("a", Event::Added, 8);
        assert_ne!(
            w.seen(),
            Some(s),
            "units moved or added void older snapshots"
        );
        assert!(
            w.clean_since_load(8, w.seen().unwrap()),
            "but nothing went back"
        );
        hub.lost();
        assert!(
            !w.clean_since_load(8, w.seen().unwrap()),
            "seen before a loss"
        );
    }
}
