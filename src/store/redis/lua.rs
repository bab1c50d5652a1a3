//! The Lua layer: every script shardstock runs on Redis, how each is called, and what the
//! scripts store.
//!
//! One list (the `scripts!` invocation below) declares every script — the store's and the
//! locks' alike — and the same list enumerates them for `SCRIPT LOAD`: adding a script is one
//! line there plus its `.lua` file. Every call goes through one path, `run`: a typed call
//! builds its KEYS and ARGV, `EVALSHA` runs it, a `NOSCRIPT` answer (the script cache is empty
//! after a restart, a failover or `SCRIPT FLUSH`) loads the script and retries once, counted in
//! `shardstock_script_reloads_total{script=<name>}`, and the typed call decodes the reply. Each
//! script's call type (KEYS/ARGV building and reply decoding) sits in one place, in the
//! submodule of its concern: `sell` (selling at home, `sell.lua`), `transfer` (moving stock,
//! `transfer.lua`), `segment` (loading, restocking, reservations, the survey and the record
//! read), `lock` (lock scripts,
//! also run on RedLock's independent nodes: the call takes the client to run on), `outbox` (the
//! order consumer's dead letters, trimming and lag).
//!
//! Each script starts with `prelude.lua` (strict argument checks, shared helpers: the record
//! format, the reclaim of expired reservations, the outbox). A script's header states its KEYS,
//! ARGV and replies; the letters and fields it stores are in the tables below, which every
//! header points to. What each step decides is [`Segment`](crate::store::memory::Segment)'s
//! method of the same name: the scripts mirror it, answer for answer.
//!
//! # Stored letters
//!
//! A request's record is `<S>:<qty>:<until>:<exp>` (where `S` is a letter, below), kept in its
//! user's ledger under a per-user limit, else as field `<user> <request id>` of a sales window
//! (a sale) or of the record hash (a reservation, an order item):
//!
//! | letter | meaning | kind | written by |
//! |---|---|---|---|
//! | `A` | a sale, applied: the units are sold | sale | sell |
//! | `R` | reserved: `qty` units held until `exp` | reservation | sell |
//! | `C` | confirmed: the units are sold | reservation | reserve_end |
//! | `K` | cancelled: the units went back (also every live reservation of a generation a reload or a drop ended) | reservation | reserve_end; load_segment, drop_segment (the prelude's `end_reservations`) |
//! | `X` | expired unconfirmed: the units went back | reservation | the prelude's `reclaim` (sell, transfer, reserve_end, survey) |
//! | `O` | an order's item held: `qty` units held until its order's decision is settled here; `until` 0, `exp` the sweeper's hint (its order's deadline on this master's clock) | order item | sell (a run whose spec ends `:o`) |
//! | `P` | an order's item posted (its order confirmed): the units are sold | order item | settle |
//! | `V` | an order's item voided (its order cancelled, expired or refused): the units went back — or, written by a void that found no hold, none were taken and a late hold replays it and takes nothing | order item | settle |
//!
//! `until` is when the record is forgotten (server ms; `0`: kept for the generation — a sale, or
//! a confirmed reservation, under a per-user limit): a record is live iff `until` is 0 or
//! ahead of the clock. A sale's `until` is the sale's time + `ttl_ms` without a limit; a
//! reservation's is `exp + ttl_ms`. `exp` is a reservation's expiry (server ms), 0 for a sale.
//! `record.lua` reads an `R` past its `exp` as `X` (the reclaim has not run yet).
//!
//! # Stored fields
//!
//! `<tag>` is the segment's hash tag (`<sku>#<i>`, or `<sku>#<i>.<k>` when placed), `<gen>` its
//! generation. Every key of a segment shares `{<tag>}`; scripts build the ledger names of
//! users they meet in the reservation index from the segment key (same tag, same slot).
//!
//! | key | fields |
//! |---|---|
//! | SKU metadata `<prefix>:{<sku>}:meta` | `gen`, `segments`, `loaded`, `limit`, `state` (`loading` / `ready`), `place` (tag suffixes), `outmax` (most segments any generation had with the outbox on), `hf` (the home function version the generation was loaded with; missing: loaded before home functions had versions, read as 0) |
//! | SKU registry `<prefix>:skus` | set of every SKU ever loaded (`RedisStore::load_begin` adds, the sweeper lists) |
//! | segment `<prefix>:{<tag>}:seg` | `gen`, `stock`, `sold`, `loaded`, `restocked`, `reserved`, `tin` (units credited here by transfers), `tout` (units debited here by transfers), `lim` (per-user limit of this generation, 0: none), `hf` (home function version), `rw` (without a limit: the sales window widths in use, ms, comma-separated; a sale goes into the smallest at least its `ttl_ms`, else a new one of its `ttl_ms` or twice the widest, whichever is more), `rr` (without a limit: `1` once the record hash holds a record; sell reads it only then), `rx` (without a limit: the newest sales window given its expiry), `out` (`1`: the outbox is on), `fence` (the lock strategies' fence token, bumped by each lock acquisition), `pad` (256 bytes written at load so that Redis keeps the hash a hash table, not a listpack scanned field by field: see `load_segment.lua`). `loaded + restocked + tin = stock + reserved + sold + tout` |
//! | ledgers under a per-user limit `…:g<gen>:led` | hash, one field per user homed here: `<h> <f>` then ` <request id> <record>` per record (above), where `h` = units the user holds here (sold, confirmed, or reserved and live) and `f` = of those, units held for good; or the short form, `<request id>` alone (no space), which stands for `1 1 <request id> A:1:0:0`: a new buyer's one sale of one unit, written without building a string and ~12 bytes smaller; a ledger that holds exactly that is always written in the short form. No TTL: the ledgers live as long as the generation. Written at load with one more field, ` pad` (a leading space: no user id), so that the hash is a hash table from its first user on (`load_segment.lua`). A coalesced call reads every ledger it needs in one `HMGET` and writes them in one `HSET` |
//! | sales window without a limit `…:g<gen>:w<w>:<b>` | `<user> <request id>` = a sale's record (above), for the sales made from `b·w` up to `(b+1)·w` server ms with a `ttl_ms` of at most `w`; expires at `(b+2)·w` (`PEXPIREAT`), once every record in it is forgotten. A lookup reads, for each window width in use, the window of now and the one before |
//! | record hash without a limit `…:g<gen>:rec` | `<user> <request id>` = a reservation's or an order item's record (above), any state. No TTL: it goes with the generation, so the reclaim finds a record however late it runs |
//! | hold index `…:g<gen>:hold` | ZSET of `<user> <request id>` by hint: exactly the records in state `O` (settle removes; holds_due lists those past their hint) |
//! | order record `<prefix>:{o<shard>}:order:<order id>` | hash: `s` (`O` holding, `H` held, `C` confirmed, `K` cancelled, `X` expired, `F` refused), `dl` (deadline, this master's ms), `items` (`<sku>:<qty>` joined by `,`), `why` (a refusal: `<item number> <outcome>[ <figure>]`), `un` (forgotten at: `PEXPIREAT`); written by order.lua only, its decision once. `<shard>` = FNV-1a of the order id mod 1024, so records spread over slots |
//! | reservation index `…:g<gen>:resv` | ZSET of `<user> <request id>` (one space; ids have none) by expiry: exactly the records in state `R` |
//! | credits `…:g<gen>:in` | hash: transfer id (decimal u64, as text) → units credited here (`HSETNX`: once per id) |
//! | transfers `…:g<gen>:tx` | hash: transfer id → `<dest>:<units>:<lease end ms>` debited here; lease end `0` once done |
//! | due index `…:g<gen>:txq` | ZSET of the transfers not done (ids zero-padded to 20 digits, so equal lease ends list by id) by lease end |
//! | restock record `…:g<gen>:rs:<request id>` | string `<qty>:<total>`, expiring after the restock's TTL |
//! | outbox stream `<prefix>:{<tag>}:out` (all generations) | one entry per change of a request's units: `kind` (`sold`, `reserved`, `confirmed`, `cancelled`, `expired`), `rid`, `sku`, `user`, `units`, `parts` (`<index>:<units>`), `gen`; appended by sell, reserve_end, the prelude's reclaim and end_reservations (`emit`); consumer groups per order service |
//! | dead letters `<prefix>:{<tag>}:dead` | an outbox entry's fields plus `origin` (its id), `group`, `deliveries`, `reason` (outbox_dead) |
//! | failure reasons `<prefix>:{<tag>}:why` | hash: outbox entry id → the handler's last error |
//! | outbox SKUs `<prefix>:outbox` | set of SKUs ever loaded with the outbox (consumers discover streams from it and each SKU's `outmax`) |
//! | lock `<prefix>:{<tag>}:lock` | the holder's owner token |
//! | RedLock quarantine marker `shardstock:redlock:quarantine` (per node) | end of the node's quarantine, ms |
//!
//! A write into a limited ledger holding 32 records or more (`PRUNE_AT`, then every power of two)
//! first deletes the records past their `until`.
//!
//! A reload makes every `…:g<old>:…` key of a segment unreachable (every script checks the
//! generation); `RedisStore::load_segment` / `drop_segment` unlink them afterwards (`SCAN MATCH
//! …:g<old>:*` on the slot's node, best effort).

