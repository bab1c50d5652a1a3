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
//! submodule of its concern: `deduct` (taking stock), `claim` (fallback claims), `segment`
//! (loading, restocking, reservations, audit reads), `user` (per-user limit), `lock` (lock
//! scripts, also run on RedLock's independent nodes: the call takes the client to run on),
//! `outbox` (the order consumer's dead letters, trimming and lag).
//!
//! Each script starts with `prelude.lua` (strict argument checks, shared helpers); the two
//! deduction scripts also share `deduct_core.lua`. A script's header states its KEYS, ARGV and
//! replies; the letters and fields it stores are in the tables below, which every header
//! points to.
//!
//! # Stored letters
//!
//! Hashes keep states as one-letter codes. The same letter means different things in different
//! fields (`X`: sealed in a record's `s`, expired in its `rs`; `R`: refunded in `s`, reserved
//! in `rs` and in a user entry), so read a letter together with its field:
//!
//! | key (field) | letter | meaning | written by |
//! |---|---|---|---|
//! | request record (`s`) | `A` | applied: at home, the request with its `parts`; at a fallback segment, a part `p` taken by claim epoch `e`; a compact entry (below) reads as `A` | deduct, deduct_batch (a compact entry, or the record key over a released claim / for a reservation / for a TTL above the window width), take, settle; the unsafe baselines' write-back (`strategies.rs`) |
//! | | `P` | pending fallback claim (home only): epoch `e` (1, or one above an `F`'s), lease end `l`, part taken at home `hp` | deduct, deduct_batch (when short) |
//! | | `F` | released claim (home only): nothing sold and the request id is free — every script reads it as no record, except that a new claim continues above its epoch `e` (its shut-out markers may still refuse older epochs elsewhere); only `u`, `q`, `k`, `e` (and the claim's `o`) kept | settle (release) |
//! | | `X` | sealed: the request never applied and never can | seal, settle (seal) |
//! | | `V` | shut-out marker (fallback segment): nothing taken here; claim epochs below `e` are refused | shut_out |
//! | | `R` | refunded part (fallback segment): its units went back | refund |
//! | request record (`k`), user entry, `claims_due` reply | `s` / `r` | a sale / a reservation (missing: a sale, written before kinds existed) | every writer |
//! | request record (`rs`) | `R` | reserved: `rq` units held until `exp` (ms, server clock) | deduct, deduct_batch, take (`hold` in the prelude) |
//! | | `C` | confirmed: the units are sold | reserve_end |
//! | | `K` | cancelled: the units went back | reserve_end, refund |
//! | | `X` | expired unconfirmed: the units went back | the prelude's reclaim, run by reclaim.lua and inside deduct, take and reserve_end |
//! | user entry (field `r:<request id>` of the user record) | `P` | pending: counted while its request is in flight, verified after its expiry | user_claim |
//! | | `R` | reserved: counted, verified when the user is at the limit | user_finish |
//! | | `S` | sold: counts for good | user_finish |
//!
//! # Stored fields
//!
//! | key | fields |
//! |---|---|
//! | SKU metadata `<prefix>:{<sku>}:meta` | `gen`, `segments`, `loaded`, `limit`, `state` (`loading` / `ready`), `place` (tag suffixes), `outmax` (most segments any generation had with the outbox on) |
//! | segment `<prefix>:{<sku>#<i>}:seg` | `gen`, `stock`, `sold`, `loaded`, `restocked`, `reserved`; `fence`: the lock strategies' fence token (bumped by each lock acquisition); `out`: `1` when the generation has the outbox on; `rw`: `1` once deduct_batch wrote a compact entry of this generation (the hot path reads no window without it; a reload of the same generation keeps it) |
//! | request record `…:g<gen>:rq:<request id>` (segment's tag) | `s`, `u` (user), `q` (the request's qty), `k`, `e` (claim epoch), `l`, `hp`, `o` (a claim's generation had the outbox on), `parts` (`<segment>:<units>,…`), `p` (part here), `rs`, `rq`, `exp` |
//! | compact entries: window hash `…:g<gen>:rw:<W>:<w>` (segment's tag) | field = request id, value `<qty>:<expiry ms>:<user>`: a sale applied wholly at its home segment by deduct_batch, read as a request record with `s` = `A`, `k` = `s`, `e` = `0`, `parts` = `<segment>:<qty>`; written while `floor(now / W) = w`, the hash expires at `(w + 2) · W`, an entry past its expiry reads as absent. A compact entry is written only where no record key exists, and every writer of a record key reads first through the prelude's `record` (which finds the entry), so at most one of the two is live per request id; a record key, when there is one, is what is read. Every reader goes through `record` (or `record.lua`) |
//! | window width `…:g<gen>:rw` | string `<W>:<w>`: the window width (ms; the record TTL of the first compact write) and the newest window written, kept while any window lives; a call with a longer TTL writes full records |
//! | reservation index `…:g<gen>:resv` | ZSET of request records holding a live reservation, by expiry |
//! | claim index `…:g<gen>:claims` | ZSET of pending claim records, by lease end |
//! | restock record `…:g<gen>:rs:<request id>` | string `<qty>:<total>` |
//! | decrement token `<segment key>:dt:<nonce>` | `decr-compensate` only: a decrement given back once |
//! | user record `<prefix>:{<sku>@<user>}:g<gen>:user` | `r:<request id>` = `<qty>:<P\|R\|S>:<expiry ms>:<s\|r>[:<attempt>.…]` (a pending entry's attempts in flight) |
//! | outbox stream `<prefix>:{<sku>#<i>}:out` (all generations) | one entry per change of a request's units: `kind` (`sold`, `reserved`, `confirmed`, `cancelled`, `expired`), `rid`, `sku`, `user`, `units`, `parts`, `gen`; appended by deduct, deduct_batch, settle (applied), reserve_end and the prelude's reclaim (`emit`); consumer groups per order service |
//! | dead letters `<prefix>:{<sku>#<i>}:dead` | an outbox entry's fields plus `origin` (its id), `group`, `deliveries`, `reason` (outbox_dead) |
//! | failure reasons `<prefix>:{<sku>#<i>}:why` | hash: outbox entry id → the handler's last error |
//! | outbox SKUs `<prefix>:outbox` | set of SKUs ever loaded with the outbox (consumers discover streams from it and each SKU's `outmax`) |
//! | lock `<prefix>:{<sku>#<i>}:lock` | the holder's owner token |
//! | RedLock quarantine marker `shardstock:redlock:quarantine` (per node) | end of the node's quarantine, ms |
//!
//! Two words are kept apart: a claim **epoch** (a fallback claim's generation of holders; a
//! newer holder *shuts* older epochs *out* of the other segments, `shut_out.lua`) and a lock
//! **fence token** (the segment's `fence` field; a lock holder's write applies only while the
//! token is still its own).

