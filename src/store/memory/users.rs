//! The per-user limit in the memory store: one user's counted requests, as user_claim.lua and
//! user_finish.lua keep them in the user record.

use super::{HashMap, ms};
use crate::ids::RequestId;
use crate::store::{ReqArgs, RequestKind, StaleEntry, UserClaim, UserFinish};
use std::time::Instant;

/// An entry's state: the `P` / `R` / `S` letter of a user entry (see the tables in
/// [`crate::store::redis::lua`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    Pending,
    Reserved,
    Sold,
}

/// One counted request of a user (an entry of user_claim.lua's user record).
#[derive(Debug, Clone)]
struct Entry {
    qty: u64,
    state: EntryState,
    /// Pending: when it may be verified.
    until: Instant,
    kind: RequestKind,
    /// Pending: the attempts that joined it and have not released it (user_claim.lua).
    attempts: Vec<u64>,
}

/// A user's counted requests by request id.
#[derive(Debug, Default)]
pub(super) struct UserRecord(HashMap<RequestId, Entry>);

impl UserRecord {
    /// user_claim.lua
    pub(super) fn claim(
        &mut self,
        req: &ReqArgs<'_>,
        limit: u64,
        claim_ttl_ms: u64,
        now: Instant,
    ) -> UserClaim {
        let entries = &mut self.0;
        if let Some(e) = entries.get_mut(req.request_id) {
            return if e.qty != req.qty {
                UserClaim::Mismatch("qty")
            } else if e.kind != req.kind {
                UserClaim::Mismatch("kind")
            } else {
                if e.state == EntryState::Pending && req.attempt != 0 {
                    // A twin joins (see user_claim.lua).
                    if !e.attempts.contains(&req.attempt) {
                        e.attempts.push(req.attempt);
                    }
                }
                UserClaim::Dup {
                    sold: e.state == EntryState::Sold,
                }
            };
        }
        let used: u64 = entries.values().map(|e| e.qty).sum();
        if used + req.qty > limit {
            let mut stale: Vec<StaleEntry> = entries
                .iter()
                .filter(|(_, e)| {
                    (e.state == EntryState::Pending && e.until < now)
                        || e.state == EntryState::Reserved
                })
                .map(|(r, e)| StaleEntry {
                    request_id: r.clone(),
                    qty: e.qty,
                    reserved: e.state == EntryState::Reserved,
                    kind: e.kind,
                })
                .collect();
            stale.sort();
            let sum = |f: &dyn Fn(&Entry) -> bool| -> u64 {
                entries.values().filter(|e| f(e)).map(|e| e.qty).sum()
            };
            return UserClaim::Limit {
                used,
                final_used: sum(&|e| e.state == EntryState::Sold),
                fresh_pending: sum(&|e| e.state == EntryState::Pending && e.until >= now),
                stale,
            };
        }
        entries.insert(
            req.request_id.clone(),
            Entry {
                qty: req.qty,
                state: EntryState::Pending,
                until: now + ms(claim_ttl_ms),
                kind: req.kind,
                attempts: if req.attempt == 0 {
                    Vec::new()
                } else {
                    vec![req.attempt]
                },
            },
        );
        UserClaim::Ok
    }

    /// user_finish.lua "void": removes `rid`'s entry.
    pub(super) fn remove(&mut self, rid: &RequestId) {
        self.0.remove(rid);
    }

    /// user_finish.lua "release": `attempt` sold nothing; a pending entry goes when no attempt
    /// of its request is left.
    pub(super) fn release(&mut self, rid: &RequestId, attempt: u64) {
        let Some(e) = self.0.get_mut(rid) else { return };
        if e.state != EntryState::Pending {
            return; // a twin sold or reserved: it counts
        }
        e.attempts.retain(|a| *a != attempt);
        if e.attempts.is_empty() {
            self.0.remove(rid);
        }
    }

    /// user_finish.lua "sold" / "reserved": writes `req`'s entry, even when it is missing (see
    /// user_finish.lua).
    pub(super) fn finish(&mut self, req: &ReqArgs<'_>, how: UserFinish, now: Instant) {
        let state = if how == UserFinish::Sold {
            EntryState::Sold
        } else {
            EntryState::Reserved
        };
        self.0.insert(
            req.request_id.clone(),
            Entry {
                qty: req.qty,
                state,
                until: now,
                kind: req.kind,
                attempts: Vec::new(),
            },
        );
    }
}