use crate::cluster::moving;
use crate::cluster::wait::Durable;
use crate::error::{Error, Result};
use crate::ids::RequestId;
use crate::segments::Keyspace;
use crate::store::SegAddr;
use fred::prelude::{Client, LuaInterface};
use fred::types::Value;
use fred::types::scripts::Script as FredScript;
use std::sync::{Arc, LazyLock};

pub(crate) mod lock;
pub(crate) mod order;
pub(crate) mod outbox;
pub(crate) mod segment;
pub(crate) mod sell;
pub(crate) mod transfer;

/// Declares the scripts: `Variant "name" [flags "..."] [after "shared.lua", ...]` runs
/// `prelude.lua`, the shared parts, then `name.lua`; `name` is also the `script` label of the
/// reload counter.
///
/// Every script starts with a `#!lua` line (Redis 7 script flags). A script without the
/// `no-writes` flag is one Redis refuses *before running it* when the master cannot reach the
/// replicas its `min-replicas-to-write` asks for (`NOREPLICAS`, [`crate::Error::NoReplicas`]):
/// whatever the script would have answered — a sale, a replay, "short", a record read — the
/// call fails fast with nothing written, instead of running on a master that cannot replicate
/// and then waiting out the durability `WAIT`. Only scripts that never need their answer to be
/// durable say `flags "no-writes"`. Redis keeps the shebang's line feed, so `@user_script:<n>`
/// line numbers still count from the top of [`Script::source`].
macro_rules! scripts {
    ($( $(#[$doc:meta])* $id:ident $name:literal $(flags $flags:literal)? $(after [$($shared:literal),+])? ),+ $(,)?) => {
        /// A script, by name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Script {
            $( $(#[$doc])* $id, )+
        }

        impl Script {
            /// Every script, in declaration order (for `SCRIPT LOAD`).
            pub(crate) const ALL: &'static [Script] = &[$(Script::$id),+];

            /// The file stem, also the `script` label of the reload counter.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Script::$id => $name,)+
                }
            }

            /// The Lua source as sent to Redis.
            fn source(self) -> &'static str {
                match self {
                    $(Script::$id => concat!(
                        "#!lua", $(" flags=", $flags,)? "\n",
                        include_str!("../../scripts/prelude.lua"),
                        $($(include_str!(concat!("../../scripts/", $shared)),)+)?
                        include_str!(concat!("../../scripts/", $name, ".lua"))
                    ),)+
                }
            }
        }
    };
}

