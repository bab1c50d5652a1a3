//! What a cluster node says of its slots, read without I/O: who owns each slot range
//! (`CLUSTER SLOTS`), which slots a node has open for a migration (`CLUSTER NODES`), and how an
//! evacuation spreads the slots it moves over its targets.
//!
//! Pure functions of the replies, so the evacuation's decisions (is the source still the owner?
//! is a slot being resharded already? which target takes which slot?) are tested without a
//! cluster. Touches `error` (a reply it cannot read is [`Error::Protocol`]) and fred's `Value`.

use crate::error::{Error, Result};
use fred::types::Value;

/// The owner of each slot range, as one node's `CLUSTER SLOTS` answers it: (start, end,
/// owner's node id).
pub(super) fn parse_slots(v: &Value) -> Result<Vec<(u16, u16, String)>> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS answered {v:?}"));
    let Value::Array(ranges) = v else {
        return Err(bad());
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let Value::Array(r) = r else {
            return Err(bad());
        };
        let (Some(start), Some(end), Some(Value::Array(owner))) = (
            r.first().and_then(Value::as_u64),
            r.get(1).and_then(Value::as_u64),
            r.get(2),
        ) else {
            return Err(bad());
        };
        let id = owner.get(2).and_then(Value::as_string).ok_or_else(bad)?;
        let (Ok(start), Ok(end)) = (u16::try_from(start), u16::try_from(end)) else {
            return Err(bad());
        };
        out.push((start, end, id));
    }
    Ok(out)
}

/// The owner's id of `slot` in `ranges`.
pub(super) fn owner(ranges: &[(u16, u16, String)], slot: u16) -> Option<&str> {
    ranges
        .iter()
        .find(|(s, e, _)| (*s..=*e).contains(&slot))
        .map(|(_, _, id)| id.as_str())
}

/// The targets of `slots`, spread over `targets` in turn: (slot, target index).
pub(super) fn assign(slots: &[u16], targets: usize) -> Vec<(u16, usize)> {
    slots
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i % targets.max(1)))
        .collect()
}

/// The slots a node has open (`CLUSTER NODES`, its own line): `[<slot>->-<id>]` migrating to
/// `<id>`, `[<slot>-<-<id>]` importing from it. (slot, peer id, importing).
pub(super) fn open_slots(nodes: &str) -> Vec<(u16, String, bool)> {
    let Some(me) = nodes.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|f| f.split(',').any(|x| x == "myself"))
    }) else {
        return Vec::new();
    };
    me.split_whitespace()
        .filter_map(|f| f.strip_prefix('[')?.strip_suffix(']'))
        .filter_map(|f| {
            let (slot, importing, peer) = if let Some((s, p)) = f.split_once("->-") {
                (s, false, p)
            } else {
                let (s, p) = f.split_once("-<-")?;
                (s, true, p)
            };
            Some((slot.parse().ok()?, peer.to_string(), importing))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_parse_and_owner() {
        let node = |id: &str| Value::Array(vec!["127.0.0.1".into(), 7101.into(), id.into()]);
        let v = Value::Array(vec![
            Value::Array(vec![0.into(), 99.into(), node("a"), node("ra")]),
            Value::Array(vec![100.into(), 16383.into(), node("b")]),
        ]);
        let r = parse_slots(&v).unwrap();
        assert_eq!(owner(&r, 0), Some("a"));
        assert_eq!(owner(&r, 99), Some("a"));
        assert_eq!(owner(&r, 100), Some("b"));
        assert!(parse_slots(&Value::from("x")).is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![0.into()])])).is_err());
    }

    #[test]
    fn open_slots_are_read_from_the_nodes_own_line() {
        let nodes = "a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460 \
                     [77->-b2] [93-<-c3]\n\
                     b2 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922 [5-<-a1]\n";
        assert_eq!(
            open_slots(nodes),
            vec![(77, "b2".to_string(), false), (93, "c3".to_string(), true)]
        );
        assert!(
            open_slots("a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-16383\n")
                .is_empty()
        );
        assert!(open_slots("").is_empty());
    }

    #[test]
    fn slots_spread_over_targets_in_turn() {
        assert_eq!(assign(&[5, 6, 7], 2), vec![(5, 0), (6, 1), (7, 0)]);
        assert!(assign(&[], 3).is_empty());
    }
}
