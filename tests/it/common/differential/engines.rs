//! The differential idea one level up: random request sequences through an [`Engine`] on each
//! store (memory, Redis, coalesced Redis), in lockstep; the transcripts of outcomes and of the
//! audit after each step (per-segment stock, sold, reserved, in transit) must be identical,
//! and every audit must balance with nothing left in transit (one engine, one request at a
//! time: every transfer it debits it credits before answering).
//!
//! The engines are deterministic given the same store answers: long hint TTLs, sold out from
//! memory off (Redis has notifications, the memory store none), one engine per store.

use super::op::{Again, T};
use super::{ADVANCE, AUTO_ADVANCE_AFTER, MARGIN, SHORT_MS};
use crate::common::{RedisAt, env_knob, store_builder};
use proptest::prelude::*;
use proptest::strategy::Strategy;
use shardstock::*;
use std::time::{Duration, Instant};

/// One request-level step.
#[derive(Debug, Clone)]
pub enum Act {
    Load {
        total: u64,
        segments: u32,
        limit: u64,
    },
    Deduct {
        user: u8,
        qty: u64,
        rid: u8,
    },
    Reserve {
        user: u8,
        qty: u64,
        rid: u8,
        ttl: T,
    },
    /// Confirm (or cancel) the nth reservation answered so far.
    End {
        nth: usize,
        confirm: bool,
    },
    /// The nth request sent, again (as [`Again`] says).
    Again {
        nth: usize,
        how: Again,
    },
    Restock {
        qty: u64,
        rid: u8,
    },
    /// `engine.sweep()`.
    Sweep,
    /// Sleep past every short timer (no audit after it: the next step meets expired
    /// reservations not yet returned).
    Advance,
}

fn timer() -> impl Strategy<Value = T> {
    prop_oneof![3 => Just(T::Long), 1 => SHORT_MS.prop_map(T::Short)]
}

pub fn act() -> impl Strategy<Value = Act> {
    let again = prop_oneof![
        3 => Just(Again::Same),
        1 => Just(Again::OtherQty),
        1 => Just(Again::OtherKind),
        2 => (0u8..5).prop_map(Again::OtherUser),
    ];
    prop_oneof![
        1 => (0u64..30, 1u32..6, prop_oneof![Just(0u64), 1u64..4])
            .prop_map(|(total, segments, limit)| Act::Load { total, segments, limit }),
        8 => (0u8..5, 1u64..6, 0u8..12).prop_map(|(user, qty, rid)| Act::Deduct { user, qty, rid }),
        4 => (0u8..5, 1u64..4, 0u8..12, timer())
            .prop_map(|(user, qty, rid, ttl)| Act::Reserve { user, qty, rid, ttl }),
        3 => (0usize..32, any::<bool>()).prop_map(|(nth, confirm)| Act::End { nth, confirm }),
        3 => (0usize..32, again).prop_map(|(nth, how)| Act::Again { nth, how }),
        2 => (1u64..10, 0u8..4).prop_map(|(qty, rid)| Act::Restock { qty, rid }),
        1 => Just(Act::Sweep),
        1 => Just(Act::Advance),
    ]
}

pub fn case(len: usize) -> impl Strategy<Value = Vec<Act>> {
    (
        (1u64..30, 1u32..6, prop_oneof![Just(0u64), 1u64..4]),
        proptest::collection::vec(act(), 1..len),
    )
        .prop_map(|((total, segments, limit), acts)| {
            let mut all = vec![Act::Load {
                total,
                segments,
                limit,
            }];
            all.extend(acts);
            all
        })
}

/// The engines' options: deterministic routing (see the module docs).
pub fn builder() -> EngineBuilder {
    Engine::builder()
        .per_user_limit(0)
        .hint_ttl(Duration::from_secs(3600))
        .sold_out_ttl(Duration::ZERO)
        .request_ttl(Duration::from_secs(600))
        .transfer_lease(Duration::from_secs(600))
        .max_qty(5)
}

#[derive(Debug, Clone)]
struct Sent {
    d: Deduct,
    resv: Option<T>,
}

/// One store's engine and what it was told.
pub struct Side<S: Store> {
    e: Engine<S>,
    sku: Sku,
    loads: u32,
    sent: Vec<Sent>,
    resv_ids: Vec<ReservationId>,
    gens: Vec<u64>,
    pub log: Vec<String>,
    pub bad: Vec<String>,
}