scripts! {
    /// Requests decided at their home segment (the hot path; one call, many requests).
    Sell "sell",
    /// Transfers at the donor: debit, done, the due list.
    Transfer "transfer",
    /// Confirms, cancels or inspects a reservation.
    ReserveEnd "reserve_end",
    /// A segment's counters and live reservations, after the reclaim (audit, sweeper).
    Survey "survey",
    /// A segment's counters and reservations, written nothing (audit, status, live audit).
    Peek "peek" flags "no-writes",
    /// One request's record at its home (read only).
    Record "record",
    /// An order's decision brought to one of its items.
    Settle "settle",
    /// Order items held past their hint (the sweeper's look).
    HoldsDue "holds_due" flags "no-writes",
    /// One step on an order's record.
    Order "order",
    /// Adds units to a segment once per request id.
    Restock "restock",
    /// Starts a (re)load.
    LoadBegin "load_begin",
    /// Writes one segment of a load.
    LoadSegment "load_segment",
    /// Marks a load ready.
    LoadCommit "load_commit",
    /// Deletes a segment left from an older generation.
    DropSegment "drop_segment",
    /// Lock strategies: bumps the segment's fence token and reads the stock.
    FenceRead "fence_read",
    /// Renews a lock's lease for its owner (watchdog).
    LockRenew "lock_renew",
    /// Releases a lock for its owner (compare-and-delete).
    LockRelease "lock_release",
    /// One node's vote in a RedLock acquisition.
    RedlockAcquire "redlock_acquire",
    /// Claims idle outbox events with their delivery counts.
    OutboxClaim "outbox_claim",
    /// Moves an outbox event no handler could take to the dead letters.
    OutboxDead "outbox_dead",
    /// Drops outbox events every consumer group acknowledged.
    OutboxTrim "outbox_trim",
    /// A consumer group's standing on an outbox stream (read only).
    OutboxLag "outbox_lag" flags "no-writes",
}

