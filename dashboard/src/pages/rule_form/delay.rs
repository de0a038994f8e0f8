//! What an over-limit request gets: refused at once, or delayed until its tokens are due
//! (`on_limit: delay`), with the delay queue's inputs shown only then.

use leptos::prelude::*;
use sluice_core::spec::OnLimit;
use sluice_dashboard_model::draft::delay::{QUEUE_PER_KEY_DEFAULT, QUEUE_PER_WORKER_DEFAULT};

use super::inputs::{Field, number, select};
use super::state::DelayInputs;

/// The option values are the wire's names.
const ON_LIMIT: &[(OnLimit, &str)] = &[
    (OnLimit::Refuse, "refuse (the rule's response)"),
    (OnLimit::Delay, "delay until its tokens are due"),
];

/// The choice, then the delay's bound and queues while it delays.
#[component]
pub(super) fn OnLimitFields(inputs: DelayInputs) -> impl IntoView {
    let d = inputs;
    view! {
        <div class="grid2" data-test="on-limit">
            <Field label="When over the limit" path="on_limit" hint="enforce mode only: shadow and warn never wait">
                {select(d.on_limit, Some("on_limit".into()), ON_LIMIT)}
            </Field>
            <Show when=move || d.on_limit.get() == OnLimit::Delay>
                <Field label="Max delay (ms)" path="delay.max_delay_ms" hint="a request whose tokens are due later is refused">
                    {number(d.max_delay_ms, "delay.max_delay_ms", "1000")}
                </Field>
            </Show>
        </div>
        <Show when=move || d.on_limit.get() == OnLimit::Delay>
            <div class="grid2" data-test="delay-queues">
                <Field label="Waiting per client" path="delay.queue_per_key" hint="per Envoy worker; empty: the default shown, or the rule's bound if smaller">
                    {number(d.queue_per_key, "delay.queue_per_key", QUEUE_PER_KEY_DEFAULT)}
                </Field>
                <Field label="Waiting for the rule" path="delay.queue_per_worker" hint="per Envoy worker; empty: the default shown">
                    {number(d.queue_per_worker, "delay.queue_per_worker", QUEUE_PER_WORKER_DEFAULT)}
                </Field>
            </div>
        </Show>
    }
}
