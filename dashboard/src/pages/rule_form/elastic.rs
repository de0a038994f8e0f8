//! Whether the rule is elastic (`elastic`): over their own limits, clients still pass
//! while the rule's admitted requests in this Envoy, all clients together, stay under a
//! ceiling. The ceiling's inputs show only while it is on.

use leptos::prelude::*;

use super::inputs::{Field, number, switch};
use super::limits::period;
use super::state::ElasticInputs;

/// The switch (where the core's refusals of the rule's other settings show), then the
/// ceiling's requests, period and burst while it is on.
#[component]
pub(super) fn ElasticFields(inputs: ElasticInputs) -> impl IntoView {
    let e = inputs;
    view! {
        <div class="grid2" data-test="elastic">
            <Field label="Elastic" path="elastic" hint="request limits kept in this Envoy only, refusing (not delaying), enforce or shadow mode">
                <label class="check" title="A client over its own limit is still admitted, warned, while the rule has room under its ceiling">
                    {switch(e.on, true, false, "elastic")}" Let clients pass their limits while the rule has room"
                </label>
            </Field>
        </div>
        <Show when=move || e.on.get()>
            <div class="grid3" data-test="elastic-ceiling">
                <Field label="Ceiling (requests)" path="elastic.requests" hint="the rule's admitted requests in this Envoy, all clients together">
                    {number(e.requests, "elastic.requests", "1000")}
                </Field>
                <Field label="per" path="elastic.period">
                    {period(e.period, e.seconds, "elastic.period")}
                </Field>
                <Field label="Ceiling burst" path="elastic.burst" hint="capacity; default = the ceiling's requests">
                    {number(e.burst, "elastic.burst", "")}
                </Field>
            </div>
        </Show>
    }
}
