//! A line diff of two JSON documents, for version history and the audit log.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Same,
    Added,
    Removed,
}

/// The longest-common-subsequence diff of two line lists (documents are small: rules).
pub fn diff_lines<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<(Op, &'a str)> {
    let (n, m) = (a.len(), b.len());
    // Past a few thousand lines a quadratic table is too big: show removal then addition.
    if n.saturating_mul(m) > 4_000_000 {
        return a
            .iter()
            .map(|l| (Op::Removed, *l))
            .chain(b.iter().map(|l| (Op::Added, *l)))
            .collect();
    }
    let mut lcs = vec![vec![0_u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(n + m);
    while i < n && j < m {
        if a[i] == b[j] {
            out.push((Op::Same, a[i]));
            i += 1;
            j += 1;
        } else if lcs[i + 1][j] >= lcs[i][j + 1] {
            out.push((Op::Removed, a[i]));
            i += 1;
        } else {
            out.push((Op::Added, b[j]));
            j += 1;
        }
    }
    out.extend(a[i..].iter().map(|l| (Op::Removed, *l)));
    out.extend(b[j..].iter().map(|l| (Op::Added, *l)));
    out
}

/// A JSON document as the lines a diff compares (empty for a missing one).
pub fn pretty(v: &Option<Value>) -> String {
    v.as_ref()
        .map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
        .unwrap_or_default()
}

/// How many unchanged lines stay visible on each side of a change.
const CONTEXT: usize = 3;

/// One row of a shown diff: a line, or a run of unchanged lines folded away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row<'a> {
    Line(Op, &'a str),
    Fold(usize),
}

/// The rows to show for two JSON documents (a missing one has no lines): every change with
/// [`CONTEXT`] unchanged lines around it, longer unchanged runs folded.
pub fn rows<'a>(before: &'a str, after: &'a str) -> Vec<Row<'a>> {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let ops = diff_lines(&a, &b);
    let near_change = |k: usize| {
        let lo = k.saturating_sub(CONTEXT);
        let hi = (k + CONTEXT + 1).min(ops.len());
        ops[lo..hi].iter().any(|(op, _)| *op != Op::Same)
    };
    let mut out = Vec::new();
    let mut folded = 0;
    for (k, (op, line)) in ops.iter().enumerate() {
        if *op == Op::Same && !near_change(k) {
            folded += 1;
            continue;
        }
        if folded > 0 {
            out.push(Row::Fold(folded));
            folded = 0;
        }
        out.push(Row::Line(*op, line));
    }
    if folded > 0 {
        out.push(Row::Fold(folded));
    }
    out
}

/// What a fold says: `⋯ 1 unchanged line`, `⋯ 5 unchanged lines`.
pub fn fold_label(lines: usize) -> String {
    format!(
        "⋯ {lines} unchanged line{}",
        if lines == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_is_a_removal_and_an_addition() {
        let a = ["{", "  \"requests\": 5", "}"];
        let b = ["{", "  \"requests\": 50", "}"];
        let ops: Vec<Op> = diff_lines(&a, &b).into_iter().map(|(op, _)| op).collect();
        assert_eq!(ops, [Op::Same, Op::Removed, Op::Added, Op::Same]);
    }

    #[test]
    fn an_identical_document_has_no_changes() {
        let a = ["{", "  \"a\": 1", "}"];
        assert!(diff_lines(&a, &a).iter().all(|(op, _)| *op == Op::Same));
        assert_eq!(diff_lines(&a, &a).len(), 3);
    }

    #[test]
    fn insertions_and_deletions_keep_the_common_lines() {
        let a = ["a", "b", "c", "d"];
        let b = ["a", "c", "d", "e"];
        assert_eq!(
            diff_lines(&a, &b),
            [
                (Op::Same, "a"),
                (Op::Removed, "b"),
                (Op::Same, "c"),
                (Op::Same, "d"),
                (Op::Added, "e"),
            ]
        );
        assert_eq!(diff_lines(&[], &b).len(), 4);
        assert!(diff_lines(&[], &b).iter().all(|(op, _)| *op == Op::Added));
        assert!(diff_lines(&a, &[]).iter().all(|(op, _)| *op == Op::Removed));
    }

    #[test]
    fn huge_documents_are_shown_as_removed_then_added() {
        let a: Vec<String> = (0..2_001).map(|i| format!("a{i}")).collect();
        let mut b = a.clone();
        b.push("new".into());
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let b: Vec<&str> = b.iter().map(String::as_str).collect();
        let ops = diff_lines(&a, &b);
        assert_eq!(
            ops.len(),
            a.len() + b.len(),
            "no quadratic table past 4M cells"
        );
        assert_eq!(ops[0], (Op::Removed, "a0"));
        assert_eq!(ops[a.len()], (Op::Added, "a0"));
    }

    #[test]
    fn documents_print_as_pretty_json() {
        assert_eq!(pretty(&None), "");
        assert_eq!(
            pretty(&Some(serde_json::json!({"requests": 5}))),
            "{\n  \"requests\": 5\n}"
        );
    }

    #[test]
    fn unchanged_runs_far_from_a_change_are_folded() {
        let lines: Vec<String> = (1..=12).map(|i| i.to_string()).collect();
        let with = |k: usize, text: &str| {
            let mut changed = lines.clone();
            changed[k] = text.to_string();
            changed.join("\n")
        };
        let before = lines.join("\n");
        let after = with(1, "two");
        let shown = rows(&before, &after);
        assert_eq!(shown[0], Row::Line(Op::Same, "1"));
        assert_eq!(shown[1], Row::Line(Op::Removed, "2"));
        assert_eq!(shown[2], Row::Line(Op::Added, "two"));
        assert_eq!(
            &shown[3..],
            [
                Row::Line(Op::Same, "3"),
                Row::Line(Op::Same, "4"),
                Row::Line(Op::Same, "5"),
                Row::Fold(7),
            ],
            "three lines of context after the change, then the rest folded"
        );
        let later = with(10, "eleven");
        let shown = rows(&before, &later);
        assert_eq!(shown[0], Row::Fold(7));
        assert_eq!(shown[1], Row::Line(Op::Same, "8"));
        assert_eq!(shown.last(), Some(&Row::Line(Op::Same, "12")));
    }

    #[test]
    fn a_new_document_is_all_additions_and_folds_read_naturally() {
        let shown = rows("", "{\n}");
        assert_eq!(
            shown,
            [Row::Line(Op::Added, "{"), Row::Line(Op::Added, "}")]
        );
        assert!(rows("same", "same").iter().all(|r| *r == Row::Fold(1)));
        assert_eq!(fold_label(1), "⋯ 1 unchanged line");
        assert_eq!(fold_label(4), "⋯ 4 unchanged lines");
    }
}
