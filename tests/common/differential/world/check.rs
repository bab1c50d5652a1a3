//! What a world checks: after every step, the audit against the model ([`World::check`]);
//! at an expire, that every timer passed and abandoned claims were repaired; at the end of a
//! case, that every dropped call is decided and every user below the limit can still buy.

use super::*;

impl<S: Store> World<S> {
    /// Waits past every timer, sweeps with both engines, then checks strictly: nothing
    /// reserved, and every abandoned claim resolved (units back, or settled when complete).
    pub(super) async fn expire(&mut self) -> Out {
        // Past every timer, and past the sweeper's grace on abandoned claims (one more claim
        // lease: holders do not renew, so a slow live one gets that long to finish).
        tokio::time::sleep(WAIT + SWEEP_GRACE).await;
        self.m.after_wait();
        let mut swept = 0;
        for i in 0..2 {
            let eng = self.e(i);
            // So both engines know the current layout (sweep covers the SKUs an engine used).
            let _ = eng.remaining(&self.sku).await;
            match eng.sweep().await {
                Ok(n) => swept += n,
                Err(e) => self.bad.push(format!("[error] sweep: {e:?}")),
            }
        }
        Out {
            line: format!("expire swept {swept}"),
            timers: false,
        }
    }

    /// After every step: the audit and the model agree.
    ///
    /// - audit ok, `loaded + restocked = remaining + reserved + sold`, loaded and restocked as
    ///   sent;
    /// - `reserved` covers the live reservations; after an expire it equals them (0);
    /// - `sold` is at least the units answered sold, at most that plus abandoned takes and
    ///   dropped calls; after an expire, exactly the units answered sold plus dropped calls
    ///   that are fully in (each dropped call is all in or all out);
    /// - per user, units sold + reserved ≤ limit.
    pub async fn check(&mut self, strict: bool) -> String {
        let a = match self.engines[0].audit(&self.sku).await {
            Ok(a) => a,
            Err(e) => {
                self.check_error("audit", &Err::<(), _>(e));
                return "  audit failed".to_string();
            }
        };
        let mut bad = Vec::new();
        if !a.ok {
            bad.push(format!("[audit] audit not ok: {:?}", a.problems));
        }
        if a.loaded + a.restocked != a.remaining + a.reserved + a.sold {
            bad.push(format!(
                "[audit] loaded {} + restocked {} != remaining {} + reserved {} + sold {}",
                a.loaded, a.restocked, a.remaining, a.reserved, a.sold
            ));
        }
        if (a.loaded, a.restocked) != (self.m.loaded, self.m.restocked) {
            bad.push(format!(
                "[audit] loaded/restocked {}/{} but {}/{} were sent",
                a.loaded, a.restocked, self.m.loaded, self.m.restocked
            ));
        }
        let live = self.m.live_reserved();
        if a.reserved < live || (strict && a.reserved != live) {
            bad.push(format!(
                "[reserved] reserved {} but live reservations hold {live}{}",
                a.reserved,
                if strict {
                    " (after expire + sweep)"
                } else {
                    ""
                }
            ));
        }
        let (lo, unsure) = (self.m.sold, self.m.unsure());
        if a.sold < lo || a.sold > lo + unsure {
            bad.push(format!(
                "[sold] sold {} but answers say {lo} (+ up to {unsure} from abandoned or dropped calls)",
                a.sold
            ));
        } else if strict {
            // After the fixes an expired claim is repaired by the sweeper: refunded and
            // sealed, or settled as applied when all its parts were taken. So `sold` is what
            // the answers say, plus complete abandoned claims, plus dropped calls that are
            // wholly in.
            let complete: u64 = self
                .m
                .rids
                .values()
                .filter(|f| f.fx == (Fx::Limbo { taken: f.qty }))
                .map(|f| f.qty)
                .sum();
            let unknown: Vec<u64> = self
                .m
                .rids
                .values()
                .filter(|f| f.fx == Fx::Unknown && f.kind == Kind::Sale)
                .map(|f| f.qty)
                .collect();
            let extra = a.sold.checked_sub(lo + complete);
            if !extra.is_some_and(|x| subset_sum(&unknown, x)) {
                bad.push(format!(
                    "[abandoned] after expire + sweep sold {} = {lo} answered + {complete} of complete abandoned claims + {extra:?}, which no set of dropped calls {unknown:?} makes: units taken by an abandoned claim were not returned",
                    a.sold
                ));
            }
            for f in self.m.rids.values_mut() {
                if f.fx == (Fx::Limbo { taken: f.qty }) {
                    f.fx = Fx::Sold;
                }
            }
            self.m.sold += complete;
        }
        if self.m.limit > 0 {
            for u in 0..3 {
                let user = format!("u{u}");
                let h = self.m.holds(&user);
                if h > self.m.limit {
                    bad.push(format!(
                        "[limit] {user} holds {h} units, limit {}",
                        self.m.limit
                    ));
                }
            }
        }
        self.bad.extend(bad);
        let per: Vec<(u64, u64, u64)> = a
            .segments
            .iter()
            .map(|s| (s.state.stock, s.state.reserved, s.state.sold))
            .collect();
        format!("  (stock, reserved, sold) {per:?}")
    }

