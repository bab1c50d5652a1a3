//! One store kind of a case: two engines sharing one store, the SKU, the model of what their
//! answers promised, and a transcript. [`World::step`] runs one [`Act`]; its engine calls and
//! what they tell the model are in [`calls`], the simulated crashes in [`crash`], the checks
//! after every step and at the end of a case in [`check`].

use super::act::Act;
use super::model::*;
use super::{
    AUTO_WAIT_AFTER, BUSY_POLL, CRASH_RESV_TTL_MS, SHORTEST_TIMER, SWEEP_GRACE, TIMER_MARGIN, WAIT,
};
use shardstock::*;
use std::time::{Duration, Instant};

mod calls;
mod check;
mod crash;

/// One store kind: two engines sharing one store, the SKU of this case and the model.
pub struct World<S: Store> {
    pub label: &'static str,
    pub engines: [Engine<S>; 2],
    pub name: String,
    pub sku: Sku,
    /// Generations seen, for normalising (after issue 11 they are large clock-based numbers
    /// that differ between stores).
    pub gens: Vec<u64>,
    pub m: Model,
    pub sent: Vec<Sent>,
    /// Reservation ids answered so far (raw).
    pub resv_ids: Vec<String>,
    pub log: Vec<String>,
    pub bad: Vec<String>,
    pub cancellation: bool,
    /// Dropped calls so far (their request ids).
    pub drops: u32,
}

/// What one step did in one world.
pub struct Out {
    pub line: String,
    /// The step may have started a timer (reservation, lease, pending entry).
    pub timers: bool,
}

impl<S: Store> World<S> {
    pub fn new(
        label: &'static str,
        engines: [Engine<S>; 2],
        name: &str,
        cancellation: bool,
    ) -> Self {
        Self {
            label,
            engines,
            name: name.to_string(),
            sku: Sku::new(name).unwrap(),
            gens: Vec::new(),
            m: Model::default(),
            sent: Vec::new(),
            resv_ids: Vec::new(),
            log: Vec::new(),
            bad: Vec::new(),
            cancellation,
            drops: 0,
        }
    }

    pub(super) fn e(&self, i: u8) -> Engine<S> {
        self.engines[usize::from(i % 2)].clone()
    }

    pub(super) fn req(&self, user: u8, qty: u64, rid: u8) -> Deduct {
        let rid = format!("g{}-r{rid}", self.m.loads);
        Deduct::new(&self.name, &format!("u{user}"), qty, &rid).unwrap()
    }

    fn gen_name(&mut self, g: u64) -> String {
        match self.gens.iter().position(|x| *x == g) {
            Some(i) => format!("G{}", i + 1),
            None => {
                self.gens.push(g);
                format!("G{}", self.gens.len())
            }
        }
    }

    /// `<sku>~<generation>~<segment>~<rid>` with the generation normalised.
    fn norm_id(&mut self, id: &str) -> String {
        let p: Vec<&str> = id.splitn(4, '~').collect();
        match p[..] {
            [sku, g, seg, rid] => match g.parse() {
                Ok(g) => format!("{sku}~{}~{seg}~{rid}", self.gen_name(g)),
                Err(_) => id.to_string(),
            },
            _ => id.to_string(),
        }
    }

    fn show_reserved(&mut self, r: &Result<Reserved>) -> String {
        match r {
            Ok(Reserved::Held { id, parts }) => {
                format!("Held {} {parts:?}", self.norm_id(&id.to_string()))
            }
            Ok(Reserved::Replayed { id, parts }) => {
                format!("Replayed {} {parts:?}", self.norm_id(&id.to_string()))
            }
            other => format!("{other:?}"),
        }
    }

    fn note(&mut self, v: Option<String>) {
        if let Some(v) = v {
            self.bad.push(v);
        }
    }

    fn check_error<T: std::fmt::Debug>(&mut self, what: &str, r: &Result<T>) {
        if let Err(e @ (Error::Protocol(_) | Error::Redis(_))) = r {
            self.bad.push(format!("[error] {what}: {e:?}"));
        }
    }

    /// Notes a refusal as a conflict: a possible cause of a later lockout.
    fn conflicted<T>(&mut self, d: &Deduct, r: &Result<T>) {
        if let Err(Error::RequestIdConflict { .. }) = r {
            self.m.cause("conflict", d.user.as_str());
        }
    }

