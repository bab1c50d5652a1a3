//! The one-shot commands that administer a SKU's stock: `load`, `restock`, `status`, `audit`,
//! and `sweep` (one sweeper's work, for a deployment without a running `serve`).

use crate::{Failure, print_json, unique_stem};
use clap::Args;
use serde::Serialize;
use shardstock::{Engine, RequestId, Sku, Store};
use std::process::ExitCode;

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// SKU id (ASCII letters, digits, '_', '.', '-'; at most 64 bytes).
    #[arg(long)]
    sku: String,
    /// Total units to load.
    #[arg(long, value_name = "N")]
    stock: u64,
    /// Number of segments to split the stock over (1..=1024). More segments spread hot-key
    /// load; each holds stock/segments units.
    #[arg(long, value_name = "K")]
    segments: u32,
    /// Replace an existing SKU: starts a new generation; its old stock, counters and request
    /// records no longer count.
    #[arg(long)]
    replace: bool,
    /// Units one user may buy of this SKU (0 = no limit). Default: engine.per_user_limit
    /// from the configuration (1 = one order per user).
    #[arg(long, value_name = "N")]
    per_user_limit: Option<u64>,
    /// Turn the outbox on (Redis only): the scripts that sell, reserve, confirm, cancel and
    /// expire append an event per change to the segment's stream, for `shardstock orders`.
    /// `--outbox off` turns it off on a reload. Default: engine.outbox from the configuration.
    #[arg(long, value_name = "on|off", num_args = 0..=1, default_missing_value = "on", value_parser = crate::parse_on_off)]
    outbox: Option<bool>,
}

#[derive(Debug, Args)]
pub(crate) struct RestockArgs {
    /// SKU id.
    #[arg(long)]
    sku: String,
    /// Units to add (spread evenly over the segments).
    #[arg(long, value_name = "N")]
    qty: u64,
    /// Idempotency key; re-use it to retry safely. Default: a fresh id from the process id and
    /// the current time.
    #[arg(long, value_name = "R")]
    request_id: Option<String>,
}

/// The one argument of the read-only commands (`audit`, `status`).
#[derive(Debug, Args)]
pub(crate) struct SkuArgs {
    /// SKU id.
    #[arg(long)]
    sku: String,
}

/// Arguments of `sweep`.
#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    /// Sweep rounds at most: another round runs while the last one left fewer units reserved
    /// or in transit than the one before (a round settles at most 256 order items per
    /// segment).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

