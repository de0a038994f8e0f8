//! The live metrics streams (`/api/v1/metrics/stream`) open at once, bounded: each holds a
//! connection and a task for as long as its client likes, so a client with a read token
//! could otherwise open them until the server runs out of connections for everyone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::ApiError;

/// Streams open at once in all.
pub const MAX_STREAMS: usize = 128;
/// Streams open at once per token (a dashboard opens one per tab).
pub const MAX_STREAMS_PER_TOKEN: usize = 16;

/// The streams open now, by the id of the token that opened them.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream; closing it (dropping the slot with the stream) frees its place.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    streams: Arc<Streams>,
    token: String,
}

impl Streams {
    /// A place for one more stream of `token`, or 503 naming the limit reached.
    pub(crate) fn open(self: &Arc<Self>, token: &str) -> Result<StreamSlot, ApiError> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| ApiError::Internal("the streams' lock is poisoned".to_string()))?;
        if open.values().sum::<usize>() >= MAX_STREAMS {
            return Err(ApiError::Unavailable(format!(
                "{MAX_STREAMS} metric streams are open, the most the server holds: retry later"
            )));
        }
        let mine = open.entry(token.to_string()).or_default();
        if *mine >= MAX_STREAMS_PER_TOKEN {
            return Err(ApiError::Unavailable(format!(
                "this token has {MAX_STREAMS_PER_TOKEN} metric streams open, the most one \
                 token may: close one first"
            )));
        }
        *mine += 1;
        Ok(StreamSlot {
            streams: self.clone(),
            token: token.to_string(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.streams.open.lock()
            && let Some(n) = open.get_mut(&self.token)
        {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.token);
            }
        }
    }
}
