//! Simulated crashes: a process that dies part-way through a request, played with store-level
//! calls (`user_claim`, `deduct_home`, `take`) and then nothing.

use super::*;
use shardstock::segments::home;
use shardstock::store::{HomeReply, OnShort, ReqArgs, SegAddr, SegmentRole, TakeReply, UserClaim};

impl<S: Store> World<S> {
    /// A process dies part-way through a request: store-level calls, then nothing.
    pub(super) async fn crash(&mut self, act: &Act) -> String {
        let (e, user, qty, rid, part) = match *act {
            Act::CrashClaim { e, user, qty, rid }
            | Act::CrashSold { e, user, qty, rid }
            | Act::CrashResv { e, user, qty, rid } => (e, user, qty, rid, 0),
            Act::CrashFallback {
                e,
                user,
                qty,
                rid,
                part,
            } => (e, user, qty, rid, part),
            _ => unreachable!(),
        };
        let what = match act {
            Act::CrashClaim { .. } => "crash-claim",
            Act::CrashSold { .. } => "crash-sold",
            Act::CrashResv { .. } => "crash-resv",
            _ => "crash-fallback",
        };
        let eng = self.e(e);
        let store = eng.store();
        let sku = self.sku.clone();
        let d = self.req(user, qty, rid);
        let resv = matches!(act, Act::CrashResv { .. });
        let resv_ttl_ms = if resv { CRASH_RESV_TTL_MS } else { 0 };
        self.sent.push(Sent {
            d: d.clone(),
            kind: if resv { Kind::Resv } else { Kind::Sale },
            ttl_ms: resv_ttl_ms,
        });
        let meta = match store.meta(&sku).await {
            Ok(Some(m)) => m,
            other => return format!("{what}: meta {other:?}"),
        };
        let opts = eng.options();
        let args = ReqArgs {
            attempt: 0,
            request_id: &d.request_id,
            user: &d.user,
            qty,
            ttl_ms: opts.request_ttl.as_millis() as u64,
            lease_ms: opts.claim_lease.as_millis() as u64,
            resv_ttl_ms,
            kind: if resv {
                shardstock::store::RequestKind::Reservation
            } else {
                shardstock::store::RequestKind::Sale
            },
        };
        let mut log = what.to_string();
        if meta.user_limit > 0 {
            let claim_ttl = opts.user_claim_ttl.as_millis() as u64;
            let c = store
                .user_claim(&sku, meta.generation, args, meta.user_limit, claim_ttl)
                .await;
            match &c {
                Ok(UserClaim::Limit {
                    used,
                    final_used,
                    stale,
                    ..
                }) => {
                    let mut stale = stale.clone();
                    stale.sort();
                    log += &format!(" claim Limit {used}/{final_used} {stale:?}");
                }
                other => log += &format!(" claim {other:?}"),
            }
            self.check_error(what, &c);
            if !matches!(c, Ok(UserClaim::Ok | UserClaim::Dup { .. })) {
                return log;
            }
        } else if matches!(act, Act::CrashClaim { .. }) {
            return format!("{log}: no limit");
        }
        if meta.user_limit > 0 {
            let user = d.user.as_str();
            if resv {
                self.m.cause("crash-resv", user);
            } else {
                self.m.cause("pending", user);
                self.m.cause("crashed", user);
            }
        }
        if matches!(act, Act::CrashClaim { .. }) {
            return log;
        }
        let n = meta.segments;
        let h = home(&d.request_id, n);
        let at = |index| {
            SegAddr::new(&sku, meta.generation, index).with_suffix(meta.placement.suffix(index))
        };
        let fallback = matches!(act, Act::CrashFallback { .. });
        let on_short = if fallback {
            OnShort::Claim
        } else {
            OnShort::Report
        };
        let r = store.deduct_home(at(h), args, on_short).await;
        self.check_error(what, &r);
        match &r {
            // The lease left depends on timing.
            Ok(HomeReply::Pending { epoch, .. }) => log += &format!(" home Pending e{epoch}"),
            other => log += &format!(" home {other:?}"),
        }
        match r {
            Ok(HomeReply::Applied { .. }) => {
                let kind = if resv { Kind::Resv } else { Kind::Sale };
                if resv {
                    self.resv_ids.push(format!(
                        "{}~{}~{h}~{}",
                        self.name, meta.generation, d.request_id
                    ));
                }
                let v = self.m.on_got(kind, &d, &Got::Applied);
                self.note(v);
            }
            Ok(HomeReply::Short {
                claimed: Some(epoch),
                ..
            }) => {
                let mut taken = 0;
                if n > 1 {
                    let t = store
                        .take(
                            at((h + 1) % n),
                            args,
                            part.min(qty),
                            epoch,
                            SegmentRole::Fallback,
                        )
                        .await;
                    self.check_error(what, &t);
                    log += &format!(" take {t:?}");
                    if let Ok(TakeReply::Taken { part, .. }) = t {
                        taken = part;
                    }
                }
                self.m.cause("pending", d.user.as_str());
                let prev = self.m.rids.insert(
                    d.request_id.to_string(),
                    RidFx {
                        user: d.user.to_string(),
                        qty,
                        kind: Kind::Sale,
                        fx: Fx::Limbo { taken },
                        born: self.m.waits,
                    },
                );
                if let Some(p) = prev.filter(|p| p.fx != Fx::Unknown) {
                    self.bad.push(format!(
                        "[twice] {what}: claimed {} although it was {p:?}",
                        d.request_id
                    ));
                }
            }
            _ => {}
        }
        log
    }
}
