//! The form's sections: the rule itself, which requests, whose bucket, limits, the token
//! budget and overrides, and the advanced settings (cost, failure mode, response).

use leptos::prelude::*;
use sluice_core::spec::{FailureMode, Mode};
use sluice_dashboard_model::draft::{
    CostKind, HeaderCondition, HeaderDraft, KeyKind, methods_field,
};

use super::delay::OnLimitFields;
use super::elastic::ElasticFields;
use super::identity::{
    KeyMissingFields, RolloutField, certificate_field, cookie_field, metadata_fields,
};
use super::inputs::{Field, number, select, text};
use super::limits::{Limits, Overrides};
use super::state::{CostInputs, FormState, HeaderRow, KeyInputs, KeyMissingInputs, MatchInputs};
use super::tokens::TokenBudgetSection;

const HEADER_CONDITIONS: &[(HeaderCondition, &str)] = &[
    (HeaderCondition::Present, "present"),
    (HeaderCondition::Absent, "absent"),
    (HeaderCondition::Equals, "equal to"),
];

const KEY_KINDS: &[(KeyKind, &str)] = &[
    (KeyKind::Header, "a request header"),
    (KeyKind::ClientIp, "the client IP"),
    (KeyKind::Query, "a query parameter"),
    (KeyKind::Path, "the path"),
    (KeyKind::Global, "everyone together (global)"),
    (KeyKind::Metadata, "verified identity (dynamic metadata)"),
    (KeyKind::PeerCertificate, "the mTLS peer certificate"),
    (KeyKind::Cookie, "a cookie"),
];

const COST_KINDS: &[(CostKind, &str)] = &[
    (CostKind::Fixed, "fixed"),
    (CostKind::Header, "from a request header"),
];

const MODES: &[(Mode, &str)] = &[
    (Mode::Enforce, "enforce"),
    (Mode::Shadow, "shadow: count what it would deny"),
    (Mode::Warn, "warn: tell clients they are over"),
];

const FAILURE_MODES: &[(Option<FailureMode>, &str)] = &[
    (None, "proxy default"),
    (Some(FailureMode::Open), "let requests through"),
    (Some(FailureMode::Closed), "deny"),
];

/// Every section of the form over `form`'s inputs.
#[component]
pub(super) fn FormBody(form: FormState, is_new: bool) -> impl IntoView {
    view! {
        <RuleSection form=form is_new=is_new />
        <MatchSection inputs=form.matcher />
        <KeySection key=form.key missing=form.key_missing />
        <section class="card">
            <h2>"Limits"</h2>
            <p class="muted small">"A token bucket per client and limit: it refills at requests/period and holds at most burst. A request must fit every limit."</p>
            <Limits rows=form.limits prefix="limits" />
            <OnLimitFields inputs=form.delay />
            <ElasticFields inputs=form.elastic />
        </section>
        <TokenBudgetSection form=form />
        <Overrides overrides=form.overrides />
        <AdvancedSection form=form />
    }
}

/// Name, id, description, priority, mode and whether the rule is enabled.
#[component]
fn RuleSection(form: FormState, is_new: bool) -> impl IntoView {
    let d = form;
    view! {
        <section class="card">
            <h2>"Rule"</h2>
            <div class="grid2">
                <Field label="Name" path="name" hint="letters, digits, - _ . (shown to clients)">
                    {text(d.name, "name", "api-per-key")}
                </Field>
                {if is_new {
                    view! {
                        <Field label="Id (optional)" path="id" hint="stable bucket identity; defaults to the name">
                            {text(d.id, "id", "")}
                        </Field>
                    }.into_any()
                } else {
                    view! {
                        <div class="field"><label>"Id"</label><div class="readonly mono">{move || if d.id.get().is_empty() { d.name.get() } else { d.id.get() }}</div>
                        <div class="field-hint">"kept when renaming, so clients keep their buckets"</div></div>
                    }.into_any()
                }}
            </div>
            <Field label="Description" path="description">
                {text(d.description, "description", "What this rule protects, and why")}
            </Field>
            <div class="grid3">
                <Field label="Priority" path="priority" hint="higher runs first">
                    {number(d.priority, "priority", "0")}
                </Field>
                <Field label="Mode" path="mode" hint="shadow and warn never deny">
                    {select(d.mode, Some("mode".into()), MODES)}
                </Field>
                <div class="field">
                    <label>"Status"</label>
                    <label class="check"><input type="checkbox" name="enabled" bind:checked=d.enabled />" Enabled"</label>
                </div>
            </div>
            <RolloutField percent=d.enforce_percent />
        </section>
    }
}