/// The scripts with their SHA1s, computed once per process.
static REGISTRY: LazyLock<Vec<FredScript>> = LazyLock::new(|| {
    Script::ALL
        .iter()
        .map(|s| FredScript::from_lua(s.source()))
        .collect()
});

impl Script {
    fn fred(self) -> &'static FredScript {
        &REGISTRY[self as usize]
    }
}

impl Script {
    /// The Redis command called on line `line` (1-based, of the source as sent, as Redis
    /// reports `@user_script:<line>`), when that line names one literally.
    pub(crate) fn command_at(self, line: usize) -> Option<&'static str> {
        let text = self.source().lines().nth(line.checked_sub(1)?)?;
        commands_in(text).into_iter().next()
    }

    /// The Redis commands the script calls (`redis.call('CMD'`, or a command built as a table
    /// `{ 'CMD', ...}`), once each, sorted.
    pub(crate) fn commands(self) -> Vec<&'static str> {
        commands_in(self.source())
    }
}

/// The commands `src` calls literally (see [`Script::commands`]), once each, sorted.
fn commands_in(src: &'static str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = ["redis.call('", "redis.pcall('", "{ '"]
        .iter()
        .flat_map(|open| {
            src.match_indices(open)
                .map(move |(i, _)| &src[i + open.len()..])
        })
        .filter_map(|rest| rest.split('\'').next())
        .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_uppercase()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One call of one script: its KEYS and ARGV, and how its reply decodes.
pub(crate) trait Call {
    /// The script it runs.
    const SCRIPT: Script;
    /// The decoded reply.
    type Output;
    /// KEYS and ARGV. Called again when the call is sent again (after `NOSCRIPT` or a slot
    /// move): `&self`, so every send carries the same arguments.
    fn encode(&self) -> (Vec<String>, Vec<String>);
    /// KEYS and ARGV as sent: [`encode`](Self::encode)'s, unless the call builds its
    /// arguments as byte buffers itself (or reuses ones made before: a fred key or value is a
    /// shared buffer, cloned by a count).
    fn encode_values(&self) -> (Vec<fred::types::Key>, Vec<Value>) {
        let (keys, args) = self.encode();
        (
            keys.into_iter().map(Into::into).collect(),
            args.into_iter().map(Value::from).collect(),
        )
    }
    /// Decodes the script's reply.
    fn decode(&self, reply: Value) -> Result<Self::Output>;
    /// Durability mode: whether this call, having answered `out`, waits for the replicas
    /// before its answer counts (`WAIT`; see `wait`). By default, every call of a script that
    /// may write ([`Script::may_write`]).
    fn waits(&self, out: &Self::Output) -> bool {
        let _ = out;
        Self::SCRIPT.may_write()
    }
}

/// Runs `call` on `client`: encode, [`eval`], decode.
pub(crate) async fn run<C: Call>(client: &Client, call: C) -> Result<C::Output> {
    run_durable(client, call, None).await
}

/// [`run`], and in durability mode (`durable`), for a call whose writes must persist
/// ([`Call::waits`]), a `WAIT` on the same client and node before the answer is returned (see
/// `wait`).
pub(crate) async fn run_durable<C: Call>(
    client: &Client,
    call: C,
    durable: Option<&Arc<Durable>>,
) -> Result<C::Output> {
    let mut first = Some(call.encode_values());
    let slot = durable.map(|_| {
        let keys = first.as_ref().map(|(keys, _)| keys);
        Durable::slot(
            client,
            keys.and_then(|k| k.first()).and_then(|k| k.as_str()),
        )
    });
    // The first send takes the arguments encoded above; a send again (`NOSCRIPT`, a slot
    // move) encodes them again. Kept for a retry instead, they were cloned per call and
    // dropped unused: a reference count up and down per argument (in `perf`, a few % of a
    // coalesced sale's client CPU; in wall-clock runs, within this VM's noise).
    let encode = || first.take().unwrap_or_else(|| call.encode_values());
    // Boxed: fred's command future, the slot-move retries and the NOSCRIPT reload are
    // kilobytes of state (measured: 7.7 KB for a deduction's call). Inline, every caller's
    // future grows by that and is built and moved again at each layer, per request: memmove
    // took 12.7 % of the client's CPU in a coalesced sale (3.7 % boxed). One allocation per
    // call is cheaper.
    let reply = Box::pin(eval(client, C::SCRIPT, encode, durable.is_some())).await?;
    let out = call.decode(reply)?;
    if let (Some(d), Some(slot)) = (durable, slot)
        && call.waits(&out)
    {
        Box::pin(d.acked(client, slot)).await?;
    }
    Ok(out)
}

impl Script {
    /// Whether the script may write (durability mode waits after its calls unless the call
    /// says otherwise): every script but the read-only ones (`record`, `peek`, `outbox_lag`) and the
    /// outbox consumer's bookkeeping (`outbox_trim`, `outbox_claim`, `outbox_dead`: losing
    /// one in a failover redelivers or keeps an event, never loses a sale).
    pub(crate) fn may_write(self) -> bool {
        !matches!(
            self,
            Script::Record
                | Script::Peek
                | Script::OutboxLag
                | Script::OutboxTrim
                | Script::OutboxClaim
                | Script::OutboxDead
        )
    }
}

/// `EVALSHA`; on `NOSCRIPT`, `SCRIPT LOAD` (counted in `shardstock_script_reloads_total`) and
/// once more. `encode` gives the KEYS and ARGV, once per send. Argument errors of the scripts
/// come back as [`Error::InvalidInput`].
///
/// `once` (durability mode): fred does not send the call again on a new connection after the
/// one it went out on dropped (it would by default, up to the client's command attempts). Only
/// then is a `NOREPLICAS` answer ([`Error::NoReplicas`]) the fate of the only run: a re-sent
/// call refused by a master without replicas says nothing of the first send, which may have
/// applied before its master died and was replicated to the one now refusing. Without `once`
/// such an answer is an unknown outcome ([`Error::Redis`]). (A call re-sent after `MOVED`,
/// `ASK`, `TRYAGAIN` or `NOSCRIPT` never ran the first time.)
pub(crate) async fn eval(
    client: &Client,
    script: Script,
    mut encode: impl FnMut() -> (Vec<fred::types::Key>, Vec<Value>),
    once: bool,
) -> Result<Value> {
    let fred = script.fred();
    let r = if once {
        let options = fred::types::config::Options {
            max_attempts: Some(1),
            ..Default::default()
        };
        let c = fred::interfaces::ClientLike::with_options(client, &options);
        reloading(client, script, || {
            let (keys, args) = encode();
            c.evalsha(fred.sha1().clone(), keys, args)
        })
        .await
    } else {
        reloading(client, script, || {
            let (keys, args) = encode();
            client.evalsha(fred.sha1().clone(), keys, args)
        })
        .await
    };
    r.map_err(|e| match e {
        Error::NoReplicas(d) if !once => Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Unknown,
            format!("NOREPLICAS {d} (perhaps a re-sent call: outcome unknown)"),
        )),
        e => e,
    })
}

