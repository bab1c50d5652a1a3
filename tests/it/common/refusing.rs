//! A store whose chosen segments refuse every call before it runs, as a Redis master below its
//! `min-replicas-to-write` does ([`Error::NoReplicas`]: nothing ran): the engine's handling of
//! refusals, deterministically, over another store (the memory store). SKU-wide calls (load,
//! metadata) go through.
#![allow(dead_code)]

use shardstock::Error;
use shardstock::ids::{RequestId, Sku, UserId};
use shardstock::placement::{Placement, SegmentHome};
use shardstock::store::{
    DueHold, DueTransfer, HomeRecord, LoadBegin, LoadSpec, Meta, ReservationAction, ReserveEnd,
    RestockReply, SegAddr, SegmentLoad, SellArgs, SellReply, SettleReply, Store, Survey,
    TransferArgs, TransferId, TransferReply,
};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

type Result<T> = shardstock::Result<T>;

/// `inner`, with the segments in `down` refusing.
#[derive(Clone)]
pub struct Refusing<S> {
    inner: S,
    down: Arc<Mutex<BTreeSet<u32>>>,
    /// Calls refused so far.
    refused: Arc<Mutex<u64>>,
}

impl<S: Store> Refusing<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            down: Arc::default(),
            refused: Arc::default(),
        }
    }

    /// From now on exactly these segments refuse.
    pub fn set_down(&self, segments: &[u32]) {
        *self.down.lock().unwrap() = segments.iter().copied().collect();
    }

    /// Calls refused so far.
    pub fn refused(&self) -> u64 {
        *self.refused.lock().unwrap()
    }

    /// `call` at segment `index`, unless it refuses: then `NoReplicas` and `call` never runs.
    fn gated<T>(
        &self,
        index: u32,
        call: impl Future<Output = Result<T>> + Send,
    ) -> impl Future<Output = Result<T>> + Send {
        let gate = self.gate(index);
        async move {
            gate?;
            call.await
        }
    }

    fn gate(&self, index: u32) -> Result<()> {
        if self.down.lock().unwrap().contains(&index) {
            *self.refused.lock().unwrap() += 1;
            return Err(Error::NoReplicas(format!("segment {index} refused (test)")));
        }
        Ok(())
    }
}

impl<S: Store + Clone> Store for Refusing<S> {
    fn name(&self) -> &'static str {
        "refusing"
    }

    fn segment_homes(
        &self,
        sku: &Sku,
        placement: &Placement,
        segments: u32,
    ) -> impl Future<Output = Result<Option<Vec<SegmentHome>>>> + Send {
        self.inner.segment_homes(sku, placement, segments)
    }

    fn load_begin(
        &self,
        sku: &Sku,
        spec: LoadSpec,
    ) -> impl Future<Output = Result<LoadBegin>> + Send {
        self.inner.load_begin(sku, spec)
    }

    fn load_segment(
        &self,
        seg: SegAddr<'_>,
        load: SegmentLoad,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.gated(seg.index, self.inner.load_segment(seg, load))
    }

    fn drop_segment(
        &self,
        seg: SegAddr<'_>,
        replaces: u64,
    ) -> impl Future<Output = Result<()>> + Send {
        self.gated(seg.index, self.inner.drop_segment(seg, replaces))
    }

    fn load_commit(&self, sku: &Sku, generation: u64) -> impl Future<Output = Result<bool>> + Send {
        self.inner.load_commit(sku, generation)
    }

    fn meta(&self, sku: &Sku) -> impl Future<Output = Result<Option<Meta>>> + Send {
        self.inner.meta(sku)
    }

    fn skus(&self) -> impl Future<Output = Result<Vec<Sku>>> + Send {
        self.inner.skus()
    }

    fn sell(
        &self,
        home: SegAddr<'_>,
        req: SellArgs<'_>,
    ) -> impl Future<Output = Result<SellReply>> + Send {
        self.gated(home.index, self.inner.sell(home, req))
    }

    fn transfer(
        &self,
        donor: SegAddr<'_>,
        t: TransferArgs,
    ) -> impl Future<Output = Result<TransferReply>> + Send {
        self.gated(donor.index, self.inner.transfer(donor, t))
    }

    fn transfer_done(
        &self,
        donor: SegAddr<'_>,
        id: TransferId,
    ) -> impl Future<Output = Result<()>> + Send {
        self.gated(donor.index, self.inner.transfer_done(donor, id))
    }

    fn transfers_due(
        &self,
        donor: SegAddr<'_>,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DueTransfer>>> + Send {
        self.gated(donor.index, self.inner.transfers_due(donor, max))
    }

    fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<RestockReply>> + Send {
        self.gated(
            seg.index,
            self.inner.restock(seg, request_id, qty, total, ttl_ms),
        )
    }

    fn reserve_end(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> impl Future<Output = Result<ReserveEnd>> + Send {
        self.gated(
            home.index,
            self.inner.reserve_end(home, user, request_id, action),
        )
    }

    fn settle(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        qty: u64,
        post: bool,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<SettleReply>> + Send {
        self.gated(
            home.index,
            self.inner.settle(home, user, request_id, qty, post, ttl_ms),
        )
    }

    fn holds_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DueHold>>> + Send {
        self.gated(seg.index, self.inner.holds_due(seg, max))
    }

    /// Order records live in no segment: never refused here.
    fn order(
        &self,
        id: &shardstock::cart::OrderId,
        step: shardstock::cart::OrderStep<'_>,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<shardstock::cart::OrderReply>> + Send {
        self.inner.order(id, step, ttl_ms)
    }

    fn survey(
        &self,
        seg: SegAddr<'_>,
        detail: bool,
    ) -> impl Future<Output = Result<Option<Survey>>> + Send {
        self.gated(seg.index, self.inner.survey(seg, detail))
    }

    /// Reads go through: a master below its `min-replicas-to-write` still runs `no-writes`
    /// scripts.
    fn peek(
        &self,
        seg: SegAddr<'_>,
        detail: bool,
    ) -> impl Future<Output = Result<Option<Survey>>> + Send {
        self.inner.peek(seg, detail)
    }

    fn record(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<HomeRecord>>> + Send {
        self.gated(home.index, self.inner.record(home, user, request_id))
    }
}