    /// End of a case: retry every dropped call until it is decided, then probe that every
    /// user below the limit can still buy on both engines.
    pub async fn finish(&mut self) -> String {
        let mut lines = Vec::new();
        let unknown: Vec<Sent> = self
            .sent
            .iter()
            .filter(|s| {
                s.d.request_id
                    .as_str()
                    .starts_with(&format!("g{}-", self.m.loads))
                    && self
                        .m
                        .rids
                        .get(s.d.request_id.as_str())
                        .is_some_and(|f| f.fx == Fx::Unknown && f.user == s.d.user.as_str())
            })
            .cloned()
            .collect();
        // A resolve answered held starts a reservation's TTL, which runs on the store's clock
        // while retries (up to `BUSY_POLL`) and probes go on: kept out of races as the runner
        // does between ops (`run_edges`), else the model counts a reservation the store has
        // let expire (and a retry refused while it was live then gets the units).
        let mut timers_since: Option<Instant> = None;
        for s in unknown {
            let start = Instant::now();
            loop {
                self.pass_timers(&mut timers_since, AUTO_WAIT_AFTER, &mut lines)
                    .await;
                let t0 = Instant::now();
                let line = self.resend(0, &s.d, s.kind, s.ttl_ms, "resolve").await;
                let fx = self.m.rids.get(s.d.request_id.as_str()).map(|f| &f.fx);
                if fx == Some(&Fx::Held) {
                    timers_since.get_or_insert(t0);
                }
                let undecided = fx == Some(&Fx::Unknown);
                if !undecided || start.elapsed() > BUSY_POLL {
                    lines.push(line);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        if self.m.limit > 0 {
            for i in 0..2u8 {
                for u in 0..3u8 {
                    self.pass_timers(&mut timers_since, AUTO_WAIT_AFTER, &mut lines)
                        .await;
                    if self.m.holds(&format!("u{u}")) + 1 > self.m.limit {
                        continue;
                    }
                    let d = Deduct::new(
                        &self.name,
                        &format!("u{u}"),
                        1,
                        &format!("g{}-probe{i}-u{u}", self.m.loads),
                    )
                    .unwrap();
                    let eng = self.e(i);
                    let start = Instant::now();
                    let mut r = eng.deduct(&d).await;
                    while matches!(r, Ok(Deduction::UserBusy)) && start.elapsed() < BUSY_POLL {
                        tokio::time::sleep(Duration::from_millis(25)).await;
                        r = eng.deduct(&d).await;
                    }
                    if matches!(r, Ok(Deduction::UserBusy)) {
                        self.bad.push(format!(
                            "[busy] probe: u{u} user_busy on engine {i} for {BUSY_POLL:?}, nothing in flight"
                        ));
                    }
                    self.check_error("probe", &r);
                    let v = self.m.on_got(Kind::Sale, &d, &got_deduct(&r));
                    self.note(v);
                    lines.push(format!("probe e{i} u{u} {r:?}"));
                }
            }
        }
        // The check that follows (at once: `run_edges`) looks at the model: as after any op.
        self.pass_timers(&mut timers_since, SHORTEST_TIMER - TIMER_MARGIN, &mut lines)
            .await;
        lines.join("\n")
    }

    /// Once the first timer started `since` is `after` old: waits past every timer and ages
    /// the model (held reservations end), as the runner does between ops.
    async fn pass_timers(
        &mut self,
        since: &mut Option<Instant>,
        after: Duration,
        lines: &mut Vec<String>,
    ) {
        if since.is_some_and(|t| t.elapsed() >= after) {
            tokio::time::sleep(WAIT).await;
            self.m.after_wait();
            lines.push("(wait: timers)".to_string());
            *since = None;
        }
    }
}

fn subset_sum(items: &[u64], target: u64) -> bool {
    let mut reach = std::collections::BTreeSet::from([0u64]);
    for i in items {
        let next: Vec<u64> = reach.iter().map(|r| r + i).collect();
        reach.extend(next);
    }
    reach.contains(&target)
}