/// `send` (an `EVALSHA` of `script`), following slot moves; on `NOSCRIPT`, `SCRIPT LOAD` on
/// `client` and `send` once more.
async fn reloading<F, Fut>(client: &Client, script: Script, mut send: F) -> Result<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<Value, fred::error::Error>>,
{
    match moving::follow(&mut send).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            crate::metrics::script_reload(script.name());
            script
                .fred()
                .load(client)
                .await
                .map_err(|e| script_error(script, e))?;
            moving::follow(send).await
        }
        r => r,
    }
    .map_err(|e| script_error(script, e))
}

/// `SCRIPT LOAD`s `scripts` on `client` (otherwise done on the first `NOSCRIPT`).
pub(crate) async fn load(client: &Client, scripts: &[Script]) -> Result<()> {
    for s in scripts {
        s.fred().load(client).await?;
    }
    Ok(())
}

/// Maps the errors of a call of `script` to typed errors: its argument errors to
/// [`Error::InvalidInput`], an ACL refusal inside it to [`Error::Permission`] naming the script
/// and the command on the line Redis names (or every command it calls).
fn script_error(script: Script, e: fred::error::Error) -> Error {
    let details = e.details();
    if let Some(bad) = bad_argument(details) {
        return bad;
    }
    let Some((what, line)) = crate::error::script_refusal(details) else {
        return e.into();
    };
    Error::Permission(match line.and_then(|l| Some((l, script.command_at(l)?))) {
        Some((line, cmd)) => format!(
            "script {} line {line} runs {cmd}: {what}: {details}",
            script.name()
        ),
        None => format!(
            "script {} touched {what} (it calls {}): {details}",
            script.name(),
            script.commands().join(", ")
        ),
    })
}

