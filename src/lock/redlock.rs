//! RedLock over independent Redis nodes (placeholder API; implemented separately).
use crate::error::Result;
use std::time::Duration;

/// A lock over a quorum of independent nodes.
pub struct RedLock {}

impl RedLock {
    pub(crate) async fn connect(_urls: &[String]) -> Result<Self> {
        unimplemented!()
    }
    pub(crate) async fn try_lock(&self, _key: &str, _token: &str, _lease: Duration) -> Result<Option<Duration>> {
        unimplemented!()
    }
    pub(crate) async fn renew(&self, _key: &str, _token: &str, _lease: Duration) -> Result<bool> {
        unimplemented!()
    }
    pub(crate) async fn unlock(&self, _key: &str, _token: &str) -> Result<()> {
        unimplemented!()
    }
}
