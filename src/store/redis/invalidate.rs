//! The stock-notification subscriber: one extra connection per store, subscribed to
//! `<prefix>:stock`, where every script that makes units sellable again publishes after its
//! writes (`stock_event` in `prelude.lua`: restock, load, cancel, expiry, a transfer credited).
//! Each message bumps its SKU's counter in the store's [`Watch`]; a connection error, a lagging
//! receiver or a resubscription voids every snapshot (messages may have been lost), so the
//! engine's sold-out flags fall until the next fresh read. Not started on a cluster (flags stay
//! off).

pub(crate) use crate::store::watch::Event;
use crate::store::watch::Watch;
use fred::prelude::{Client, ClientLike, EventInterface, PubsubInterface};
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;

/// The channel of key prefix `prefix`.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:stock")
}

/// Parses `<kind> <gen> <key>` (the key's hash tag starts with the SKU, up to `#` or `}`).
/// The scripts send `S` (restocked, loaded), `M` (units moved in by a transfer's credit: they
/// may be sellable where a flag saw none, but no unit went back), `R` (units returned) and
/// `L` (ready).
fn parse(text: &str) -> Option<(String, Event, u64)> {
    let mut it = text.splitn(3, ' ');
    let kind = it.next()?;
    let generation = it.next()?.parse().ok()?;
    let key = it.next()?;
    let event = match kind {
        "S" | "M" => Event::Added,
        "R" => Event::Returned,
        "L" => Event::Loaded,
        _ => return None,
    };
    let tag = key.split_once('{')?.1;
    let sku = &tag[..tag.find(['#', '}'])?];
    Some((sku.to_owned(), event, generation))
}

/// A running subscriber: dropped with the last clone of its store, it disconnects.
#[derive(Debug)]
pub(crate) struct Subscriber {
    pub(crate) watch: Arc<Watch>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts the subscriber on a new connection like `like`'s; its watch is down until the
/// first `SUBSCRIBE` succeeded. A Redis user without the channel right never comes up.
pub(crate) async fn start(like: &Client, prefix: &str) -> Subscriber {
    let watch = Arc::new(Watch::default());
    let (stop_tx, mut stop) = tokio::sync::oneshot::channel::<()>();
    // Like `like`, with room for bursts of messages (every credit and reclaim publishes one): a
    // lagging receiver loses messages, which ends the flags of every SKU's generation.
    let mut perf = like.perf_config();
    perf.broadcast_channel_capacity = 1 << 16;
    let client = Client::new(
        like.client_config(),
        Some(perf),
        Some(like.connection_config().clone()),
        like.client_reconnect_policy(),
    );
    let channel = channel(prefix);
    let (mut messages, mut errors, mut reconnects) = (
        client.message_rx(),
        client.error_rx(),
        client.reconnect_rx(),
    );
    if client.init().await.is_ok() {
        // fred reports the first connection as a reconnection too: not a loss (handled later,
        // it would void a load seen meanwhile).
        while reconnects.try_recv().is_ok() {}
        if client.subscribe(&channel).await.is_ok() {
            watch.up();
        }
    }
    let w = Arc::clone(&watch);
    tokio::spawn(async move {
        loop {
            // Connection events first: a message read after a loss must not count as seen
            // before it.
            tokio::select! {
                biased;
                _ = &mut stop => break,
                e = errors.recv() => match e {
                    Ok(_) | Err(RecvError::Lagged(_)) => w.down(),
                    Err(RecvError::Closed) => break,
                },
                r = reconnects.recv() => match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        w.down();
                        // Inline, so an error after this subscription succeeded is handled
                        // after the `up` (messages wait in the receiver meanwhile, or lag).
                        if client.subscribe(&channel).await.is_ok() {
                            w.up();
                        }
                    }
                    Err(RecvError::Closed) => break,
                },
                m = messages.recv() => match m {
                    Ok(m) => {
                        if let Some((sku, event, generation)) =
                            m.value.as_str().as_deref().and_then(parse)
                        {
                            w.notify(&sku, event, generation);
                        }
                    }
                    Err(RecvError::Lagged(_)) => w.lost(),
                    Err(RecvError::Closed) => break,
                },
            }
        }
        w.down();
        let _ = client.quit().await;
    });
    Subscriber {
        watch,
        _stop: stop_tx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse() {
        let p = parse;
        assert_eq!(
            p("S 12 ss:{phone#3}:seg"),
            Some(("phone".into(), Event::Added, 12))
        );
        assert_eq!(
            p("R 5 a:b:{x-1#0.7}:seg"),
            Some(("x-1".into(), Event::Returned, 5))
        );
        assert_eq!(
            p("L 9 ss:{phone}:meta"),
            Some(("phone".into(), Event::Loaded, 9))
        );
        assert_eq!(
            p("M 9 ss:{phone#1}:seg"),
            Some(("phone".into(), Event::Added, 9))
        );
        assert_eq!(p("X 9 ss:{phone#1}:g9:rq:r-7"), None);
        assert_eq!(p("Q 9 ss:{phone}:meta"), None);
        assert_eq!(p("L x ss:{phone}:meta"), None);
        assert_eq!(p("L 9 nokey"), None);
    }
}
