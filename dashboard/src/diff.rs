//! A line diff of two JSON documents, for version history and the audit log. The diff
//! itself lives in `sluice_dashboard_model::diff`; this draws it.

use leptos::prelude::*;
use serde_json::Value;
use sluice_dashboard_model::diff::{Op, diff_lines, pretty};

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