impl<S: Store> Side<S> {
    pub fn new(e: Engine<S>, name: &str) -> Self {
        Self {
            e,
            sku: Sku::new(name).unwrap(),
            loads: 0,
            sent: Vec::new(),
            resv_ids: Vec::new(),
            gens: Vec::new(),
            log: Vec::new(),
            bad: Vec::new(),
        }
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

    fn show_id(&mut self, id: &ReservationId) -> String {
        let g = self.gen_name(id.generation());
        format!(
            "{}~{g}~{}~{}~{}",
            id.sku(),
            id.segment(),
            id.user(),
            id.request_id()
        )
    }

    fn req(&self, user: u8, qty: u64, rid: u8) -> Deduct {
        // Request ids carry the load count: a reload starts fresh ledgers, and reusing an id
        // across generations is covered by the edge tests.
        Deduct::new(
            self.sku.as_str(),
            &format!("u{user}"),
            qty,
            &format!("l{}-r{rid}", self.loads),
        )
        .unwrap()
    }

    fn errors<X: std::fmt::Debug>(&mut self, r: &Result<X>) {
        if let Err(e @ (Error::Protocol(_) | Error::Redis(_) | Error::NotReady(_))) = r {
            self.bad.push(format!("[error] {e:?}"));
        }
    }

    async fn send(&mut self, s: &Sent) -> (String, bool) {
        match s.resv {
            None => {
                let r = self.e.deduct(&s.d).await;
                self.errors(&r);
                (format!("{r:?}"), false)
            }
            Some(t) => {
                let r = self.e.reserve(&s.d, Duration::from_millis(t.ms())).await;
                self.errors(&r);
                let held = matches!(r, Ok(Reserved::Held { .. }));
                let line = match &r {
                    Ok(Reserved::Held { id, segment, units }) => {
                        self.resv_ids.push(id.clone());
                        format!("Held {} {segment}:{units}", self.show_id(id))
                    }
                    Ok(Reserved::Replayed { id, segment, units }) => {
                        format!("Replayed {} {segment}:{units}", self.show_id(id))
                    }
                    other => format!("{other:?}"),
                };
                (line, held && t.is_short())
            }
        }
    }

    /// One step: its line, and whether it started a short timer.
    pub async fn step(&mut self, act: &Act) -> Option<(String, bool)> {
        Some(match act {
            Act::Load {
                total,
                segments,
                limit,
            } => {
                let r = self
                    .e
                    .load(
                        &self.sku,
                        *total,
                        LoadOptions::new(*segments)
                            .replace(true)
                            .per_user_limit(*limit),
                    )
                    .await;
                self.errors(&r);
                self.loads += 1;
                self.sent.clear();
                self.resv_ids.clear();
                let line = match r {
                    Ok(g) => format!("load {}", self.gen_name(g)),
                    Err(e) => format!("load {e:?}"),
                };
                (line, false)
            }
            Act::Deduct { user, qty, rid } => {
                let s = Sent {
                    d: self.req(*user, *qty, *rid),
                    resv: None,
                };
                let (line, short) = self.send(&s).await;
                self.sent.push(s.clone());
                (
                    format!(
                        "deduct {} {} x{}: {line}",
                        s.d.user, s.d.request_id, s.d.qty
                    ),
                    short,
                )
            }
            Act::Reserve {
                user,
                qty,
                rid,
                ttl,
            } => {
                let s = Sent {
                    d: self.req(*user, *qty, *rid),
                    resv: Some(*ttl),
                };
                let (line, short) = self.send(&s).await;
                self.sent.push(s.clone());
                (
                    format!(
                        "reserve {} {} x{}: {line}",
                        s.d.user, s.d.request_id, s.d.qty
                    ),
                    short,
                )
            }
            Act::End { nth, confirm } => {
                if self.resv_ids.is_empty() {
                    return None;
                }
                let id = self.resv_ids[self.resv_ids.len() - 1 - nth % self.resv_ids.len()].clone();
                let r = if *confirm {
                    self.e.confirm(&id).await
                } else {
                    self.e.cancel(&id).await
                };
                self.errors(&r);
                let shown = self.show_id(&id);
                (
                    format!(
                        "{} {shown}: {r:?}",
                        if *confirm { "confirm" } else { "cancel" }
                    ),
                    false,
                )
            }
            Act::Again { nth, how } => {
                if self.sent.is_empty() {
                    return None;
                }
                let mut s = self.sent[self.sent.len() - 1 - nth % self.sent.len()].clone();
                match how {
                    Again::Same => {}
                    Again::OtherQty => s.d.qty = s.d.qty % 5 + 1,
                    Again::OtherKind => {
                        s.resv = match s.resv {
                            Some(_) => None,
                            None => Some(T::Long),
                        }
                    }
                    Again::OtherUser(u) => {
                        let mut other = format!("u{u}");
                        if other == s.d.user.as_str() {
                            other = format!("u{}", (u + 1) % 5);
                        }
                        s.d.user = UserId::new(other).unwrap();
                    }
                }
                let (line, short) = self.send(&s).await;
                self.sent.push(s.clone());
                (
                    format!(
                        "again {how:?} {} {} x{}: {line}",
                        s.d.user, s.d.request_id, s.d.qty
                    ),
                    short,
                )
            }
            Act::Restock { qty, rid } => {
                let id = RequestId::new(format!("l{}-s{rid}", self.loads)).unwrap();
                let r = self.e.restock(&self.sku, *qty, &id).await;
                self.errors(&r);
                (format!("restock {id} {qty}: {r:?}"), false)
            }
            Act::Sweep => {
                // The count covers every SKU of the store (other cases' on the shared Redis):
                // not compared.
                let r = self.e.sweep().await;
                self.errors(&r);
                (format!("sweep: {:?}", r.map(|_| ())), false)
            }
            Act::Advance => {
                tokio::time::sleep(ADVANCE).await;
                ("advance".into(), false)
            }
        })
    }

    /// The audit after a step, as a line; checks it balances with nothing in transit.
    pub async fn audit(&mut self) -> String {
        let a = self.e.audit(&self.sku).await;
        match a {
            Ok(a) => {
                if !a.ok || a.in_transit != 0 {
                    self.bad.push(format!(
                        "[audit] {:?} (in transit {}) {:?}",
                        a.problems, a.in_transit, a
                    ));
                }
                let per: Vec<u64> = a.segments.iter().map(|s| s.state.stock).collect();
                format!(
                    "  stock {per:?} sold {} reserved {} restocked {} in transit {}",
                    a.sold, a.reserved, a.restocked, a.in_transit
                )
            }
            Err(e) => {
                self.bad.push(format!("[audit] {e:?}"));
                format!("  audit {e:?}")
            }
        }
    }
}

static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub enum Verdict {
    Pass,
    Fail(String),
    Tainted,
}

fn tail(log: &[String]) -> String {
    let keep = env_knob("DIFF_TAIL").unwrap_or(40);
    log[log.len().saturating_sub(keep)..].join("\n")
}

/// One case, in lockstep on the three engines.
pub async fn run_once(r: &Engine<RedisStore>, c: &Engine<RedisStore>, acts: &[Act]) -> Verdict {
    let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("e{}-{n}", std::process::id());
    let mut m = Side::new(builder().build(MemoryStore::new()).unwrap(), &name);
    let mut sr = Side::new(r.clone(), &name);
    let mut sc = Side::new(c.clone(), &name);
    let shortest = Duration::from_millis(*SHORT_MS.start());
    let mut short_since: Option<Instant> = None;
    for (i, act) in acts.iter().enumerate() {
        let advance = matches!(act, Act::Advance);
        if !advance && short_since.is_some_and(|t| t.elapsed() >= AUTO_ADVANCE_AFTER) {
            tokio::time::sleep(ADVANCE).await;
            for s in [&mut m.log, &mut sr.log, &mut sc.log] {
                s.push("(advance: timers)".into());
            }
            short_since = None;
        }
        let t0 = Instant::now();
        let (a, b, c) = futures::join!(m.step(act), sr.step(act), sc.step(act));
        let (Some(a), Some(b), Some(c)) = (a, b, c) else {
            continue;
        };
        if advance {
            short_since = None;
        } else if a.1 || b.1 || c.1 {
            short_since.get_or_insert(t0);
        }
        m.log.push(format!("#{i} {}", a.0));
        sr.log.push(format!("#{i} {}", b.0));
        sc.log.push(format!("#{i} {}", c.0));
        if !advance {
            let (x, y, z) = futures::join!(m.audit(), sr.audit(), sc.audit());
            m.log.push(x);
            sr.log.push(y);
            sc.log.push(z);
        }
        if short_since.is_some_and(|t| t.elapsed() + MARGIN >= shortest) {
            return Verdict::Tainted;
        }
        for (label, side_bad, log) in [
            ("memory", &m.bad, &m.log),
            ("redis", &sr.bad, &sr.log),
            ("coalesced", &sc.bad, &sc.log),
        ] {
            if !side_bad.is_empty() {
                return Verdict::Fail(format!(
                    "step {i} ({act:?}) on {label}: {}\n--- {label} ---\n{}",
                    side_bad.join("; "),
                    tail(log)
                ));
            }
        }
        if m.log != sr.log || m.log != sc.log {
            return Verdict::Fail(format!(
                "step {i} ({act:?}): the engines differ\n--- memory ---\n{}\n--- redis ---\n{}\n--- coalesced ---\n{}",
                tail(&m.log),
                tail(&sr.log),
                tail(&sc.log)
            ));
        }
    }
    Verdict::Pass
}

/// The property over random cases of up to `len` steps, the Redis engines on `srv`.
pub fn property(srv: &impl RedisAt, default_cases: u32, len: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (r, c) = rt.block_on(async {
        let r = store_builder(srv, "e").connect().await.unwrap();
        let c = store_builder(srv, "ec")
            .coalescing(Some(Coalescing::default()))
            .connect()
            .await
            .unwrap();
        (builder().build(r).unwrap(), builder().build(c).unwrap())
    });
    proptest!(super::run::config(default_cases), |(acts in case(len))| {
        let mut verdict = Verdict::Tainted;
        for _ in 0..3 {
            verdict = rt.block_on(run_once(&r, &c, &acts));
            if !matches!(verdict, Verdict::Tainted) {
                break;
            }
        }
        match verdict {
            Verdict::Pass => {}
            Verdict::Fail(why) => prop_assert!(false, "{}", why),
            Verdict::Tainted => prop_assume!(false, "raced a timer three times"),
        }
    });
}
