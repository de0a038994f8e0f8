//! A line diff of two JSON documents, for version history and the audit log. Which lines
//! show and which fold is decided in `sluice_dashboard_model::diff`; this draws it.

use leptos::prelude::*;
use serde_json::Value;
use sluice_dashboard_model::diff::{Op, Row, fold_label, pretty, rows};

/// Before and after as one diff block; unchanged runs longer than a few lines are folded.
#[component]
pub fn JsonDiff(before: Option<Value>, after: Option<Value>) -> impl IntoView {
    let a = pretty(&before);
    let b = pretty(&after);
    let rows = rows(&a, &b)
        .into_iter()
        .map(|row| match row {
            Row::Fold(n) => view! { <div class="diff-fold">{fold_label(n)}</div> }.into_any(),
            Row::Line(op, line) => {
                let (class, mark) = match op {
                    Op::Same => ("diff-line", " "),
                    Op::Added => ("diff-line add", "+"),
                    Op::Removed => ("diff-line del", "−"),
                };
                view! { <div class=class><span class="diff-mark">{mark}</span>{line.to_string()}</div> }
                    .into_any()
            }
        })
        .collect::<Vec<_>>();
    view! { <div class="diff">{rows}</div> }
}
