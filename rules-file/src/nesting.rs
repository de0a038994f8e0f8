//! How deep a JSON or YAML document nests, measured before it is parsed.
//!
//! A YAML parser given a document of deeply nested sequences (`[[[[...` or `- - - -...`)
//! within the admin API's 1 MiB body limit spends seconds before refusing it; a rules file
//! nests a handful of levels. [`nesting_depth`] is one linear pass over the text that
//! returns an upper estimate of the depth, so [`crate::parse_rules`] refuses a document
//! deeper than [`MAX_NESTING`] without parsing it.
//!
//! The estimate counts open flow collections (`[`, `{`) outside quoted scalars and
//! comments, plus the block structure of the current line: the indentation levels open
//! above it and its compact `- ` entries. It may overcount (a block scalar's deeper lines,
//! a quote character inside a plain scalar at the start of a flow entry), never
//! undercount: brackets inside quoted scalars or comments neither open nor close anything,
//! so closers hidden there cannot mask depth.

/// How deep a rules file may nest. A rule nests about eight levels (`rules`, the rule, its
/// `match`, a header list, a header, ...); 64 leaves room for any real file, and keeps a
/// hostile one cheap to refuse.
pub const MAX_NESTING: usize = 64;

/// Where a quoted scalar or comment being scanned ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inside {
    Plain,
    Double,
    Single,
    Comment,
}

/// An upper estimate of how deep `text` (JSON or YAML) nests: see the module's notes.
pub fn nesting_depth(text: &str) -> usize {
    // Every character that matters is ASCII, and no byte of a multi-byte UTF-8 character
    // is, so the bytes can be scanned directly.
    let bytes = text.as_bytes();
    let mut deepest = 0;
    let mut flow = 0usize;
    // The block indentation levels open above the current line.
    let mut indents: Vec<usize> = Vec::new();
    let mut inside = Inside::Plain;
    // Whether the next non-blank character starts a scalar (a quote there opens a quoted
    // scalar; elsewhere it is part of a plain one, `it's`).
    let mut scalar_start = true;
    let mut previous_blank = true;
    let mut i = 0;
    let mut line_start = true;
    while i < bytes.len() {
        if line_start && inside == Inside::Plain && flow == 0 {
            line_start = false;
            let (indent, entries, end) = block_prefix(bytes, i);
            i = end;
            if entries > 0 || !matches!(bytes.get(i), None | Some(b'\n' | b'#')) {
                while indents.last().is_some_and(|&open| open >= indent) {
                    indents.pop();
                }
                indents.push(indent);
                deepest = deepest.max(indents.len() + entries);
            }
            scalar_start = true;
            previous_blank = true;
            continue;
        }
        let c = bytes[i];
        i += 1;
        match (inside, c) {
            (Inside::Plain | Inside::Comment, b'\n') => {
                inside = Inside::Plain;
                line_start = true;
            }
            (Inside::Comment, _) => {}
            (Inside::Double, b'\\') => i += 1,
            (Inside::Double, b'"') | (Inside::Single, b'\'') => {
                inside = Inside::Plain;
                scalar_start = false;
            }
            (Inside::Double | Inside::Single, _) => {}
            (Inside::Plain, b'#') if previous_blank => inside = Inside::Comment,
            (Inside::Plain, b'"') if scalar_start => inside = Inside::Double,
            (Inside::Plain, b'\'') if scalar_start => inside = Inside::Single,
            (Inside::Plain, b'[' | b'{') => {
                flow += 1;
                deepest = deepest.max(indents.len() + flow);
                scalar_start = true;
            }
            (Inside::Plain, b']' | b'}') => {
                flow = flow.saturating_sub(1);
                scalar_start = false;
            }
            (Inside::Plain, b',' | b':' | b'?' | b'-') => scalar_start = true,
            (Inside::Plain, b' ' | b'\t' | b'\r') => {}
            (Inside::Plain, _) => scalar_start = false,
        }
        previous_blank = matches!(c, b' ' | b'\t' | b'\r' | b'\n');
    }
    deepest
}

/// A block line's prefix from `start`: its indentation, how many compact `- ` (or `? `)
/// entries open on it, and where the rest of the line begins.
fn block_prefix(bytes: &[u8], start: usize) -> (usize, usize, usize) {
    let mut i = start;
    while bytes.get(i) == Some(&b' ') {
        i += 1;
    }
    let indent = i - start;
    let mut entries = 0;
    while matches!(bytes.get(i), Some(b'-' | b'?'))
        && matches!(bytes.get(i + 1), None | Some(b' ' | b'\n'))
    {
        entries += 1;
        i += 1;
        while bytes.get(i) == Some(&b' ') {
            i += 1;
        }
    }
    (indent, entries, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate is never below the real depth, and (the top level counted as a
    /// block line too) at most one above it.
    #[track_caller]
    fn assert_depth(text: &str, real: usize) {
        let estimate = nesting_depth(text);
        assert!(
            (real..=real + 1).contains(&estimate),
            "estimated {estimate} for a depth of {real}: {text:?}"
        );
    }

    #[test]
    fn flow_and_block_nesting_are_counted() {
        assert_eq!(nesting_depth(""), 0);
        assert_depth("[1, [2, [3]]]", 3);
        assert_depth("{\"a\": {\"b\": [1]}}", 3);
        assert_depth(&"[".repeat(1000), 1000);
        assert_depth(&"- ".repeat(500), 500);
        assert_depth(&format!("{}x", "- ".repeat(500)), 500);
        let block = "rules:\n  - name: a\n    match:\n      headers:\n        - name: x\n";
        assert_depth(block, 6);
        let indented: String = (0..100).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        assert_depth(&indented, 100);
        // Comments and blank lines open nothing.
        assert_depth("a: 1\n\n        # deep comment\nb: 2\n", 1);
    }

    #[test]
    fn closers_in_quotes_and_comments_hide_nothing() {
        let hidden = "[[[ \"]]]\", [[[ ']]]', [[[ # ]]]\n [[[";
        assert_depth(hidden, 12);
        // A quote inside a plain scalar opens no quoted scalar.
        assert_depth("[it's, [a]]", 2);
        assert_depth("[\"a\\\"]\", [b]]", 2);
        // Multi-byte characters are skipped whole.
        assert_depth("[\"é]\", [\"ü\"]]", 2);
    }

    #[test]
    fn parse_rules_refuses_a_document_past_the_limit_unparsed() {
        use crate::{RulesFileError, RulesFormat, parse_rules};
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let origin = std::path::Path::new("body");
        for format in [RulesFormat::Json, RulesFormat::Yaml] {
            // The top level counts as one: MAX_NESTING - 1 brackets are within the limit,
            // parsed, and refused for their shape.
            let within = parse_rules(&nested(MAX_NESTING - 1), format, origin).unwrap_err();
            assert!(matches!(within, RulesFileError::Shape { .. }), "{within}");
            let over = parse_rules(&nested(MAX_NESTING), format, origin).unwrap_err();
            assert!(
                matches!(
                    over,
                    RulesFileError::TooDeep {
                        limit: MAX_NESTING,
                        ..
                    }
                ),
                "{over}"
            );
            assert!(over.to_string().contains("at most 64"), "{over}");
        }
    }
}
