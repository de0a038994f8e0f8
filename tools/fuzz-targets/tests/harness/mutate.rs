//! The corpus test's mutator: new inputs made from the corpus by a few random edits, the
//! kind libFuzzer makes (a much smaller set, and without its coverage feedback).
//!
//! Everything comes from one seeded generator, so a seed names the same sequence of inputs
//! on every machine; how far a run gets into that sequence depends only on its time box.

/// xorshift64*: tiny, fast and good enough to pick positions and bytes; not for anything
/// that needs unpredictability.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64's finaliser, so that seeds differing in one bit start far apart, and
        // never the all-zero state, which xorshift never leaves.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0). The modulo bias is immaterial at these sizes.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
}

/// Integers at the edges where arithmetic and length checks go wrong: zero and one, the
/// signed and unsigned extremes of each width, and powers of two just past them.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX - 1,
    u64::MAX,
];

/// The same edges as text, for the many targets that read JSON or YAML, and the tokens that
/// change a value's type there.
const INTERESTING_TEXT: &[&str] = &[
    "0",
    "-1",
    "-0",
    "1e309",
    "0.5",
    "255",
    "256",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "null",
    "true",
    "\"\"",
    "[]",
    "{}",
    "\"\\u0000\"",
];

/// Makes inputs from a corpus.
#[derive(Debug)]
pub struct Mutator {
    rng: Rng,
    max_len: usize,
}

impl Mutator {
    /// Mutations never grow an input past `max_len` bytes.
    pub fn new(seed: u64, max_len: usize) -> Self {
        Mutator {
            rng: Rng::new(seed),
            max_len,
        }
    }

    /// The next input, into `out`: a copy of one corpus entry with one to five mutations
    /// stacked on it (libFuzzer's default depth), each picked uniformly from the kinds
    /// below. `corpus` must not be empty (an empty input is an entry like any other).
    pub fn next_input(&mut self, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&corpus[self.rng.below(corpus.len())]);
        for _ in 0..1 + self.rng.below(5) {
            self.mutate(corpus, out);
        }
        out.truncate(self.max_len);
    }

    fn mutate(&mut self, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        let rng = &mut self.rng;
        // Edits that need a byte to work on insert one into an empty input instead.
        if out.is_empty() {
            out.push(rng.byte());
            return;
        }
        let at = rng.below(out.len());
        match rng.below(8) {
            // Flip one bit: the smallest change, and the one length and flag fields notice.
            0 => out[at] ^= 1 << rng.below(8),
            // Replace one byte with any value.
            1 => out[at] = rng.byte(),
            // Insert one to eight bytes: random ones, or one byte repeated (a run of the
            // same byte reaches length limits and repeated separators).
            2 => {
                let len = 1 + rng.below(8);
                let repeated = rng.below(2) == 0;
                let first = rng.byte();
                let bytes: Vec<u8> = (0..len)
                    .map(|_| if repeated { first } else { rng.byte() })
                    .collect();
                out.splice(at..at, bytes);
            }
            // Delete a range of up to sixteen bytes.
            3 => {
                let len = 1 + rng.below(16.min(out.len() - at));
                out.drain(at..at + len);
            }
            // Duplicate a range: copy up to 64 bytes of the input to another place in it,
            // which repeats fields, list items and nesting.
            4 => {
                let len = 1 + rng.below(64.min(out.len() - at));
                let copy = out[at..at + len].to_vec();
                let to = rng.below(out.len() + 1);
                out.splice(to..to, copy);
            }
            // Splice two entries: this one's start, then another's end (or this one's own,
            // shifted), so parts of valid inputs meet in new combinations.
            5 => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[from..]);
            }
            // Overwrite 1, 2, 4 or 8 bytes with an interesting integer in either byte
            // order (the binary decoders read little-endian; big-endian costs nothing).
            6 => {
                let width = 1 << rng.below(4);
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    value.to_le_bytes()
                } else {
                    value.to_be_bytes()
                };
                let width = width.min(out.len() - at);
                out[at..at + width].copy_from_slice(&bytes[..width]);
            }
            // Replace the next number in the text with an interesting one (or a token of
            // another type), or insert it where the text has no digit from here on.
            _ => {
                let token = INTERESTING_TEXT[rng.below(INTERESTING_TEXT.len())].as_bytes();
                match out[at..].iter().position(u8::is_ascii_digit) {
                    Some(offset) => {
                        let start = at + offset;
                        let end = out[start..]
                            .iter()
                            .position(|b| !b.is_ascii_digit())
                            .map_or(out.len(), |len| start + len);
                        out.splice(start..end, token.iter().copied());
                    }
                    None => {
                        out.splice(at..at, token.iter().copied());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(seed: u64, corpus: &[Vec<u8>], count: usize) -> Vec<Vec<u8>> {
        let mut mutator = Mutator::new(seed, 64);
        (0..count)
            .map(|_| {
                let mut out = Vec::new();
                mutator.next_input(corpus, &mut out);
                out
            })
            .collect()
    }

    #[test]
    fn a_seed_names_one_sequence_of_inputs() {
        let corpus = vec![b"{\"a\": 12}".to_vec(), vec![0, 1, 2, 3]];
        assert_eq!(inputs(7, &corpus, 200), inputs(7, &corpus, 200));
        assert_ne!(inputs(7, &corpus, 200), inputs(8, &corpus, 200));
    }

    #[test]
    fn inputs_change_stay_within_the_length_and_survive_an_empty_corpus_entry() {
        let corpus = vec![Vec::new(), vec![0xaa; 60]];
        let made = inputs(1, &corpus, 2_000);
        assert!(made.iter().all(|input| input.len() <= 64));
        let changed = made.iter().filter(|input| !corpus.contains(input)).count();
        assert!(
            changed > 1_800,
            "only {changed} of 2000 inputs differ from the corpus"
        );
    }

    #[test]
    fn numbers_in_text_get_interesting_values() {
        let corpus = vec![b"{\"requests\": 10}".to_vec()];
        let made = inputs(3, &corpus, 20_000);
        assert!(
            made.iter()
                .any(|input| input == b"{\"requests\": 18446744073709551616}"),
            "no input replaced the number with 2^64"
        );
    }
}
