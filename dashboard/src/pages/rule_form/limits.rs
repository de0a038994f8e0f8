//! The limits' rows, for the rule and for each per-client override. Each row counts
//! requests, tokens or requests in flight; an in-flight row has no period or burst.

use leptos::prelude::*;
use sluice_core::spec::{NamedPeriod, Scope, UsageMeasure};
use sluice_dashboard_model::draft::{LimitCounts, LimitDraft, Number, OverrideDraft, PeriodChoice};

use super::inputs::{Field, number, select, switch, text};
use super::state::{LimitRow, OverrideRow};

/// The period `<select>`'s options; their values are the wire's names and `custom`.
const PERIODS: &[(PeriodChoice, &str)] = &[
    (PeriodChoice::Named(NamedPeriod::Second), "second"),
    (PeriodChoice::Named(NamedPeriod::Minute), "minute"),
    (PeriodChoice::Named(NamedPeriod::Hour), "hour"),
    (PeriodChoice::Named(NamedPeriod::Day), "day"),
    (PeriodChoice::Custom, "seconds…"),
];

/// A period input: the `<select>` named `name`, and beside it, when "seconds…" is
/// picked, the custom seconds (named `{name}.seconds`). A limit's and the elastic
/// ceiling's periods are both this.
pub(super) fn period(
    choice: RwSignal<PeriodChoice>,
    seconds: RwSignal<Number<u64>>,
    name: impl Into<Signal<String>>,
) -> impl IntoView {
    let name = name.into();
    view! {
        <div class="period">
            {select(choice, Some(name), PERIODS)}
            <Show when=move || choice.get() == PeriodChoice::Custom>
                {number(seconds, Signal::derive(move || format!("{}.seconds", name.get())), "30")}
            </Show>
        </div>
    }
}

/// What a limit can count; the option values are [`LimitCounts`]'s.
const COUNTS: &[(LimitCounts, &str)] = &[
    (LimitCounts::Requests, "requests"),
    (
        LimitCounts::Tokens(UsageMeasure::Total),
        "tokens (input + output)",
    ),
    (LimitCounts::Tokens(UsageMeasure::Input), "input tokens"),
    (LimitCounts::Tokens(UsageMeasure::Output), "output tokens"),
    (LimitCounts::InFlight, "requests in flight"),
];

/// The amount input's label for what the limit counts.
fn amount_label(counts: LimitCounts) -> &'static str {
    match counts {
        LimitCounts::Requests => "Requests",
        LimitCounts::Tokens(_) => "Tokens",
        LimitCounts::InFlight => "At once",
    }
}

/// The rows of limits at `prefix` (`limits` or `overrides[0].limits`).
#[component]
pub(super) fn Limits(
    rows: RwSignal<Vec<LimitRow>>,
    #[prop(into)] prefix: Signal<String>,
) -> impl IntoView {
    let index_of = move |id: usize| rows.with(|rs| rs.iter().position(|r| r.id == id).unwrap_or(0));
    view! {
        <div class="limits">
            <For each=move || rows.get() key=|r| r.id let:row>
                {
                    let path = move |part: &'static str| Signal::derive(move || format!("{}[{}].{part}", prefix.get(), index_of(row.id)));
                    view! {
                        <div class="limit-row">
                            <Field label="Counts" path=path("count")>
                                {select(row.counts, Some(path("counts")), COUNTS)}
                            </Field>
                            {move || {
                                let counts = row.counts.get();
                                let amount = path(counts.amount_field());
                                view! {
                                    <Field label=amount_label(counts) path=amount>
                                        {number(row.requests, amount, "100")}
                                    </Field>
                                }
                            }}
                            <Show when=move || row.counts.get() != LimitCounts::InFlight
                                fallback=|| view! { <div class="field span2 field-hint">"of one client's requests in flight in this Envoy: each holds its place until its response ends"</div> }>
                                <Field label="per" path=path("period")>
                                    {period(row.period, row.seconds, path("period"))}
                                </Field>
                                <Field label="Burst" path=path("burst") hint="capacity; default = the amount">
                                    {number(row.burst, path("burst"), "")}
                                </Field>
                                <Field label="Soft %" path=path("soft_percent") hint="warn instead of refusing this far over; empty = hard">
                                    {number(row.soft_percent, path("soft_percent"), "")}
                                </Field>
                            </Show>
                            <Field label="Scope" path=path("scope")>
                                <label class="check" title="One bucket per client for every Envoy that follows this admin API, instead of one per Envoy">
                                    {switch(row.scope, Scope::Global, Scope::Proxy, path("scope"))}" Fleet-wide"
                                </label>
                            </Field>
                            <button type="button" class="icon-btn" title="Remove this limit" aria-label="Remove limit"
                                disabled=move || rows.with(|r| r.len() <= 1)
                                on:click=move |_| rows.update(|r| r.retain(|x| x.id != row.id))>"×"</button>
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small" data-test="add-limit" on:click=move |_| {
                let last = rows.with(|r| r.last().map(LimitRow::read));
                rows.update(|r| r.push(LimitRow::new(LimitDraft::after(last.as_ref()))));
            }>"+ Add a limit"</button>
        </div>
    }
}

/// The per-client overrides, each with its client and its own rows of limits.
#[component]
pub(super) fn Overrides(overrides: RwSignal<Vec<OverrideRow>>) -> impl IntoView {
    let index_of =
        move |id: usize| overrides.with(|os| os.iter().position(|o| o.id == id).unwrap_or(0));
    view! {
        <section class="card" id="overrides">
            <h2>"Per-client overrides"</h2>
            <p class="muted small">"Different limits for one client key, e.g. a partner who may send more."</p>
            <For each=move || overrides.get() key=|o| o.id let:o>
                {
                    let base = Signal::derive(move || format!("overrides[{}]", index_of(o.id)));
                    let client = Signal::derive(move || format!("{}.client", base.get()));
                    view! {
                        <div class="override" data-test="override">
                            <div class="override-head">
                                <Field label="Client" path=client>
                                    {text(o.client, client, "acme")}
                                </Field>
                                <button type="button" class="btn small danger-ghost" on:click=move |_| overrides.update(|os| os.retain(|x| x.id != o.id))>"Remove override"</button>
                            </div>
                            <Limits rows=o.limits prefix=Signal::derive(move || format!("{}.limits", base.get())) />
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small" data-test="add-override"
                on:click=move |_| overrides.update(|os| os.push(OverrideRow::new(OverrideDraft::new())))>"+ Override for a client"</button>
        </section>
    }
}
