//! A line diff of two JSON documents, for version history and the audit log.

use leptos::prelude::*;
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

fn pretty(v: &Option<Value>) -> String {
    v.as_ref()
        .map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
        .unwrap_or_default()
}

/// Before and after as one diff block; unchanged runs longer than a few lines are folded.
#[component]
pub fn JsonDiff(before: Option<Value>, after: Option<Value>) -> impl IntoView {
    let a = pretty(&before);
    let b = pretty(&after);
    let a_lines: Vec<&str> = if a.is_empty() {
        Vec::new()
    } else {
        a.lines().collect()
    };
    let b_lines: Vec<&str> = if b.is_empty() {
        Vec::new()
    } else {
        b.lines().collect()
    };
    let ops = diff_lines(&a_lines, &b_lines);
    let near_change = |k: usize| {
        let lo = k.saturating_sub(3);
        let hi = (k + 4).min(ops.len());
        ops[lo..hi].iter().any(|(op, _)| *op != Op::Same)
    };
    let mut rows = Vec::new();
    let mut folded = 0;
    for (k, (op, line)) in ops.iter().enumerate() {
        if *op == Op::Same && !near_change(k) {
            folded += 1;
            continue;
        }
        if folded > 0 {
            rows.push(view! { <div class="diff-fold">{format!("⋯ {folded} unchanged line{}", if folded == 1 { "" } else { "s" })}</div> }.into_any());
            folded = 0;
        }
        let (class, mark) = match op {
            Op::Same => ("diff-line", " "),
            Op::Added => ("diff-line add", "+"),
            Op::Removed => ("diff-line del", "−"),
        };
        rows.push(view! { <div class=class><span class="diff-mark">{mark}</span>{line.to_string()}</div> }.into_any());
    }
    if folded > 0 {
        rows.push(
            view! { <div class="diff-fold">{format!("⋯ {folded} unchanged lines")}</div> }
                .into_any(),
        );
    }
    view! { <div class="diff">{rows}</div> }
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
