//! Nesting depth, measured before serde_json parses anything: a document of a million
//! `[` costs a scan, never a deep recursion.

use super::bounds::MAX_JSON_DEPTH;

/// Tracks the nesting depth of JSON bytes fed in pieces (brackets inside strings do not
/// count), remembering whether it ever went deeper than [`MAX_JSON_DEPTH`]. It does not
/// check syntax: serde_json does that afterwards.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DepthGauge {
    depth: u32,
    in_string: bool,
    escaped: bool,
    exceeded: bool,
}

impl DepthGauge {
    /// Measures the next piece; `false` once the bound has been exceeded.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> bool {
        if self.exceeded {
            return false;
        }
        for &byte in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth > MAX_JSON_DEPTH {
                        self.exceeded = true;
                        return false;
                    }
                }
                // Unbalanced closers are a syntax error serde_json reports; here they
                // only must not underflow.
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        true
    }

    /// Whether `bytes`, as one document, stays within the bound.
    pub(super) fn within_bound(bytes: &[u8]) -> bool {
        DepthGauge::default().feed(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> Vec<u8> {
        let mut doc = "[".repeat(depth).into_bytes();
        doc.extend("]".repeat(depth).into_bytes());
        doc
    }

    #[test]
    fn the_bound_itself_is_allowed_and_one_more_is_not() {
        assert!(DepthGauge::within_bound(&nested(MAX_JSON_DEPTH as usize)));
        assert!(!DepthGauge::within_bound(&nested(
            MAX_JSON_DEPTH as usize + 1
        )));
    }

    #[test]
    fn brackets_in_strings_do_not_count() {
        let doc = format!(r#"{{"text": "{}\"{}"}}"#, "[".repeat(500), "{".repeat(500));
        assert!(DepthGauge::within_bound(doc.as_bytes()));
    }

    #[test]
    fn pieces_split_anywhere_measure_the_same() {
        let doc = nested(MAX_JSON_DEPTH as usize + 1);
        let mut gauge = DepthGauge::default();
        let within = doc.chunks(1).all(|piece| gauge.feed(piece));
        assert!(!within);
        let doc = br#"{"a":"\\\"[[[[","b":[[]]}"#;
        for split in 0..doc.len() {
            let (head, tail) = doc.split_at(split);
            let mut gauge = DepthGauge::default();
            assert!(gauge.feed(head) && gauge.feed(tail));
            assert_eq!(gauge.depth, 0, "split at {split}");
        }
    }
}