pub(crate) async fn run_sweep<S: Store>(
    engine: Engine<S>,
    a: SweepArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    #[derive(Serialize)]
    struct SkuAfter {
        sku: String,
        reserved: u64,
        in_transit: u64,
        audit_ok: bool,
    }
    #[derive(Serialize)]
    struct Swept {
        rounds: u32,
        /// Units of expired reservations given back (order items settled are not counted
        /// here: `reserved` after the sweep shows what is still held).
        reservation_units_back: u64,
        skus: Vec<SkuAfter>,
    }
    let (mut rounds, mut back, mut before) = (0, 0, u64::MAX);
    let after = loop {
        rounds += 1;
        back += engine.sweep().await?;
        let mut after = Vec::new();
        for sku in engine.store().skus().await? {
            let audit = match engine.audit(&sku).await {
                Ok(audit) => audit,
                // Listed but not (or no longer) loaded: nothing to sweep.
                Err(shardstock::Error::NotLoaded(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            after.push(SkuAfter {
                sku: audit.sku.clone(),
                reserved: audit.live_reserved(),
                in_transit: audit.in_transit,
                audit_ok: audit.ok,
            });
        }
        let pending: u64 = after.iter().map(|s| s.reserved + s.in_transit).sum();
        if pending == 0 || pending >= before || rounds >= a.rounds {
            break after;
        }
        before = pending;
    };
    let ok = after.iter().all(|s| s.audit_ok);
    if json {
        print_json(&Swept {
            rounds,
            reservation_units_back: back,
            skus: after,
        })?;
    } else {
        say!("swept {rounds} round(s): {back} units of expired reservations given back");
        for s in &after {
            say!(
                "  {}: reserved {}, in transit {}, audit {}",
                s.sku,
                s.reserved,
                s.in_transit,
                if s.audit_ok { "ok" } else { "FAILED" }
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::failure::CHECK_FAILED)
    })
}

pub(crate) async fn run_load<S: Store>(
    engine: Engine<S>,
    a: LoadArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let sku = Sku::new(&a.sku)?;
    let limit = a.per_user_limit.unwrap_or(engine.options().per_user_limit);
    let generation = engine
        .load(
            &sku,
            a.stock,
            shardstock::LoadOptions::new(a.segments)
                .replace(a.replace)
                .per_user_limit(limit)
                .outbox(a.outbox.unwrap_or(engine.options().outbox)),
        )
        .await?;
    let store = engine.store().name();
    if json {
        #[derive(Serialize)]
        struct Loaded<'a> {
            sku: &'a str,
            generation: u64,
            stock: u64,
            segments: u32,
            store: &'static str,
        }
        print_json(&Loaded {
            sku: sku.as_str(),
            generation,
            stock: a.stock,
            segments: a.segments,
            store,
        })?;
    } else {
        say!(
            "loaded {sku}: {} units in {} segments (generation {generation}, {store} store)",
            a.stock,
            a.segments
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_restock<S: Store>(
    engine: Engine<S>,
    a: RestockArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let sku = Sku::new(&a.sku)?;
    let request_id = match &a.request_id {
        Some(r) => RequestId::new(r)?,
        None => RequestId::new(format!("restock-{}", unique_stem()))?,
    };
    let r = engine.restock(&sku, a.qty, &request_id).await?;
    if json {
        #[derive(Serialize)]
        struct Out<'a> {
            sku: &'a str,
            request_id: &'a str,
            qty: u64,
            added: u64,
            replayed: bool,
            store: &'static str,
        }
        print_json(&Out {
            sku: sku.as_str(),
            request_id: request_id.as_str(),
            qty: a.qty,
            added: r.added,
            replayed: r.replayed,
            store: engine.store().name(),
        })?;
    } else if r.replayed {
        say!("restock {request_id} of {sku} was applied before: nothing added");
    } else if r.added < a.qty {
        say!(
            "restocked {sku}: added {} of {} units (request {request_id}; the rest was applied before)",
            r.added,
            a.qty
        );
    } else {
        say!(
            "restocked {sku}: added {} units (request {request_id})",
            r.added
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_status<S: Store>(
    engine: Engine<S>,
    a: SkuArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let sku = Sku::new(&a.sku)?;
    // One read of every segment (nothing written, so it answers while a master refuses
    // writes): the figures below all come from it and add up as the audit's do.
    let audit = engine.audit(&sku).await?;
    let homes = engine.placement(&sku).await?;
    #[derive(serde::Serialize)]
    struct Status<'a> {
        sku: &'a str,
        store: &'static str,
        strategy: shardstock::Strategy,
        generation: u64,
        /// Units a buyer can be sold now (stock, plus units of expired reservations on their
        /// way back: a sale returns those first).
        remaining: u64,
        remaining_per_segment: &'a [u64],
        /// Units moving between segments (credited home within a round trip, or by a sweeper).
        in_transit: u64,
        /// Units held by live reservations.
        reserved: u64,
        /// Of `remaining`, units of reservations past their expiry, not returned yet.
        expired: u64,
        sold: u64,
        loaded: u64,
        restocked: u64,
        /// The conservation audit of the same read passed.
        audit_ok: bool,
        /// On a cluster: each segment's hash tag, slot and current master.
        #[serde(skip_serializing_if = "Option::is_none")]
        placement: Option<&'a [shardstock::placement::SegmentHome]>,
    }
    let per_segment = audit.sellable_per_segment();
    let st = Status {
        sku: sku.as_str(),
        store: engine.store().name(),
        strategy: engine.store().strategy(),
        generation: audit.generation,
        remaining: per_segment.iter().sum(),
        remaining_per_segment: &per_segment,
        in_transit: audit.in_transit,
        reserved: audit.live_reserved(),
        expired: audit.expired,
        sold: audit.sold,
        loaded: audit.loaded,
        restocked: audit.restocked,
        audit_ok: audit.ok,
        placement: homes.as_deref(),
    };
    if json {
        print_json(&st)?;
    } else {
        say!(
            "{} (generation {}, {} store, strategy {}): remaining {}{}, in transit {}, reserved {}, sold {} of {} loaded + {} restocked (audit {})",
            st.sku,
            st.generation,
            st.store,
            st.strategy,
            st.remaining,
            if st.expired > 0 {
                format!(
                    " ({} of them from expired reservations, on their way back)",
                    st.expired
                )
            } else {
                String::new()
            },
            st.in_transit,
            st.reserved,
            st.sold,
            st.loaded,
            st.restocked,
            if st.audit_ok {
                "ok"
            } else {
                "FAILED: run `shardstock audit`"
            }
        );
        for (i, units) in per_segment.iter().enumerate() {
            match homes.as_ref().and_then(|h| h.get(i)) {
                Some(h) => say!(
                    "  segment {i:>4}: {units:>10}   slot {:>5} on {}   tag {{{}}}",
                    h.slot,
                    h.master.as_deref().unwrap_or("(no master)"),
                    h.tag
                ),
                None => say!("  segment {i:>4}: {units}"),
            }
        }
        if let Some(h) = &homes {
            let mut per: std::collections::BTreeMap<&str, u32> = Default::default();
            for s in h {
                *per.entry(s.master.as_deref().unwrap_or("(no master)"))
                    .or_default() += 1;
            }
            let spread: Vec<String> = per.iter().map(|(m, n)| format!("{m}: {n}")).collect();
            say!("  segments per master: {}", spread.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_audit<S: Store>(
    engine: Engine<S>,
    a: SkuArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let sku = Sku::new(&a.sku)?;
    let audit = engine.audit(&sku).await?;
    if json {
        print_json(&audit)?;
    } else {
        say!(
            "sku {}  generation {}  ({} store)",
            audit.sku,
            audit.generation,
            engine.store().name()
        );
        say!(
            "loaded {}  restocked {}  remaining {}  in transit {}  reserved {}{}  sold {}",
            audit.loaded,
            audit.restocked,
            audit.remaining,
            audit.in_transit,
            audit.reserved,
            if audit.expired > 0 {
                format!(" (expired, on their way back: {})", audit.expired)
            } else {
                String::new()
            },
            audit.sold
        );
        // Per segment, what came in = where it is: `loaded + restocked + moved in = remaining
        // + reserved + sold + moved out` (SegmentState::balance); units a transfer moved show
        // at both ends.
        say!(
            "{:>7} {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} {:>10}  ok",
            "segment",
            "loaded",
            "restocked",
            "moved in",
            "remaining",
            "reserved",
            "sold",
            "moved out"
        );
        for s in &audit.segments {
            let st = &s.state;
            say!(
                "{:>7} {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} {:>10}  {}",
                s.index,
                st.loaded,
                st.restocked,
                st.moved_in,
                st.stock,
                st.reserved,
                st.sold,
                st.moved_out,
                if s.ok { "yes" } else { "NO" }
            );
        }
        if audit.ok {
            say!("audit: ok");
        } else {
            say!("audit: FAILED");
            for p in &audit.problems {
                say!("  - {p}");
            }
        }
    }
    Ok(if audit.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::failure::CHECK_FAILED)
    })
}