use super::moving;
use super::wait::Durable;
use crate::error::{Error, Result};
use crate::ids::RequestId;
use crate::segments::{Keyspace, decode_parts};
use crate::store::{Part, SegAddr};
use fred::prelude::{Client, LuaInterface};
use fred::types::Value;
use fred::types::scripts::Script as FredScript;
use std::sync::{Arc, LazyLock};

pub(crate) mod claim;
pub(crate) mod deduct;
pub(crate) mod lock;
pub(crate) mod outbox;
pub(crate) mod segment;
pub(crate) mod user;

/// Declares the scripts: `Variant "name" [after "shared.lua", ...]` runs `prelude.lua`, the
/// shared parts, then `name.lua`; `name` is also the `script` label of the reload counter.
macro_rules! scripts {
    ($( $(#[$doc:meta])* $id:ident $name:literal $(after [$($shared:literal),+])? ),+ $(,)?) => {
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
    /// One deduction at its home segment (the hot path).
    Deduct "deduct" after ["deduct_core.lua"],
    /// Many deductions bound for one segment (request coalescing).
    DeductBatch "deduct_batch" after ["deduct_core.lua"],
    /// Reads one request record, full or compact (read only).
    Record "record",
    /// A part of a claimed request at one segment.
    Take "take",
    /// Ends a fallback claim.
    Settle "settle",
    /// Gives back a part of a claim that could not complete.
    Refund "refund",
    /// A new claim holder shuts older epochs out of a segment.
    ShutOut "shut_out",
    /// Takes over a claim whose lease ran out.
    Takeover "takeover",
    /// Seals a request that never applied.
    Seal "seal",
    /// Fallback claims whose lease ran out (sweeper).
    ClaimsDue "claims_due",
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
    /// Confirms, cancels or inspects a reservation.
    ReserveEnd "reserve_end",
    /// Returns expired reservations (sweeper).
    Reclaim "reclaim",
    /// The audit's atomic read of a segment.
    Held "held",
    /// Counts a request against its user's limit.
    UserClaim "user_claim",
    /// Marks a user entry sold or reserved, or removes it.
    UserFinish "user_finish",
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
    OutboxLag "outbox_lag",
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
    /// The script whose SHA1 is `sha` (an ACL refusal inside a script names it by its SHA1).
    pub(crate) fn by_sha1(sha: &str) -> Option<Script> {
        Script::ALL
            .iter()
            .copied()
            .find(|s| &**s.fred().sha1() == sha)
    }

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
    /// KEYS and ARGV. (`&mut`: a call may hand over strings it owns instead of copying them.)
    fn encode(&mut self) -> (Vec<String>, Vec<String>);
    /// Decodes the script's reply.
    fn decode(&self, reply: Value) -> Result<Self::Output>;
}

/// Runs `call` on `client`: encode, [`eval`], decode.
pub(crate) async fn run<C: Call>(client: &Client, call: C) -> Result<C::Output> {
    run_durable(client, call, None).await
}

/// [`run`], and in durability mode (`durable`), for a script whose writes must persist, a
/// `WAIT` on the same client and node before the reply is decoded (see `wait`).
pub(crate) async fn run_durable<C: Call>(
    client: &Client,
    mut call: C,
    durable: Option<&Arc<Durable>>,
) -> Result<C::Output> {
    let (keys, args) = call.encode();
    let durable = durable
        .filter(|_| C::SCRIPT.must_persist())
        .map(|d| (d, Durable::slot(client, keys.first().map(String::as_str))));
    // Boxed: fred's command future, the slot-move retries and the NOSCRIPT reload are
    // kilobytes of state (measured: 7.7 KB for deduct.lua's call). Inline, every caller's
    // future grows by that and is built and moved again at each layer, per request: memmove
    // took 12.7 % of the client's CPU in a coalesced sale (3.7 % boxed). One allocation per
    // call is cheaper.
    let reply = Box::pin(eval(client, C::SCRIPT, keys, args)).await?;
    if let Some((d, slot)) = durable {
        Box::pin(d.acked(client, slot)).await?;
    }
    call.decode(reply)
}

impl Script {
    /// Whether durability mode waits for replicas after this script: every script but the
    /// audit's read (`held`, no write) and the sweeper's listing (`claims_due`, whose only
    /// writes drop index entries that need nothing, so losing them loses nothing).
    fn must_persist(self) -> bool {
        !matches!(
            self,
            Script::Held
                | Script::Record
                | Script::ClaimsDue
                | Script::OutboxLag
                | Script::OutboxTrim
                | Script::OutboxClaim
                | Script::OutboxDead
        )
    }
}

/// `EVALSHA`; on `NOSCRIPT`, `SCRIPT LOAD` (counted in `shardstock_script_reloads_total`) and
/// once more. Argument errors of the scripts come back as [`Error::InvalidInput`].
pub(crate) async fn eval(
    client: &Client,
    script: Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value> {
    let fred = script.fred();
    // As fred keys/values (byte buffers taken over without copying), cloning for the NOSCRIPT
    // retry costs a reference count per argument, not a copy.
    let keys: Vec<fred::types::Key> = keys.into_iter().map(Into::into).collect();
    let args: Vec<Value> = args.into_iter().map(Into::into).collect();
    let send = || client.evalsha(fred.sha1().clone(), keys.clone(), args.clone());
    match moving::follow(send).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            crate::metrics::script_reload(script.name());
            fred.load(client).await.map_err(script_error)?;
            moving::follow(send).await
        }
        r => r,
    }
    .map_err(script_error)
}

/// `SCRIPT LOAD`s `scripts` on `client` (otherwise done on the first `NOSCRIPT`).
pub(crate) async fn load(client: &Client, scripts: &[Script]) -> Result<()> {
    for s in scripts {
        s.fred().load(client).await?;
    }
    Ok(())
}

/// Maps the scripts' argument errors back to typed errors.
fn script_error(e: fred::error::Error) -> Error {
    bad_argument(e.details()).unwrap_or_else(|| e.into())
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
        "part" => "part",
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

    pub(crate) fn parts(&self, i: usize) -> Result<Vec<Part>> {
        decode_parts(&self.str(i)?).ok_or_else(|| self.bad())
    }

    /// The field named by a `{"mismatch", field}` reply.
    pub(crate) fn field(&self, i: usize) -> Result<&'static str> {
        match self.str(i)?.as_str() {
            "user" => Ok("user"),
            "qty" => Ok("qty"),
            "kind" => Ok("kind"),
            _ => Err(self.bad()),
        }
    }

    /// The error for a reply this version does not understand.
    pub(crate) fn bad(&self) -> Error {
        Error::Protocol(format!(
            "{}: reply {} {:?}",
            self.script, self.tag, self.rest
        ))
    }

    /// `{"bad", "ERR shardstock bad argument: <name>"}` (one request of a batch refused) as
    /// the error a lone call would have got.
    pub(crate) fn bad_argument(&self) -> Error {
        match self.str(0) {
            Ok(d) => bad_argument(&d).unwrap_or_else(|| self.bad()),
            Err(e) => e,
        }
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
    fn tag(&self) -> String {
        self.seg.tag()
    }

    /// The segment hash.
    pub(crate) fn segment(&self) -> String {
        self.keys.segment(&self.tag())
    }

    /// `rid`'s request record here.
    pub(crate) fn record(&self, rid: &RequestId) -> String {
        self.keys.request(&self.tag(), self.seg.generation, rid)
    }

    /// The reservation index.
    pub(crate) fn reservations(&self) -> String {
        self.keys.reservations(&self.tag(), self.seg.generation)
    }

    /// The claim index.
    pub(crate) fn claims(&self) -> String {
        self.keys.claims(&self.tag(), self.seg.generation)
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

    /// The one-time token of a decr-compensate decrement.
    pub(crate) fn decr_token(&self, nonce: u64) -> String {
        format!("{}:dt:{nonce}", self.segment())
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
            assert!(s.source().starts_with("-- prelude.lua"), "{}", s.name());
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
