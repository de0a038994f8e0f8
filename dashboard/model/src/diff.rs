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
}
