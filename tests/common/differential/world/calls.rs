//! The engine calls of a world (sale, reservation, resend, confirm / cancel, dropped calls) and
//! what each answer tells the model.

use super::*;
use shardstock::store::ResvState;

impl<S: Store> World<S> {
    /// A deduct; `UserBusy` is retried for up to `BUSY_POLL` in the cancellation test
    /// (nothing else is in flight there, so the busy entry must go away).
    pub(super) async fn sale(&mut self, e: u8, d: &Deduct, what: &str) -> String {
        let eng = self.e(e);
        let start = Instant::now();
        let mut r = eng.deduct(d).await;
        while self.cancellation
            && matches!(r, Ok(Deduction::UserBusy))
            && start.elapsed() < BUSY_POLL
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
            r = eng.deduct(d).await;
        }
        if self.cancellation && matches!(r, Ok(Deduction::UserBusy)) {
            self.bad.push(format!(
                "[busy] {} still user_busy after {BUSY_POLL:?} with nothing in flight",
                d.user
            ));
        }
        self.check_error(what, &r);
        self.conflicted(d, &r);
        let v = self.m.on_got(Kind::Sale, d, &got_deduct(&r));
        self.note(v);
        format!("{what} {r:?}")
    }

    pub(super) async fn reserve(&mut self, e: u8, d: &Deduct, ttl_ms: u64, what: &str) -> String {
        let eng = self.e(e);
        let ttl = Duration::from_millis(ttl_ms);
        let start = Instant::now();
        let mut r = eng.reserve(d, ttl).await;
        while self.cancellation
            && matches!(r, Ok(Reserved::NotHeld(Deduction::UserBusy)))
            && start.elapsed() < BUSY_POLL
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
            r = eng.reserve(d, ttl).await;
        }
        if self.cancellation && matches!(r, Ok(Reserved::NotHeld(Deduction::UserBusy))) {
            self.bad.push(format!(
                "[busy] {} still user_busy after {BUSY_POLL:?} with nothing in flight",
                d.user
            ));
        }
        self.check_error(what, &r);
        self.conflicted(d, &r);
        if let Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) = &r {
            self.resv_ids.push(id.to_string());
        }
        let v = self.m.on_got(Kind::Resv, d, &got_reserve(&r));
        self.note(v);
        format!("{what} {}", self.show_reserved(&r))
    }

    /// Sends `s` again (its own kind) or as `as_kind`.
    pub(super) async fn resend(
        &mut self,
        e: u8,
        d: &Deduct,
        kind: Kind,
        ttl_ms: u64,
        what: &str,
    ) -> String {
        match kind {
            Kind::Sale => self.sale(e, d, what).await,
            Kind::Resv => self.reserve(e, d, ttl_ms, what).await,
        }
    }

    pub(super) async fn end(&mut self, e: u8, nth: usize, confirm: bool) -> Option<String> {
        if self.resv_ids.is_empty() {
            return None;
        }
        let id = self.resv_ids[back(nth, self.resv_ids.len())].clone();
        let eng = self.e(e);
        let parsed: ReservationId = id.parse().unwrap();
        let r = if confirm {
            eng.confirm(&parsed).await
        } else {
            eng.cancel(&parsed).await
        };
        self.check_error("end", &r);
        let what = if confirm { "confirm" } else { "cancel" };
        let line = format!("{what} {} {r:?}", self.norm_id(&id));
        // Only reservations of the current generation are in the model.
        let p: Vec<&str> = id.splitn(4, '~').collect();
        let current = self.gens.last().map(|g| g.to_string());
        if p.len() == 4 && Some(p[1].to_string()) == current {
            let rid = p[3].to_string();
            let v = self.on_end(&rid, confirm, &r);
            self.note(v);
        }
        Some(line)
    }

    fn on_end(&mut self, rid: &str, confirm: bool, r: &Result<ReservationEnd>) -> Option<String> {
        let Ok(ReservationEnd { state, done }) = r else {
            return None;
        };
        let cur = self.m.rids.get(rid).cloned();
        let fx = cur.as_ref().map(|c| c.fx.clone());
        let resv = cur.as_ref().is_some_and(|c| c.kind == Kind::Resv);
        match (state, confirm, *done) {
            (Some(ResvState::Confirmed), true, true) => match fx {
                Some(Fx::Held | Fx::Unknown) if resv => {
                    let c = self.m.rids.get_mut(rid).unwrap();
                    c.fx = Fx::Sold;
                    self.m.sold += c.qty;
                }
                Some(Fx::Sold) if resv => {}
                other => {
                    return Some(format!(
                        "[resv] confirmed reservation {rid}, but it was {other:?}"
                    ));
                }
            },
            (Some(ResvState::Cancelled), false, true) => match fx {
                Some(Fx::Held | Fx::Unknown) if resv => {
                    let c = self.m.rids.get_mut(rid).unwrap();
                    c.fx = Fx::Ended;
                    let user = c.user.clone();
                    self.m.cause("cancelled", &user);
                }
                Some(Fx::Ended) => {}
                other => {
                    return Some(format!(
                        "[resv] cancelled reservation {rid}, but it was {other:?}"
                    ));
                }
            },
            (Some(ResvState::Expired | ResvState::Cancelled), _, _) => match fx {
                Some(Fx::Held) => {
                    return Some(format!(
                        "[resv] reservation {rid} is {state:?} in the store but live (no wait passed, not cancelled)"
                    ));
                }
                Some(Fx::Unknown) => self.m.rids.get_mut(rid).unwrap().fx = Fx::Ended,
                Some(Fx::Sold) if resv => {
                    return Some(format!(
                        "[resv] reservation {rid} was confirmed, the store says {state:?}"
                    ));
                }
                _ => {}
            },
            (Some(ResvState::Confirmed), false, _) if fx == Some(Fx::Held) => {
                return Some(format!(
                    "[resv] reservation {rid} confirmed behind our back"
                ));
            }
            (None, _, _) if fx == Some(Fx::Held) && resv => {
                return Some(format!(
                    "[resv] live reservation {rid} unknown to the store"
                ));
            }
            _ => {}
        }
        None
    }

    pub(super) async fn dropped(
        &mut self,
        e: u8,
        user: u8,
        qty: u64,
        us: u64,
        resv: bool,
    ) -> String {
        self.drops += 1;
        let rid = format!("g{}-d{}", self.m.loads, self.drops);
        let d = Deduct::new(&self.name, &format!("u{user}"), qty, &rid).unwrap();
        let kind = if resv { Kind::Resv } else { Kind::Sale };
        self.sent.push(Sent {
            d: d.clone(),
            kind,
            ttl_ms: CRASH_RESV_TTL_MS,
        });
        let eng = self.e(e);
        let limit = Duration::from_micros(us);
        let ttl = Duration::from_millis(CRASH_RESV_TTL_MS);
        if resv {
            if let Ok(r) = tokio::time::timeout(limit, eng.reserve(&d, ttl)).await {
                self.check_error("drop", &r);
                self.conflicted(&d, &r);
                if let Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) = &r {
                    self.resv_ids.push(id.to_string());
                }
                let v = self.m.on_got(kind, &d, &got_reserve(&r));
                self.note(v);
                return format!("drop(reserve) finished {}", self.show_reserved(&r));
            }
        } else {
            if let Ok(r) = tokio::time::timeout(limit, eng.deduct(&d)).await {
                self.check_error("drop", &r);
                self.conflicted(&d, &r);
                let v = self.m.on_got(kind, &d, &got_deduct(&r));
                self.note(v);
                return format!("drop(deduct) finished {r:?}");
            }
        }
        let rid = d.request_id.to_string();
        let prev = self.m.rids.get(&rid).map(|c| c.fx.clone());
        match prev {
            // A retry of something that took effect: no new effect possible.
            Some(Fx::Sold | Fx::Held | Fx::Ended) => {}
            _ => {
                self.m.cause("pending", d.user.as_str());
                self.m.cause("crashed", d.user.as_str());
                self.m.rids.insert(
                    rid,
                    RidFx {
                        user: d.user.to_string(),
                        qty,
                        kind,
                        fx: Fx::Unknown,
                        born: self.m.waits,
                    },
                );
            }
        }
        "dropped".to_string()
    }
}
