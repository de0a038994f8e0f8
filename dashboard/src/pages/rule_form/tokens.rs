//! The token budget's section (the rule's `tokens`): shown while some limit counts tokens,
//! since the API refuses the section on a rule without one and requires it on a rule with.

use leptos::prelude::*;
use sluice_dashboard_model::draft::UsageKind;
use sluice_dashboard_model::draft::tokens::pointer_field;

use super::inputs::{Field, number, select, text};
use super::state::{FormState, TokensInputs};

/// Where usage is read; the option values are the wire's names.
const USAGE_KINDS: &[(Option<UsageKind>, &str)] = &[
    (None, "choose…"),
    (
        Some(UsageKind::OpenAi),
        "OpenAI (Chat Completions, Responses)",
    ),
    (Some(UsageKind::Anthropic), "Anthropic (Messages)"),
    (
        Some(UsageKind::JsonPointer),
        "JSON pointers (any other API)",
    ),
];

/// The section, present while a limit of the rule or of an override counts tokens.
#[component]
pub(super) fn TokenBudgetSection(form: FormState) -> impl IntoView {
    let counts_tokens = Memo::new(move |_| form.read().counts_tokens());
    view! {
        <Show when=move || counts_tokens.get()>
            <TokenBudgetFields inputs=form.tokens />
        </Show>
    }
}

#[component]
fn TokenBudgetFields(inputs: TokensInputs) -> impl IntoView {
    let t = inputs;
    let pointer = move |name: &'static str, value: RwSignal<String>, placeholder: &'static str| {
        let path = pointer_field(name);
        view! { <Field label=name path=path.clone()>{text(value, path, placeholder)}</Field> }
    };
    view! {
        <section class="card" data-test="token-budget">
            <h2>"Token budget"</h2>
            <p class="muted small">"A request reserves its estimate in every token limit when it arrives; when the response ends, the usage it reports replaces the estimate."</p>
            <div class="grid2">
                <Field label="Usage read from" path="tokens">
                    {select(t.usage, Some("tokens.usage".into()), USAGE_KINDS)}
                </Field>
                <Field label="Default estimate" path="tokens.default_estimate" hint="output tokens reserved when the request names no max_tokens">
                    {number(t.default_estimate, "tokens.default_estimate", "1000")}
                </Field>
            </div>
            <Show when=move || t.usage.get() == Some(UsageKind::JsonPointer)>
                <p class="muted small">"RFC 6901 pointers into the response's JSON (or each streamed event's); give at least one."</p>
                <div class="grid3">
                    {pointer("input", t.input_pointer, "/usage/input_tokens")}
                    {pointer("output", t.output_pointer, "/usage/output_tokens")}
                    {pointer("total", t.total_pointer, "/usage/total_tokens")}
                </div>
            </Show>
            <div class="grid2">
                <Field label="Input tokens" path="tokens.estimate_input_from_body">
                    <label class="check"><input type="checkbox" name="tokens.estimate_input_from_body" bind:checked=t.estimate_input_from_body />" Also reserve input: the body's bytes / 4"</label>
                </Field>
                <Field label="Streams" path="tokens.include_usage" hint="OpenAI only">
                    <label class="check"><input type="checkbox" name="tokens.include_usage" bind:checked=t.include_usage />" Ask streamed chat requests for their usage"</label>
                </Field>
            </div>
        </section>
    }
}
