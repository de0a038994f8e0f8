//! A rule, read-only, for a token that may read rules but not change them.

use leptos::prelude::*;
use leptos_router::components::A;
use sluice_core::spec::Mode;

use crate::api::RuleView;
use crate::format;

/// A rule, read-only: what a viewer sees.
#[component]
pub(super) fn RuleDetails(rule: RuleView) -> impl IntoView {
    let s = rule.spec.clone();
    let json = serde_json::to_string_pretty(&s).unwrap_or_default();
    view! {
        <div class="page narrow">
            <div class="crumbs"><A href="/rules">"Rules"</A>" / "{s.name.clone()}</div>
            <div class="page-head">
                <div>
                    <h1>{s.name.clone()}</h1>
                    <p class="muted">{if s.description.is_empty() { "No description.".to_string() } else { s.description.clone() }}</p>
                </div>
                <div class="head-tools">
                    <span class=if s.enabled { "badge good" } else { "badge" }>{if s.enabled { "Enabled" } else { "Disabled" }}</span>
                    <span class=if s.mode == Mode::Enforce { "badge" } else { "badge shadow" }>{match s.mode { Mode::Enforce => "Enforce", Mode::Shadow => "Shadow", Mode::Warn => "Warn" }}</span>
                </div>
            </div>
            <section class="card">
                <dl class="facts">
                    <dt>"Id"</dt><dd class="mono">{rule.id.clone()}</dd>
                    <dt>"Matches"</dt><dd>{format::matcher(&s.matcher)}</dd>
                    <dt>"Per"</dt><dd>{format::key(&s.key)}</dd>
                    <dt>"Without a key"</dt><dd data-test="key-missing">{format::key_missing(&s.key_missing)}</dd>
                    <dt>"Enforced for"</dt><dd data-test="rollout">{format::rollout(s.mode, s.enforce_percent)}</dd>
                    <dt>"Limits"</dt><dd>{format::limits(&s.limits)}</dd>
                    <dt>"Over the limit"</dt><dd data-test="on-limit">{format::on_limit(s.on_limit, s.delay.as_ref())}</dd>
                    {s.elastic.as_ref().map(|e| view! {
                        <dt>"Elastic"</dt><dd data-test="elastic">{format::elastic(e)}</dd>
                    })}
                    {s.tokens.as_ref().map(|t| view! {
                        <dt>"Token budget"</dt><dd data-test="token-budget">{format::token_budget(t)}</dd>
                    })}
                    <dt>"Priority"</dt><dd>{s.priority}</dd>
                    <dt>"Revision"</dt><dd>{rule.revision}" · changed "{format::ago(&rule.updated_at)}</dd>
                </dl>
            </section>
            <section class="card">
                <h2>"Per-client overrides"</h2>
                {if s.overrides.is_empty() {
                    view! { <p class="muted">"None: every client gets the limits above."</p> }.into_any()
                } else {
                    view! {
                        <table class="table">
                            <thead><tr><th>"Client"</th><th>"Limits"</th></tr></thead>
                            <tbody>{s.overrides.iter().map(|o| view! {
                                <tr><td class="mono">{o.client.clone()}</td><td>{format::limits(&o.limits)}</td></tr>
                            }).collect_view()}</tbody>
                        </table>
                    }.into_any()
                }}
            </section>
            <details class="card preview" open>
                <summary><h2>"As JSON"</h2></summary>
                <pre>{json}</pre>
            </details>
        </div>
    }
}
