//! Creating and editing a rule: a form that validates as you type with the same code the
//! server runs (`sluice_core::rule::Rule::try_from`, compiled into this app), shows the
//! API's problem+json errors next to their fields, and covers per-client overrides.
//! Anything the form cannot express (composite keys, match conditions on values) is edited
//! as JSON in the same page.
//!
//! `state.rs` holds the inputs' typed signals, read into and filled from the model's
//! `Draft`; `inputs.rs` the labelled field and the inputs for text, numbers, choices and
//! switches; `sections.rs` and `limits.rs` the form's sections, `delay.rs` what an
//! over-limit request gets (refused, or delayed within its queues), `elastic.rs` the
//! ceiling under which clients may pass their limits, `tokens.rs` the token
//! budget's and `identity.rs` the inputs for keys from identity, a missing key and the
//! rollout; `editor.rs` the page around them (JSON mode, live check, saving);
//! `details.rs` what a viewer sees.

mod delay;
mod details;
mod editor;
mod elastic;
mod identity;
mod inputs;
mod limits;
mod sections;
mod state;
mod tokens;

use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_params_map, use_query_map};
use sluice_dashboard_model::draft::blank;

use crate::api::{self, RuleView, enc};
use crate::components::{Ctx, ErrorBanner, Load, Spinner, load};
use details::RuleDetails;
use editor::RuleEditor;

#[component]
pub fn NewRule() -> impl IntoView {
    let ctx = Ctx::get();
    move || {
        if ctx.can_edit() {
            view! { <RuleEditor initial=blank() existing=None /> }.into_any()
        } else {
            view! { <div class="page"><div class="banner info">"Your token can read rules but not create them."</div></div> }.into_any()
        }
    }
}

#[component]
pub fn EditRule() -> impl IntoView {
    let ctx = Ctx::get();
    let params = use_params_map();
    let query = use_query_map();
    let id = move || {
        let raw = params.with(|p| p.get("id").unwrap_or_default());
        js_sys::decode_uri_component(&raw)
            .map(String::from)
            .unwrap_or(raw)
    };
    let rule = load(None, move || {
        let id = id();
        async move { api::get::<RuleView>(&format!("/api/v1/rules/{}", enc(&id))).await }
    });
    move || match rule.get() {
        Load::Loading => view! { <div class="page"><Spinner /></div> }.into_any(),
        Load::Failed(e) => view! {
            <div class="page">
                <div class="crumbs"><A href="/rules">"Rules"</A></div>
                <ErrorBanner error=e />
            </div>
        }
        .into_any(),
        Load::Ready(r) if ctx.can_edit() => {
            let prefill = query.with_untracked(|q| q.get("override"));
            view! { <RuleEditor initial=r.spec.clone() existing=Some(r) prefill_override=prefill.unwrap_or_default() /> }.into_any()
        }
        Load::Ready(r) => view! { <RuleDetails rule=r /> }.into_any(),
    }
}
