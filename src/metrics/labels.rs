//! The label values: bounded by construction. Labels are outcomes, strategies, error kinds,
//! script names and reservation events (small fixed sets), segment indexes and, for per-SKU
//! gauges, only SKUs the service opted in to (see [`SkuLabels`]); never a user or request id.
//!
//! It names the fixed sets ([`OUTCOMES`], [`STRATEGIES`], [`ERROR_KINDS`]), maps an error kind
//! to its label ([`error_label`]) and chooses which SKUs get a label of their own. It imports
//! only `crate::error` (the kinds it labels); tests beside `Deduction` and `Strategy` keep
//! their lists in step with these.

/// Which SKUs get their own label value: an explicit list, or the first `cap` seen.
#[derive(Debug, Default)]
pub struct SkuLabels {
    allow: Vec<String>,
    cap: usize,
    seen: dashmap::DashSet<String>,
    /// Per labelled SKU, how many per-segment gauges were last set: a SKU reloaded with fewer
    /// segments (or vanished) zeroes the others rather than leave their old figures.
    segments: dashmap::DashMap<String, usize>,
}

impl SkuLabels {
    /// Label these SKUs, plus up to `cap` more on first sight; the rest get `"other"`, for which
    /// the per-SKU gauges report nothing (a figure summed over unrelated SKUs would mean
    /// nothing).
    pub fn new(allow: Vec<String>, cap: usize) -> Self {
        Self {
            allow,
            cap,
            seen: dashmap::DashSet::new(),
            segments: dashmap::DashMap::new(),
        }
    }

    /// The label value for `sku`: the SKU itself, or `"other"` when it is not opted in.
    pub fn label(&self, sku: &str) -> String {
        if self.allow.iter().any(|a| a == sku) || self.seen.contains(sku) {
            return sku.to_string();
        }
        if self.seen.len() < self.cap {
            self.seen.insert(sku.to_string());
            return sku.to_string();
        }
        "other".to_string()
    }

    /// Records that `label`'s per-segment gauges now cover `segments` segments; how many they
    /// covered before (0 the first time).
    pub(super) fn swap_segments(&self, label: String, segments: usize) -> usize {
        self.segments.insert(label, segments).unwrap_or(0)
    }
}

/// Every [`Deduction::kind`](crate::Deduction::kind), in the order of
/// [`Deduction::kind_index`](crate::Deduction) (the `outcome` label of
/// [`DEDUCTIONS`](super::DEDUCTIONS); a test beside `Deduction` keeps the two in step).
pub(crate) const OUTCOMES: [&str; 7] = [
    "applied",
    "replayed",
    "sold_out",
    "insufficient",
    "limit_reached",
    "user_busy",
    "over_limit",
];

/// Every strategy's name, in the order of `Strategy::ALL` (the `strategy` label; a test beside
/// `Strategy` keeps the two in step).
pub(crate) const STRATEGIES: [&str; 6] = [
    "lua",
    "lock",
    "redlock",
    "decr-compensate",
    "local-mutex",
    "naive",
];

/// Every value of the `kind` label of [`ERRORS`](super::ERRORS) (exporters may pre-register
/// them at zero).
pub const ERROR_KINDS: [&str; 9] = [
    "redis",
    "not_durable",
    "no_replicas",
    "lease_lost",
    "conflict",
    "invalid",
    "not_loaded",
    "not_ready",
    "other",
];

/// The `kind` label of [`ERRORS`](super::ERRORS) for an error of kind `kind`: one of
/// [`ERROR_KINDS`]. The label set is coarser than [`ErrorKind`](crate::error::ErrorKind) (the
/// rare kinds share `other`) and its names predate it; both are kept so existing dashboards and
/// alerts go on matching.
pub fn error_label(kind: crate::error::ErrorKind) -> &'static str {
    use crate::error::ErrorKind as K;
    match kind {
        K::Redis => "redis",
        K::NotDurable => "not_durable",
        K::NoReplicas => "no_replicas",
        K::LeaseLost => "lease_lost",
        K::RequestIdConflict => "conflict",
        K::InvalidInput => "invalid",
        // The SKU is not loaded: buyers early for a sale, not a failure of the service (the
        // error-rate alert leaves it out, like invalid input).
        K::NotLoaded => "not_loaded",
        // Its load is under way: a moment in a reload, for good when a loader died mid-load
        // (the live audit's not-ready gauge and its alert tell those apart).
        K::NotReady => "not_ready",
        K::AlreadyLoaded | K::Config | K::Protocol | K::Postgres | K::Permission => "other",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_error_kind_has_a_listed_label() {
        for kind in crate::error::ErrorKind::ALL {
            assert!(
                super::ERROR_KINDS.contains(&super::error_label(kind)),
                "{kind}"
            );
        }
        for label in super::ERROR_KINDS {
            assert!(
                crate::error::ErrorKind::ALL
                    .iter()
                    .any(|k| super::error_label(*k) == label),
                "{label} is never used"
            );
        }
    }
}