    /// Runs one op; returns its transcript line.
    pub async fn step(&mut self, act: &Act) -> Out {
        let mut timers = false;
        let line = match act {
            Act::Load {
                e,
                total,
                segments,
                limit,
            } => {
                let r = self
                    .e(*e)
                    .load(
                        &self.sku,
                        *total,
                        LoadOptions::new(*segments)
                            .replace(true)
                            .per_user_limit(*limit),
                    )
                    .await;
                self.check_error("load", &r);
                self.m.reload(*total, *limit);
                match r {
                    Ok(g) => format!("load {}", self.gen_name(g)),
                    Err(e) => format!("load {e:?}"),
                }
            }
            Act::Deduct { e, user, qty, rid } => {
                let d = self.req(*user, *qty, *rid);
                self.sent.push(Sent {
                    d: d.clone(),
                    kind: Kind::Sale,
                    ttl_ms: 0,
                });
                self.sale(*e, &d, "deduct").await
            }
            Act::Reserve {
                e,
                user,
                qty,
                rid,
                ttl_ms,
            } => {
                timers = true;
                let d = self.req(*user, *qty, *rid);
                self.sent.push(Sent {
                    d: d.clone(),
                    kind: Kind::Resv,
                    ttl_ms: *ttl_ms,
                });
                self.reserve(*e, &d, *ttl_ms, "reserve").await
            }
            Act::Confirm { e, nth } => match self.end(*e, *nth, true).await {
                Some(l) => l,
                None => return Out::skip(),
            },
            Act::Cancel { e, nth } => match self.end(*e, *nth, false).await {
                Some(l) => l,
                None => return Out::skip(),
            },
            Act::Replay { e, nth } | Act::Conflict { e, nth } | Act::OtherUser { e, nth, .. } => {
                if self.sent.is_empty() {
                    return Out::skip();
                }
                let s = self.sent[back(*nth, self.sent.len())].clone();
                let mut d = s.d.clone();
                let what = match act {
                    Act::Replay { .. } => "replay",
                    Act::Conflict { .. } => {
                        d.qty = d.qty % 3 + 1;
                        "conflict"
                    }
                    Act::OtherUser { user, .. } => {
                        let mut u = format!("u{user}");
                        if u == d.user.as_str() {
                            u = format!("u{}", (user + 1) % 3);
                        }
                        d.user = UserId::new(u).unwrap();
                        "other-user"
                    }
                    _ => unreachable!(),
                };
                timers = s.kind == Kind::Resv;
                let line = self.resend(*e, &d, s.kind, s.ttl_ms, what).await;
                format!("{line} [{} {} x{}]", d.request_id, d.user, d.qty)
            }
            Act::OtherKind { e, nth, ttl_ms } => {
                if self.sent.is_empty() {
                    return Out::skip();
                }
                let s = self.sent[back(*nth, self.sent.len())].clone();
                timers = true;
                let (kind, what) = match s.kind {
                    Kind::Sale => (Kind::Resv, "other-kind reserve"),
                    Kind::Resv => (Kind::Sale, "other-kind deduct"),
                };
                let line = self.resend(*e, &s.d, kind, *ttl_ms, what).await;
                format!("{line} [{} {} x{}]", s.d.request_id, s.d.user, s.d.qty)
            }
            Act::Restock { e, qty, rid } => {
                let id = RequestId::new(format!("g{}-s{rid}", self.m.loads)).unwrap();
                let r = self.e(*e).restock(&self.sku, *qty, &id).await;
                self.check_error("restock", &r);
                if let Ok(Restocked { added, .. }) = &r {
                    self.m.restocked += added;
                }
                format!("restock {r:?}")
            }
            Act::CrashClaim { .. }
            | Act::CrashSold { .. }
            | Act::CrashResv { .. }
            | Act::CrashFallback { .. } => {
                timers = true;
                self.crash(act).await
            }
            Act::Wait => {
                tokio::time::sleep(WAIT).await;
                self.m.after_wait();
                "wait".to_string()
            }
            Act::Expire => return self.expire().await,
            Act::Drop {
                e,
                user,
                qty,
                us,
                resv,
            } => {
                timers = true;
                self.dropped(*e, *user, *qty, *us, *resv).await
            }
        };
        // Anything refused or in flight may leave a pending entry or claim behind.
        timers |= line.contains("Err(") || line.contains("InFlight") || line.contains("UserBusy");
        Out { line, timers }
    }
}

impl Out {
    fn skip() -> Self {
        Out {
            line: String::new(),
            timers: false,
        }
    }
}

/// Index of the `nth` latest of `len` items (0: the latest), so shrinking keeps the target.
fn back(nth: usize, len: usize) -> usize {
    len - 1 - nth % len
}
