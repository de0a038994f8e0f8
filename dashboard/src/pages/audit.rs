//! The audit log: who changed what, when, with the before and after of each change.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::{self, AuditList};
use crate::components::{Empty, load, show};
use crate::diff::JsonDiff;
use crate::format;

#[component]
pub fn Audit() -> impl IntoView {
    let entries = load(Some(15_000), || {
        api::get::<AuditList>("/api/v1/audit?limit=200")
    });
    let query = use_query_map();
    let filter = RwSignal::new(
        query
            .with_untracked(|q| q.get("target"))
            .unwrap_or_default(),
    );
    view! {
        <div class="page">
            <div class="page-head">
                <div>
                    <h1>"Audit log"</h1>
                    <p class="muted">"Every change, by whom, newest first. Open an entry for its before and after."</p>
                </div>
                <input type="search" class="search" placeholder="Filter by rule, token or action" bind:value=filter aria-label="Filter" />
            </div>
            {show(entries, move |list| {
                let needle = filter.get().to_lowercase();
                let rows: Vec<_> = list.entries.into_iter().filter(|e| {
                    needle.is_empty()
                        || e.action.to_lowercase().contains(&needle)
                        || e.actor_name.to_lowercase().contains(&needle)
                        || e.target.as_deref().unwrap_or("").to_lowercase().contains(&needle)
                }).collect();
                if rows.is_empty() {
                    return view! { <Empty title="No entries">"Nothing has been changed yet, or nothing matches the filter."</Empty> }.into_any();
                }
                view! {
                    <section class="card flush">
                        <div class="audit" data-test="audit">
                            {rows.into_iter().map(|e| {
                                let has_body = e.before.is_some() || e.after.is_some();
                                view! {
                                    <details class="audit-entry">
                                        <summary>
                                            <span class="audit-when" title=format::timestamp(&e.at)>{format::ago(&e.at)}</span>
                                            <span class="audit-who">{e.actor_name.clone()}</span>
                                            <span class="badge">{e.action.clone()}</span>
                                            <span class="mono">{e.target.clone().unwrap_or_default()}</span>
                                            {e.version.map(|v| view! { <span class="muted small">"→ v"{v}</span> })}
                                        </summary>
                                        {if has_body {
                                            view! { <JsonDiff before=e.before after=e.after /> }.into_any()
                                        } else {
                                            view! { <p class="muted small">"No details recorded."</p> }.into_any()
                                        }}
                                    </details>
                                }
                            }).collect_view()}
                        </div>
                    </section>
                }.into_any()
            })}
        </div>
    }
}
