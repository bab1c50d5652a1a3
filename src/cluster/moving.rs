//! Slots in motion: commands whose slot is being moved (resharding) or just moved (failover,
//! resharding done) are tried again here, not inside fred.
//!
//! fred 10.1 follows `MOVED` well (it refreshes the slot map, then re-sends), but not `ASK`:
//! it writes `ASKING` on the target's connection and takes the *next reply on that connection*
//! as `ASKING`'s, while other commands are in flight there. Replies then go to the wrong
//! callers (a sale answered with another request's reply, or with `ASKING`'s `+OK`) and the
//! client stalls (`Routing: Max attempts reached`, then timeouts for good). Found by
//! `tests/it/cluster.rs` (`resharding_with_requests_in_flight`, `fred_follows_an_ask_redirection`).
//!
//! So the store's clients follow no redirection themselves (`max_redirections = 0`): on `MOVED`
//! fred still refreshes its slot map and then answers "Too many redirections"; on `ASK` it
//! answers that at once, before writing `ASKING`. [`follow`] sends the command again, after a
//! short pause, until the slot has settled: `MOVED` → the new owner at once (the map is fresh);
//! `ASK` (the key already moved, the slot not yet reassigned) → again until the migration ends
//! and the source answers `MOVED`. `TRYAGAIN` (a script's keys split between source and target
//! mid-migration) is waited out the same way.
//!
//! Sending again is safe: a redirected or `TRYAGAIN` command did not run. (And every script is
//! exactly-once by request id anyway.)
//!
//! A loop around any fred call (the store's scripts, the outbox's commands, the lock's `SET`):
//! it touches nothing of the crate.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a command keeps being sent again while its slot moves. A slot of a few hundred
/// keys moves in milliseconds; a stuck migration (an operator's tool died half-way) ends in
/// the error, which is retryable.
const PATIENCE: Duration = Duration::from_secs(10);

/// True for the answers that mean "not run here, try again": a redirection fred did not follow
/// (see the module docs) or `TRYAGAIN`.
pub(crate) fn is_in_motion(e: &fred::error::Error) -> bool {
    (*e.kind() == fred::error::ErrorKind::Routing && e.details().contains("Too many redirections"))
        || e.details().starts_with("TRYAGAIN")
}

/// Runs `send` until it answers something other than [`is_in_motion`], pausing 1 ms, 2 ms, …
/// up to 50 ms in between, for at most [`PATIENCE`].
pub(crate) async fn follow<T, F, Fut>(mut send: F) -> Result<T, fred::error::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, fred::error::Error>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match send().await {
            Err(e) if is_in_motion(&e) && start.elapsed() < PATIENCE => {
                tracing::debug!(error = %e, "slot in motion; sending again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}
