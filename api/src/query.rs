//! What query and path parameters share.

use serde::{Deserialize, Serialize};

/// The largest integer every JSON parser reads exactly (2^53 - 1): the document bounds
/// ids, versions, offsets and timestamps by it, and [`Whole`] checks it.
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// A non-negative integer parameter, at most [`MAX_SAFE_INTEGER`]: what the document
/// states for such parameters (`minimum: 0`, `maximum: 9007199254740991`), so that a
/// value the document allows is never refused and one it forbids never accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Whole(pub u64);

impl TryFrom<u64> for Whole {
    type Error = String;

    fn try_from(value: u64) -> Result<Whole, String> {
        if value > MAX_SAFE_INTEGER {
            Err(format!("must be at most {MAX_SAFE_INTEGER}"))
        } else {
            Ok(Whole(value))
        }
    }
}

impl From<Whole> for u64 {
    fn from(value: Whole) -> u64 {
        value.0
    }
}

impl Whole {
    /// As a signed integer, as the database and timestamps use (it always fits).
    pub fn signed(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}
