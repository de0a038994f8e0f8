//! The editor around the form: the form or the rule as JSON, the live check, the
//! problems' summary, and saving to the admin API.

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::NavigateOptions;
use leptos_router::components::A;
use leptos_router::hooks::use_navigate;
use sluice_core::spec::RuleSpec;
use sluice_dashboard_model::draft::{Draft, form_shows, validate};

use super::inputs::{Field, FormCtx};
use super::sections::FormBody;
use super::state::FormState;
use crate::api::{self, FieldError, RuleEstimate, RuleView, enc};
use crate::components::{Ctx, ErrorBanner};

#[derive(Debug, Clone, PartialEq)]
enum SaveState {
    Idle,
    Saving,
    Failed(api::ApiError),
}

/// The editor for a new rule (`existing: None`) or a stored one.
#[component]
pub(super) fn RuleEditor(
    initial: RuleSpec,
    existing: Option<RuleView>,
    #[prop(optional)] prefill_override: Option<String>,
) -> impl IntoView {
    let ctx = Ctx::get();
    let navigate = use_navigate();
    let mut plain = Draft::from_spec(&initial);
    let mut notice = None;
    if let Some(client) = prefill_override.filter(|c| !c.is_empty()) {
        notice = Some(if plain.add_override_for(&client) {
            format!(
                "Added an override for client {client}, starting from the rule's limits: set its limits below, then save."
            )
        } else {
            format!("{client} already has an override on this rule: it is below.")
        });
        // Bring the overrides into view once they are on the page.
        let _ = set_timeout_with_handle(
            || {
                if let Some(el) = web_sys::window()
                    .and_then(|w| w.document())
                    .and_then(|d| d.get_element_by_id("overrides"))
                {
                    el.scroll_into_view();
                }
            },
            // After the router's own scroll to the top of a newly opened page.
            std::time::Duration::from_millis(400),
        );
    }
    // The form's inputs; switching back from JSON replaces them with fresh ones.
    let form = RwSignal::new(FormState::new(plain));
    // JSON mode: for what the form cannot express (nested composite keys), or by choice.
    let json_mode = RwSignal::new(!form_shows(&initial));
    let json_text = RwSignal::new(serde_json::to_string_pretty(&initial).unwrap_or_default());

    let built = Memo::new(move |_| {
        if json_mode.get() {
            match serde_json::from_str::<RuleSpec>(&json_text.get()) {
                Ok(spec) => (Some(spec), Vec::new()),
                Err(e) => (
                    None,
                    vec![FieldError {
                        field: "json".into(),
                        message: e.to_string(),
                    }],
                ),
            }
        } else {
            let (spec, problems) = form.get().read().to_spec();
            (Some(spec), problems)
        }
    });
    let errors = Memo::new(move |_| {
        let (spec, problems) = built.get();
        match spec {
            Some(spec) => validate(spec, problems),
            None => problems,
        }
    });
    let preview = Memo::new(move |_| {
        built.with(|(s, _)| {
            s.as_ref()
                .map(|s| serde_json::to_string_pretty(s).unwrap_or_default())
        })
    });
    let server = RwSignal::new(Vec::<FieldError>::new());
    let show_all = RwSignal::new(false);
    let save_state = RwSignal::new(SaveState::Idle);
    provide_context(FormCtx {
        errors,
        server,
        show_all,
    });
    // An edit makes the API's last verdict stale.
    Effect::new(move |previous: Option<()>| {
        preview.track();
        if previous.is_some() {
            server.set(Vec::new());
        }
    });

    let editing_id = existing.as_ref().map(|r| r.id.clone());
    let etag = existing.as_ref().map(RuleView::etag);
    let title = match &existing {
        Some(r) => format!("Edit {}", r.spec.name),
        None => "New rule".to_string(),
    };
    let save = {
        let editing_id = editing_id.clone();
        move |ev: leptos::ev::SubmitEvent| {
            ev.prevent_default();
            show_all.set(true);
            let Some(spec) = built.get_untracked().0 else {
                return;
            };
            if !errors.get_untracked().is_empty() {
                return;
            }
            save_state.set(SaveState::Saving);
            let body = serde_json::to_string(&spec).unwrap_or_default();
            let editing_id = editing_id.clone();
            let etag = etag.clone();
            let navigate = navigate.clone();
            spawn_local(async move {
                let result = match &editing_id {
                    Some(id) => {
                        api::send(
                            "PUT",
                            &format!("/api/v1/rules/{}", enc(id)),
                            Some(("application/json", body)),
                            etag.as_deref(),
                        )
                        .await
                    }
                    None => {
                        api::send(
                            "POST",
                            "/api/v1/rules",
                            Some(("application/json", body)),
                            None,
                        )
                        .await
                    }
                };
                match result {
                    Ok(_) => {
                        save_state.set(SaveState::Idle);
                        let verb = if editing_id.is_some() {
                            "Saved"
                        } else {
                            "Created"
                        };
                        ctx.flash(
                            true,
                            format!(
                                "{verb} rule {}. Connected proxies enforce it within a second.",
                                spec.name
                            ),
                        );
                        navigate("/rules", NavigateOptions::default());
                    }
                    Err(e) => {
                        server.set(e.errors.clone());
                        save_state.set(SaveState::Failed(e));
                    }
                }
            });
        }
    };
    let switch_mode = move |to_json: bool| {
        if to_json {
            if let Some(text) = preview.get_untracked() {
                json_text.set(text);
            }
            json_mode.set(true);
        } else {
            match serde_json::from_str::<RuleSpec>(&json_text.get_untracked()) {
                Ok(spec) if !form_shows(&spec) => {
                    ctx.flash(
                        false,
                        "Nested composite keys, value conditions on a composite key and metadata paths with commas can only be edited as JSON.",
                    );
                }
                Ok(spec) => {
                    form.set(FormState::new(Draft::from_spec(&spec)));
                    json_mode.set(false);
                }
                Err(_) => ctx.flash(false, "Fix the JSON before switching back to the form."),
            }
        }
    };
    let summary = move || {
        let es = errors.get();
        let server_es = server.get();
        let shown: Vec<FieldError> = if !server_es.is_empty() {
            server_es
        } else if show_all.get() {
            es
        } else {
            Vec::new()
        };
        (!shown.is_empty()).then(|| view! {
            <div class="banner error" role="alert" data-test="form-errors">
                <strong>{match shown.len() { 1 => "1 problem to fix".to_string(), n => format!("{n} problems to fix") }}</strong>
                <ul>{shown.into_iter().map(|e| view! { <li><code>{e.field}</code>" "{e.message}</li> }).collect_view()}</ul>
            </div>
        })
    };
    let is_new = existing.is_none();
    // A dry run of the rule as it stands against the last hour of reports.
    let estimate = RwSignal::new(None::<Result<String, api::ApiError>>);
    let run_estimate = move |_| {
        let Some(spec) = built.get_untracked().0 else {
            return;
        };
        estimate.set(Some(Ok("Estimating…".to_string())));
        spawn_local(async move {
            let answer: Result<RuleEstimate, _> =
                api::post_json("/api/v1/rules:estimate", &spec).await;
            estimate.set(Some(answer.map(|e| e.sentence())));
        });
    };
    // An edit makes the last estimate stale.
    Effect::new(move |previous: Option<()>| {
        preview.track();
        if previous.is_some() {
            estimate.set(None);
        }
    });

    view! {
        <div class="page narrow">
            <div class="crumbs"><A href="/rules">"Rules"</A>" / "{title.clone()}</div>
            <div class="page-head">
                <h1>{title}</h1>
                <div class="segmented" role="group" aria-label="Editor">
                    <button type="button" class=("on", move || !json_mode.get()) on:click=move |_| switch_mode(false)>"Form"</button>
                    <button type="button" class=("on", move || json_mode.get()) on:click=move |_| switch_mode(true)>"JSON"</button>
                </div>
            </div>
            {notice.map(|n| view! { <div class="banner info" data-test="override-notice">{n}</div> })}
            {move || match save_state.get() {
                SaveState::Failed(e) if e.status == 422 => Some(view! {
                    <div class="banner error">"The admin API refused the rule; the fields it named are marked below."</div>
                }.into_any()),
                SaveState::Failed(e) if e.kind == "urn:sluice:stale-revision" => Some(view! {
                    <div class="banner error">
                        <strong>"Someone else changed this rule after you opened it. "</strong>
                        "Nothing was saved. Reload to see their version (your edits here will be lost): "
                        <a href="" on:click=|_| { if let Some(w) = web_sys::window() { let _ = w.location().reload(); } }>"reload"</a>
                    </div>
                }.into_any()),
                SaveState::Failed(e) => Some(view! { <ErrorBanner error=e /> }.into_any()),
                _ => None,
            }}
            <form class="rule-form" on:submit=save novalidate>
                <Show when=move || json_mode.get() fallback=move || view! { <FormBody form=form.get() is_new=is_new /> }>
                    <section class="card">
                        <h2>"Rule as JSON"</h2>
                        <p class="muted small">"The body of "<code>"POST /api/v1/rules"</code>" — the same model as rules files. Validated as you type."</p>
                        <Field label="" path="json">
                            <textarea class="json-input" name="json" rows="22" spellcheck="false" bind:value=json_text></textarea>
                        </Field>
                    </section>
                </Show>
                {summary}
                <div class="save-bar">
                    <span class=move || if errors.with(Vec::is_empty) { "check ok" } else { "check bad" } data-test="live-check">
                        {move || match errors.with(Vec::len) {
                            0 => "✓ Valid rule".to_string(),
                            1 => "1 problem".to_string(),
                            n => format!("{n} problems"),
                        }}
                    </span>
                    <button type="button" class="btn" data-test="estimate-button" on:click=run_estimate
                        disabled=move || !errors.with(Vec::is_empty)
                        title="What this rule would have throttled of the last hour's traffic">"Estimate"</button>
                    <A href="/rules" attr:class="btn">"Cancel"</A>
                    <button type="submit" class="btn primary" data-test="save" disabled=move || save_state.get() == SaveState::Saving>
                        {move || if save_state.get() == SaveState::Saving { "Saving…" } else if is_new { "Create rule" } else { "Save changes" }}
                    </button>
                </div>
                {move || estimate.get().map(|answer| match answer {
                    Ok(text) => view! { <p class="muted small" data-test="estimate">{text}</p> }.into_any(),
                    Err(e) => view! { <ErrorBanner error=e /> }.into_any(),
                })}
                <details class="preview">
                    <summary>"Request body sent to the API"</summary>
                    <pre>{move || preview.get().unwrap_or_else(|| "(not valid JSON)".into())}</pre>
                </details>
            </form>
        </div>
    }
}