/// "… shardstock bad argument: <name>" as [`Error::InvalidInput`] naming the field.
fn bad_argument(d: &str) -> Option<Error> {
    const PREFIX: &str = "shardstock bad argument: ";
    let pos = d.find(PREFIX)?;
    let name = d[pos + PREFIX.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    let field = match name {
        "qty" => "qty",
        "user" => "user",
        "request_id" => "request_id",
        "gen" => "gen",
        _ => "argument",
    };
    Some(Error::invalid(field, format!("rejected by the store: {d}")))
}

/// A tagged script reply (`{tag, field, ...}`), read field by field.
pub(crate) struct Reply {
    tag: String,
    rest: Vec<Value>,
    script: &'static str,
}

impl Reply {
    /// Splits `v` into its tag and fields.
    pub(crate) fn parse(v: Value, script: Script) -> Result<Self> {
        let script = script.name();
        let mut arr = match v {
            Value::Array(a) if !a.is_empty() => a,
            other => return Err(Error::Protocol(format!("{script}: reply {other:?}"))),
        };
        let rest = arr.split_off(1);
        let tag = arr[0]
            .as_string()
            .ok_or_else(|| Error::Protocol(format!("{script}: tag {:?}", arr[0])))?;
        Ok(Self { tag, rest, script })
    }

    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    pub(crate) fn u64(&self, i: usize) -> Result<u64> {
        self.rest
            .get(i)
            .and_then(Value::as_u64)
            .ok_or_else(|| self.bad())
    }

    /// A stock figure; the unsafe baselines can drive stock below zero for a moment, which
    /// reads as 0 (the audit still sees the real counters).
    pub(crate) fn stock(&self, i: usize) -> Result<u64> {
        self.rest
            .get(i)
            .and_then(Value::as_i64)
            .map(|v| v.max(0) as u64)
            .ok_or_else(|| self.bad())
    }

    pub(crate) fn str(&self, i: usize) -> Result<String> {
        self.rest
            .get(i)
            .and_then(Value::as_string)
            .ok_or_else(|| self.bad())
    }

    /// The error for a reply this version does not understand.
    pub(crate) fn bad(&self) -> Error {
        Error::Protocol(format!(
            "{}: reply {} {:?}",
            self.script, self.tag, self.rest
        ))
    }
}

/// The keys of one segment (all under the segment's hash tag).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentKeys<'a> {
    /// The store's key names.
    pub(crate) keys: &'a Keyspace,
    /// The segment.
    pub(crate) seg: SegAddr<'a>,
}

