//! The state read after each step of a differential case ([`World::snapshot`]): every segment
//! peeked and surveyed, the transfers and order items due at each, every record of the
//! generation, the case's orders and the metadata; the invariants checked on the way.

use super::carts::holds_line;
use super::*;
use shardstock::store::{ItemState, RecordState};

impl<S: Store> World<S> {
    /// The state after a step, as lines: each segment surveyed (`survey`: false after an
    /// advance, so expired reservations stay for the next step to return), the transfers due
    /// at each, the record of every request sent in this generation, and the metadata. Checks
    /// the invariants on the way.
    pub async fn snapshot(&mut self, survey: bool) -> Vec<String> {
        let mut lines = Vec::new();
        let meta = self.store.meta(&self.sku).await;
        self.err("meta", &meta);
        if let Ok(Some(m)) = &meta {
            let name = self.gen_name(m.generation);
            lines.push(format!(
                "  meta {name} segments {} loaded {} ready {} limit {} outbox {} hf {}",
                m.segments, m.loaded, m.ready, m.user_limit, m.outbox_segments, m.home_fn,
            ));
        }
        let Some(g) = self.cur.clone() else {
            return lines;
        };
        let sku = self.sku.clone();
        let segs: Vec<u32> = (0..g.segments).collect();
        // What the audit reads (writes nothing, so it sees expired reservations not yet
        // returned, after an `Advance`), before the survey returns them.
        let peeks = segs
            .iter()
            .map(|i| self.store.peek(Self::at(&sku, &g, *i), true));
        for (i, p) in join_all(peeks).await.into_iter().enumerate() {
            self.err("peek", &p);
            if let Ok(Some(p)) = &p {
                let st = p.state;
                if !st.balances() || p.held != st.reserved || p.orphans > 0 || p.expired > p.held {
                    self.bad.push(format!(
                        "[peek] segment {i}: {p:?} (balanced; held = reserved, expired among them; no orphans)"
                    ));
                }
            }
            lines.push(format!("  peek {i}: {p:?}"));
        }
        if survey {
            let reads = segs
                .iter()
                .map(|i| self.store.survey(Self::at(&sku, &g, *i), true));
            let surveys = join_all(reads).await;
            let (mut out, mut inn) = (0u64, 0u64);
            for (i, s) in surveys.into_iter().enumerate() {
                self.err("survey", &s);
                match s {
                    Ok(Some(s)) => {
                        let st = s.state;
                        if !st.balances() || s.held != st.reserved || s.orphans > 0 {
                            self.bad.push(format!(
                                "[balance] segment {i}: {s:?} (loaded + restocked + moved_in must equal stock + reserved + sold + moved_out; held = reserved; no orphans)"
                            ));
                        }
                        out += st.moved_out;
                        inn += st.moved_in;
                        lines.push(format!("  seg {i}: {s:?}"));
                    }
                    other => {
                        self.bad.push(format!(
                            "[missing] segment {i} of the current generation: {other:?}"
                        ));
                        lines.push(format!("  seg {i}: {other:?}"));
                    }
                }
            }
            if inn > out {
                self.bad.push(format!(
                    "[transit] {inn} units credited by transfers but only {out} debited"
                ));
            }
        }
        let dues = segs
            .iter()
            .map(|i| self.store.transfers_due(Self::at(&sku, &g, *i), 1000));
        for (i, d) in join_all(dues).await.into_iter().enumerate() {
            self.err("transfers_due", &d);
            if let Ok(d) = &d {
                self.check_due_order(d);
            }
            if let Ok(d) = d
                && !d.is_empty()
            {
                lines.push(format!("  due @{i}: {}", due_line(d)));
            }
        }
        let holds = segs
            .iter()
            .map(|i| self.store.holds_due(Self::at(&sku, &g, *i), 1000));
        let mut due_items = Vec::new();
        for (i, d) in join_all(holds).await.into_iter().enumerate() {
            self.err("holds_due", &d);
            if let Ok(d) = d
                && !d.is_empty()
            {
                due_items.extend(d.iter().map(|h| (i as u32, h.clone())));
                lines.push(format!("  holds due @{i}: {}", holds_line(d)));
            }
        }
        let mut asked: Vec<(u32, UserId, RequestId)> = g
            .sent
            .iter()
            .chain(&g.items)
            .map(|s| (s.seg, s.user.clone(), s.rid.clone()))
            .collect();
        asked.sort();
        asked.dedup();
        let reads = asked
            .iter()
            .map(|(seg, u, r)| self.store.record(Self::at(&sku, &g, *seg), u, r));
        let records = join_all(reads).await;
        let mut shown = Vec::new();
        // Every item due is held, of its qty (holds_due passes over items no longer held).
        for (seg, h) in &due_items {
            let rec = asked
                .iter()
                .position(|k| (&k.0, &k.1, &k.2) == (seg, &h.user, &h.request_id))
                .and_then(|k| records[k].as_ref().ok().cloned().flatten());
            if rec.as_ref().map(|r| (r.state, r.qty))
                != Some((RecordState::Item(ItemState::Held), h.qty))
            {
                self.bad.push(format!(
                    "[holds-due] {h:?} due at {seg}, its record {rec:?} (an item held of its qty)"
                ));
            }
        }
        for ((seg, u, r), rec) in asked.iter().zip(records) {
            self.err("record", &rec);
            match rec {
                Ok(None) => {}
                other => shown.push(format!("{u}/{r}@{seg}={other:?}")),
            }
        }
        if !shown.is_empty() {
            lines.push(format!("  records {}", shown.join(" ")));
        }
        if let Some(o) = self.read_orders().await {
            lines.push(o);
        }
        lines
    }
}
