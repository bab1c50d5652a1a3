//! The connection and the key names every script call of the Redis store runs on.

use super::lua::{self, Call, SegmentKeys};
use crate::cluster::wait;
use crate::error::Result;
use crate::segments::Keyspace;
use crate::store::SegAddr;
use fred::prelude::Pool;
use std::sync::Arc;

/// The connection and the key names: what every script call runs on.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(super) pool: Pool,
    pub(super) keys: Keyspace,
    /// Durability mode: replicas each mutating call waits for (`None`: off).
    pub(super) durable: Option<Arc<wait::Durable>>,
}

impl Conn {
    /// The keys of segment `seg`.
    pub(super) fn at<'a>(&'a self, seg: SegAddr<'a>) -> SegmentKeys<'a> {
        SegmentKeys {
            keys: &self.keys,
            seg,
        }
    }

    /// Runs `call` on the next client of the pool (in durability mode, with its `WAIT` on
    /// the same client).
    pub(super) async fn run<C: Call>(&self, call: C) -> Result<C::Output> {
        lua::run_durable(self.pool.next(), call, self.durable.as_ref()).await
    }
}
