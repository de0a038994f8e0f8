//! The control service's decisions, apart from Envoy: when to ask the admin API for a
//! newer ruleset and what to make of its answer ([`follow`]), when to send the workers'
//! statistics and what to keep when the admin API cannot take them ([`reports`]), and the
//! sync of fleet-wide buckets ([`global`]).
//!
//! Each is a state machine with time passed in (ns since the Unix epoch) and HTTP answers
//! passed in as [`Answer`]s; each returns what to send and what happened, and the filter's
//! control service (`filter/src/control.rs`) only carries that to and from the host:
//! dispatching calls, reading shared data, publishing, logging and counting.

pub mod follow;
pub mod global;
pub mod reports;

/// An answer to one HTTP call to the admin API, as the host gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// `None`: the call failed (no connection, timed out, reset).
    pub status: Option<u16>,
    pub body: Option<&'a [u8]>,
}

impl<'a> Answer<'a> {
    pub const NONE: Answer<'static> = Answer {
        status: None,
        body: None,
    };

    pub fn new(status: Option<u16>, body: Option<&'a [u8]>) -> Self {
        Answer { status, body }
    }
}

/// Longest text the control service puts in a header to the admin API.
pub const MAX_HEADER_TEXT: usize = 300;

/// Header values must be visible ASCII: anything else becomes `?`, and long texts are cut
/// to [`MAX_HEADER_TEXT`] characters.
pub fn header_safe(text: &str) -> String {
    text.chars()
        .take(MAX_HEADER_TEXT)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_is_visible_ascii_and_bounded() {
        assert_eq!(header_safe("bad\nrule é"), "bad?rule ?");
        assert_eq!(header_safe(&"x".repeat(1000)).len(), MAX_HEADER_TEXT);
    }
}