impl SegmentKeys<'_> {
    /// The segment's hash tag (placed or plain).
    pub(crate) fn tag(&self) -> String {
        self.seg.tag()
    }

    /// The segment hash.
    pub(crate) fn segment(&self) -> String {
        self.keys.segment(&self.tag())
    }

    /// The ledgers under a per-user limit (one hash; declared by every script that may touch
    /// them, so Redis refuses a call up front — ACL, a slot being migrated — not half-way).
    pub(crate) fn limited_ledgers(&self) -> String {
        self.keys.limited_ledgers(&self.tag(), self.seg.generation)
    }

    /// The reservation index.
    pub(crate) fn reservations(&self) -> String {
        self.keys.reservations(&self.tag(), self.seg.generation)
    }

    /// The hold index (order items held here).
    pub(crate) fn holds(&self) -> String {
        self.keys.holds(&self.tag(), self.seg.generation)
    }

    /// The transfers credited here.
    pub(crate) fn credits(&self) -> String {
        self.keys.credits(&self.tag(), self.seg.generation)
    }

    /// The transfers debited here.
    pub(crate) fn transfers(&self) -> String {
        self.keys.transfers(&self.tag(), self.seg.generation)
    }

    /// The due index of the transfers debited here.
    pub(crate) fn transfers_due(&self) -> String {
        self.keys.transfers_due(&self.tag(), self.seg.generation)
    }

    /// `rid`'s restock record here.
    pub(crate) fn restock(&self, rid: &RequestId) -> String {
        self.keys.restock(&self.tag(), self.seg.generation, rid)
    }

    /// The segment's outbox stream.
    pub(crate) fn outbox(&self) -> String {
        self.keys.outbox(&self.tag())
    }

    /// The segment's lock (lock strategies).
    pub(crate) fn lock(&self) -> String {
        self.keys.lock(&self.tag())
    }

    /// The generation as an argument.
    pub(crate) fn generation(&self) -> String {
        self.seg.generation.to_string()
    }
}

/// ARGV from values that print as the script expects them.
macro_rules! argv {
    ($($v:expr),* $(,)?) => {
        vec![$($v.to_string()),*]
    };
}
pub(crate) use argv;

/// `"1"` / `"0"`.
pub(crate) fn flag(v: bool) -> &'static str {
    if v { "1" } else { "0" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_registered_once_with_its_source() {
        let mut names: Vec<&str> = Script::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), REGISTRY.len());
        for (i, s) in Script::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            let (shebang, rest) = s.source().split_once('\n').unwrap();
            let read_only = matches!(s, Script::OutboxLag | Script::Peek | Script::HoldsDue);
            assert_eq!(
                shebang,
                if read_only {
                    "#!lua flags=no-writes"
                } else {
                    "#!lua"
                },
                "{}: only read-only scripts may run on a master that cannot replicate",
                s.name()
            );
            assert!(rest.starts_with("-- prelude.lua"), "{}", s.name());
            assert!(
                s.source().contains(&format!("-- {}.lua", s.name())),
                "{} does not end with its own file",
                s.name()
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Script::ALL.len());
    }
}
