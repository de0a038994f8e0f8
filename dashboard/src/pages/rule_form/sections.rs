//! The form's sections: the rule itself, which requests, whose bucket, limits, the token
//! budget and overrides, and the advanced settings (cost, failure mode, response).

use leptos::prelude::*;
use sluice_core::spec::{FailureMode, Mode};
use sluice_dashboard_model::draft::{
    CostKind, HeaderCondition, HeaderDraft, ValueDraft, methods_field,
};

use super::delay::OnLimitFields;
use super::elastic::ElasticFields;
use super::identity::{KEY_KINDS, KeyMissingFields, PART_KINDS, RolloutField, key_source};
use super::inputs::{Field, number, select, text};
use super::limits::{Limits, Overrides};
use super::state::{
    CostInputs, FormState, HeaderRow, KeyInputs, KeyMissingInputs, MatchInputs, ValueRow,
};
use super::tokens::TokenBudgetSection;

const HEADER_CONDITIONS: &[(HeaderCondition, &str)] = &[
    (HeaderCondition::Present, "present"),
    (HeaderCondition::Absent, "absent"),
    (HeaderCondition::Equals, "equal to"),
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

/// Which requests: paths, host, methods, header conditions and value conditions.
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
            <ValueConditions values=m.values />
        </section>
    }
}

/// Conditions on values read as keys are (`match.values`): a JWT claim, a cookie, a
/// certificate field, a header...
#[component]
fn ValueConditions(values: RwSignal<Vec<ValueRow>>) -> impl IntoView {
    let index = move |id: usize| values.with(|vs| vs.iter().position(|v| v.id == id).unwrap_or(0));
    view! {
        <For each=move || values.get() key=|v| v.id let:v>
            {
                let at = Signal::derive(move || format!("match.values[{}]", index(v.id)));
                let source = Signal::derive(move || format!("{}.value", at.get()));
                let kind_name = Signal::derive(move || format!("{}.kind", source.get()));
                let equals = Signal::derive(move || format!("{}.equals", at.get()));
                let condition = Signal::derive(move || format!("{}.condition", at.get()));
                view! {
                    <div class="inline-row" data-test="value-condition">
                        {key_source(v.source, source, "Value of", kind_name, PART_KINDS)}
                        <Field label="must be" path=at>{select(v.condition, Some(condition), HEADER_CONDITIONS)}</Field>
                        <Show when=move || v.condition.get() == HeaderCondition::Equals>
                            <Field label="Value" path=equals>{text(v.value, equals, "pro")}</Field>
                        </Show>
                        <button type="button" class="icon-btn" aria-label="Remove value condition"
                            on:click=move |_| values.update(|vs| vs.retain(|x| x.id != v.id))>"×"</button>
                    </div>
                }
            }
        </For>
        <button type="button" class="btn small" data-test="add-value-condition"
            on:click=move |_| values.update(|vs| vs.push(ValueRow::new(ValueDraft::default())))>"+ Value condition (claim, cookie...)"</button>
    }
}

/// Whose bucket: the kind of client key and what it names.
#[component]
fn KeySection(key: KeyInputs, missing: KeyMissingInputs) -> impl IntoView {
    view! {
        <section class="card">
            <h2>"Whose bucket"</h2>
            <div class="grid2">
                {key_source(key, Signal::derive(|| "key".to_string()), "Client key", Signal::derive(|| "key_kind".to_string()), KEY_KINDS)}
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
