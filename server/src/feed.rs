//! The run list's feed that every stream of `GET /api/v1/events` shares (read and
//! polled in [`crate::api::views`]): a leaf the server's state holds.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

impl std::fmt::Debug for RunsFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsFeed").finish_non_exhaustive()
    }
}

/// The run list's state as `GET /api/v1/events` reports it (run counts per phase and
/// the phases of the newest 200), read by one task every [`crate::api::views::EVENT_INTERVAL`] for all the
/// streams open, and not read at all while none is.
#[derive(Default)]
pub struct RunsFeed {
    pub(crate) sender: std::sync::OnceLock<Arc<watch::Sender<Option<Reading>>>>,
    /// A new stream found no current reading: read now, for it and any other.
    pub(crate) wanted: tokio::sync::Notify,
}

/// One reading of the feed: when it was taken and what it said (`Null`: the server is
/// stopping, and the streams end).
pub(crate) type Reading = (tokio::time::Instant, Arc<Value>);