/// Which requests: paths, host, methods and header conditions.
#[component]
fn MatchSection(inputs: MatchInputs) -> impl IntoView {
    let m = inputs;
    let header_index = move |id: usize| {
        m.headers
            .with(|hs| hs.iter().position(|h| h.id == id).unwrap_or(0))
    };
    view! {
        <section class="card">
            <h2>"Which requests"</h2>
            <p class="muted small">"All given conditions must hold; leave everything empty to match every request."</p>
            <div class="grid2">
                <Field label="Path prefix" path="match.path_prefix">{text(m.path_prefix, "match.path_prefix", "/api/")}</Field>
                <Field label="Exact path" path="match.path_exact">{text(m.path_exact, "match.path_exact", "")}</Field>
                <Field label="Path regex" path="match.path_regex" hint="must match the whole path">{text(m.path_regex, "match.path_regex", "")}</Field>
                <Field label="Host" path="match.host">{text(m.host, "match.host", "api.example.com or *.example.com")}</Field>
                <Field label="Methods" path=Signal::derive(move || m.methods.with(|t| methods_field(t))) hint="comma-separated; empty = any">
                    {text(m.methods, "match.methods", "GET, POST")}
                </Field>
            </div>
            <For each=move || m.headers.get() key=|h| h.id let:h>
                {
                    let path = move |part: &'static str| Signal::derive(move || {
                        let i = header_index(h.id);
                        if part.is_empty() { format!("match.headers[{i}]") } else { format!("match.headers[{i}].{part}") }
                    });
                    view! {
                        <div class="inline-row">
                            <Field label="Header" path=path("name")>{text(h.name, path("name"), "x-tenant")}</Field>
                            <Field label="must be" path=path("")>
                                {select(h.condition, None, HEADER_CONDITIONS)}
                            </Field>
                            <Show when=move || h.condition.get() == HeaderCondition::Equals>
                                <Field label="Value" path=path("equals")>{text(h.value, path("equals"), "")}</Field>
                            </Show>
                            <button type="button" class="icon-btn" aria-label="Remove header condition"
                                on:click=move |_| m.headers.update(|hs| hs.retain(|x| x.id != h.id))>"×"</button>
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small"
                on:click=move |_| m.headers.update(|hs| hs.push(HeaderRow::new(HeaderDraft::default())))>"+ Header condition"</button>
        </section>
    }
}

/// Whose bucket: the kind of client key and what it names.
#[component]
fn KeySection(key: KeyInputs, missing: KeyMissingInputs) -> impl IntoView {
    view! {
        <section class="card">
            <h2>"Whose bucket"</h2>
            <div class="grid2">
                <Field label="Client key" path="key">
                    {select(key.kind, Some("key_kind".into()), KEY_KINDS)}
                </Field>
                {move || match key.kind.get() {
                    KeyKind::Header => view! { <Field label="Header name" path="key.header">{text(key.name, "key.header", "x-api-key")}</Field> }.into_any(),
                    KeyKind::Query => view! { <Field label="Parameter name" path="key.query">{text(key.name, "key.query", "api_key")}</Field> }.into_any(),
                    KeyKind::ClientIp => view! {
                        <Field label="Trusted proxy hops" path="key.client_ip.trusted_hops" hint="0 = the TCP peer; N = Nth X-Forwarded-For entry from the right">
                            {number(key.hops, "key.client_ip.trusted_hops", "0")}
                        </Field>
                    }.into_any(),
                    KeyKind::Metadata => metadata_fields(key).into_any(),
                    KeyKind::PeerCertificate => certificate_field(key).into_any(),
                    KeyKind::Cookie => cookie_field(key).into_any(),
                    KeyKind::Path | KeyKind::Global => ().into_any(),
                }}
            </div>
            <KeyMissingFields inputs=missing />
        </section>
    }
}

/// Cost, failure mode and the denied response, folded away.
#[component]
fn AdvancedSection(form: FormState) -> impl IntoView {
    view! {
        <details class="card advanced">
            <summary><h2>"Cost, failure mode and response"</h2></summary>
            <div class="grid3">
                <CostFields cost=form.cost />
            </div>
            <div class="grid3">
                <Field label="When the rule cannot be evaluated" path="failure_mode">
                    {select(form.failure_mode, Some("failure_mode".into()), FAILURE_MODES)}
                </Field>
                <Field label="Denied status" path="response.status">{number(form.status, "response.status", "429")}</Field>
                <div class="field">
                    <label>"Headers"</label>
                    <label class="check"><input type="checkbox" bind:checked=form.rate_limit_headers />" Send RateLimit headers"</label>
                </div>
            </div>
        </details>
    }
}

/// The cost's kind, then the inputs that kind reads.
#[component]
fn CostFields(cost: CostInputs) -> impl IntoView {
    view! {
        <Field label="Cost per request" path="cost">
            {select(cost.kind, Some("cost_kind".into()), COST_KINDS)}
        </Field>
        {move || match cost.kind.get() {
            CostKind::Header => view! {
                <Field label="Cost header" path="cost.header.name">{text(cost.header, "cost.header.name", "x-cost")}</Field>
                <Field label="Max cost" path="cost.header.max">{number(cost.max, "cost.header.max", "100")}</Field>
            }.into_any(),
            CostKind::Fixed => view! { <Field label="Tokens" path="cost.fixed">{number(cost.fixed, "cost.fixed", "1")}</Field> }.into_any(),
        }}
    }
}
