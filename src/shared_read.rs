//! Shared reads: many concurrent callers of one read, one read per round trip.
//!
//! In a flash sale most requests arrive after the stock is gone, and each must confirm "sold
//! out" from a fresh read of every segment (hints never answer). Done naively that is one
//! N-segment read per request. A [`SharedRead`] lets a caller *join the next read that starts
//! after it asked*: the answer is then exactly as fresh as a read of its own, so nothing
//! stale is ever served, yet a storm of callers costs one read per round trip.
//!
//! (Not to be confused with request coalescing in the Redis store, which batches many
//! deductions into one script call. The shared read here is a survey: it may write — it
//! returns expired reservations — but what it answers is a read.)

use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

type Waiter<T> = oneshot::Sender<Option<Arc<T>>>;

struct State<T> {
    running: bool,
    waiting: Vec<Waiter<T>>,
}

/// One shared read of one thing (here: all segments of one SKU).
pub(crate) struct SharedRead<T> {
    state: Mutex<State<T>>,
}

impl<T> std::fmt::Debug for SharedRead<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedRead")
    }
}

/// Resets the shared read if the reading task ends in any way (including a panic or runtime
/// shutdown): waiters see a closed channel and read on their own.
struct Leader<T>(Arc<SharedRead<T>>);

impl<T> Drop for Leader<T> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        if st.running {
            st.running = false;
            st.waiting.clear();
        }
    }
}

impl<T> SharedRead<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Send + Sync + 'static> SharedRead<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                running: false,
                waiting: Vec::new(),
            }),
        })
    }

    /// Waits for a read that started after this call, run by a background task with `read`.
    /// `None` when that read failed (or the task could not run): the caller should read on its
    /// own, so that it gets the real error.
    pub(crate) async fn join<F, Fut>(self: &Arc<Self>, read: F) -> Option<Arc<T>>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Option<T>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut st = self.lock();
            st.waiting.push(tx);
            !std::mem::replace(&mut st.running, true)
        };
        if lead {
            let leader = Leader(Arc::clone(self));
            tokio::spawn(async move {
                loop {
                    // Everyone in this batch asked before this read starts.
                    let batch = {
                        let mut st = leader.0.lock();
                        if st.waiting.is_empty() {
                            st.running = false; // under the lock: the next caller leads
                            break;
                        }
                        std::mem::take(&mut st.waiting)
                    };
                    let value = read().await.map(Arc::new);
                    for w in batch {
                        let _ = w.send(value.clone());
                    }
                }
            });
        }
        rx.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_callers_share_few_reads_and_each_read_starts_after_its_callers() {
        let group = SharedRead::<(u64, u64)>::new();
        let clock = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let callers = (0..200).map(|_| {
            let (group, clock, reads) = (group.clone(), clock.clone(), reads.clone());
            tokio::spawn(async move {
                let asked = clock.fetch_add(1, Ordering::SeqCst);
                let got = group
                    .join(move || {
                        let (clock, reads) = (clock.clone(), reads.clone());
                        async move {
                            reads.fetch_add(1, Ordering::SeqCst);
                            let started = clock.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            Some((started, 0))
                        }
                    })
                    .await
                    .unwrap();
                assert!(
                    got.0 > asked,
                    "served a read that started before the caller asked"
                );
            })
        });
        for c in futures::future::join_all(callers).await {
            c.unwrap();
        }
        let n = reads.load(Ordering::SeqCst);
        assert!(n < 100, "{n} reads for 200 callers");
    }

    #[tokio::test]
    async fn a_failed_read_tells_callers_to_read_themselves() {
        let group = SharedRead::<u8>::new();
        assert_eq!(group.join(|| async { None }).await, None);
        // The shared read recovers for the next caller.
        assert_eq!(group.join(|| async { Some(7) }).await.as_deref(), Some(&7));
    }
}
