//! Creating and editing a rule: a form that validates as you type with the same code the
//! server runs (`sluice_core::rule::Rule::try_from`, compiled into this app), shows the
//! API's problem+json errors next to their fields, and covers per-client overrides.
//! Anything the form cannot express (composite keys) is edited as JSON in the same page.

use std::sync::atomic::{AtomicUsize, Ordering};

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::NavigateOptions;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_params_map, use_query_map};
use sluice_core::spec::{GrpcStatus, KeySpec, Mode, RuleSpec};
use sluice_dashboard_model::draft::{
    self as model, HeaderDraft, LimitDraft, OverrideDraft, blank, methods_field, validate,
};

use crate::api::{self, FieldError, RuleView, enc};
use crate::components::{Ctx, ErrorBanner, Load, Spinner, load};
use crate::format;

static NEXT_ROW: AtomicUsize = AtomicUsize::new(1);

fn row_id() -> usize {
    NEXT_ROW.fetch_add(1, Ordering::Relaxed)
}

fn text(s: impl Into<String>) -> RwSignal<String> {
    RwSignal::new(s.into())
}

/// One limit's inputs.
#[derive(Debug, Clone, Copy)]
struct LimitRow {
    id: usize,
    requests: RwSignal<String>,
    /// `second`, `minute`, `hour`, `day` or `custom`.
    period: RwSignal<String>,
    seconds: RwSignal<String>,
    burst: RwSignal<String>,
    global: RwSignal<bool>,
}

impl LimitRow {
    fn from_draft(d: LimitDraft) -> LimitRow {
        LimitRow {
            id: row_id(),
            requests: text(d.requests),
            period: text(d.period),
            seconds: text(d.seconds),
            burst: text(d.burst),
            global: RwSignal::new(d.global),
        }
    }

    fn draft(&self) -> LimitDraft {
        LimitDraft {
            requests: self.requests.get(),
            period: self.period.get(),
            seconds: self.seconds.get(),
            burst: self.burst.get(),
            global: self.global.get(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct HeaderRow {
    id: usize,
    name: RwSignal<String>,
    /// `present`, `absent` or `equals`.
    kind: RwSignal<String>,
    value: RwSignal<String>,
}

#[derive(Debug, Clone, Copy)]
struct OverrideRow {
    id: usize,
    client: RwSignal<String>,
    limits: RwSignal<Vec<LimitRow>>,
}

/// The form's state, one signal per input. What the inputs mean is decided by the plain
/// [`model::Draft`] they are read into (tested on the host, in `sluice-dashboard-model`).
#[derive(Debug, Clone, Copy)]
struct Draft {
    id: RwSignal<String>,
    name: RwSignal<String>,
    description: RwSignal<String>,
    priority: RwSignal<String>,
    enabled: RwSignal<bool>,
    shadow: RwSignal<bool>,
    host: RwSignal<String>,
    path_prefix: RwSignal<String>,
    path_exact: RwSignal<String>,
    path_regex: RwSignal<String>,
    methods: RwSignal<String>,
    headers: RwSignal<Vec<HeaderRow>>,
    /// `header`, `client_ip`, `query`, `path` or `global`.
    key_kind: RwSignal<String>,
    key_value: RwSignal<String>,
    hops: RwSignal<String>,
    limits: RwSignal<Vec<LimitRow>>,
    /// `fixed` or `header`.
    cost_kind: RwSignal<String>,
    cost_fixed: RwSignal<String>,
    cost_header: RwSignal<String>,
    cost_max: RwSignal<String>,
    cost_default: RwSignal<String>,
    overrides: RwSignal<Vec<OverrideRow>>,
    /// ``, `open` or `closed`.
    failure: RwSignal<String>,
    status: RwSignal<String>,
    rate_limit_headers: RwSignal<bool>,
    /// No input shows it; kept so that saving the form does not reset it.
    grpc_status: RwSignal<GrpcStatus>,
}

impl Draft {
    fn from_model(d: model::Draft) -> Draft {
        let rows = |ls: Vec<LimitDraft>| ls.into_iter().map(LimitRow::from_draft).collect();
        Draft {
            id: text(d.id),
            name: text(d.name),
            description: text(d.description),
            priority: text(d.priority),
            enabled: RwSignal::new(d.enabled),
            shadow: RwSignal::new(d.shadow),
            host: text(d.host),
            path_prefix: text(d.path_prefix),
            path_exact: text(d.path_exact),
            path_regex: text(d.path_regex),
            methods: text(d.methods),
            headers: RwSignal::new(
                d.headers
                    .into_iter()
                    .map(|h| HeaderRow {
                        id: row_id(),
                        name: text(h.name),
                        kind: text(h.kind),
                        value: text(h.value),
                    })
                    .collect(),
            ),
            key_kind: text(d.key_kind),
            key_value: text(d.key_value),
            hops: text(d.hops),
            limits: RwSignal::new(rows(d.limits)),
            cost_kind: text(d.cost_kind),
            cost_fixed: text(d.cost_fixed),
            cost_header: text(d.cost_header),
            cost_max: text(d.cost_max),
            cost_default: text(d.cost_default),
            overrides: RwSignal::new(
                d.overrides
                    .into_iter()
                    .map(|o| OverrideRow {
                        id: row_id(),
                        client: text(o.client),
                        limits: RwSignal::new(rows(o.limits)),
                    })
                    .collect(),
            ),
            failure: text(d.failure),
            status: text(d.status),
            rate_limit_headers: RwSignal::new(d.rate_limit_headers),
            grpc_status: RwSignal::new(d.grpc_status),
        }
    }

    /// The inputs' current values (tracked, so a memo over this re-runs as they change).
    fn read(&self) -> model::Draft {
        let limits = |rows: &[LimitRow]| rows.iter().map(LimitRow::draft).collect();
        model::Draft {
            id: self.id.get(),
            name: self.name.get(),
            description: self.description.get(),
            priority: self.priority.get(),
            enabled: self.enabled.get(),
            shadow: self.shadow.get(),
            host: self.host.get(),
            path_prefix: self.path_prefix.get(),
            path_exact: self.path_exact.get(),
            path_regex: self.path_regex.get(),
            methods: self.methods.get(),
            headers: self
                .headers
                .get()
                .iter()
                .map(|h| HeaderDraft {
                    name: h.name.get(),
                    kind: h.kind.get(),
                    value: h.value.get(),
                })
                .collect(),
            key_kind: self.key_kind.get(),
            key_value: self.key_value.get(),
            hops: self.hops.get(),
            limits: limits(&self.limits.get()),
            cost_kind: self.cost_kind.get(),
            cost_fixed: self.cost_fixed.get(),
            cost_header: self.cost_header.get(),
            cost_max: self.cost_max.get(),
            cost_default: self.cost_default.get(),
            overrides: self
                .overrides
                .get()
                .iter()
                .map(|o| OverrideDraft {
                    client: o.client.get(),
                    limits: limits(&o.limits.get()),
                })
                .collect(),
            failure: self.failure.get(),
            status: self.status.get(),
            rate_limit_headers: self.rate_limit_headers.get(),
            grpc_status: self.grpc_status.get(),
        }
    }

    /// The spec the inputs describe, and the inputs that are not even numbers.
    fn to_spec(self) -> (RuleSpec, Vec<FieldError>) {
        self.read().to_spec()
    }
}

/// What every field needs to show its error.
#[derive(Debug, Clone, Copy)]
struct FormCtx {
    errors: Memo<Vec<FieldError>>,
    server: RwSignal<Vec<FieldError>>,
    show_all: RwSignal<bool>,
}

/// A labelled input with its error. The error shows once the field was touched (typed
/// in or left), after a save attempt, or when the API named this field.
#[component]
fn Field(
    label: &'static str,
    #[prop(into)] path: Signal<String>,
    #[prop(optional)] hint: &'static str,
    #[prop(optional)] class: &'static str,
    children: Children,
) -> impl IntoView {
    let form = expect_context::<FormCtx>();
    let touched = RwSignal::new(false);
    let message = move || {
        let p = path.get();
        form.server
            .with(|s| s.iter().find(|e| e.field == p).map(|e| e.message.clone()))
            .or_else(|| {
                (touched.get() || form.show_all.get())
                    .then(|| {
                        form.errors
                            .with(|es| es.iter().find(|e| e.field == p).map(|e| e.message.clone()))
                    })
                    .flatten()
            })
    };
    view! {
        <div class=move || format!("field {class}{}", if message().is_some() { " invalid" } else { "" })
            on:input=move |_| touched.set(true) on:change=move |_| touched.set(true) on:focusout=move |_| touched.set(true)>
            <label>{label}</label>
            {children()}
            {move || match message() {
                Some(m) => view! { <div class="field-error" data-field=path.get()>{m}</div> }.into_any(),
                None if !hint.is_empty() => view! { <div class="field-hint">{hint}</div> }.into_any(),
                None => ().into_any(),
            }}
        </div>
    }
}

fn input(
    value: RwSignal<String>,
    name: impl Into<Signal<String>>,
    placeholder: &'static str,
) -> impl IntoView {
    let name = name.into();
    view! { <input type="text" name=move || name.get() placeholder=placeholder autocomplete="off" spellcheck="false" bind:value=value /> }
}

/// The rows of limits at `prefix` (`limits` or `overrides[0].limits`).
#[component]
fn Limits(rows: RwSignal<Vec<LimitRow>>, #[prop(into)] prefix: Signal<String>) -> impl IntoView {
    let index_of = move |id: usize| rows.with(|rs| rs.iter().position(|r| r.id == id).unwrap_or(0));
    view! {
        <div class="limits">
            <For each=move || rows.get() key=|r| r.id let:row>
                {
                    let path = move |part: &'static str| Signal::derive(move || format!("{}[{}].{part}", prefix.get(), index_of(row.id)));
                    view! {
                        <div class="limit-row">
                            <Field label="Requests" path=path("requests")>
                                {input(row.requests, path("requests"), "100")}
                            </Field>
                            <Field label="per" path=path("period")>
                                <div class="period">
                                    <select name=move || path("period").get() on:change=move |ev| row.period.set(event_target_value(&ev))>
                                        {["second", "minute", "hour", "day", "custom"].into_iter().map(|p| view! {
                                            <option value=p prop:selected=move || row.period.get() == p>
                                                {if p == "custom" { "seconds…" } else { p }}
                                            </option>
                                        }).collect_view()}
                                    </select>
                                    <Show when=move || row.period.get() == "custom">
                                        {input(row.seconds, Signal::derive(move || format!("{}.seconds", path("period").get())), "30")}
                                    </Show>
                                </div>
                            </Field>
                            <Field label="Burst" path=path("burst") hint="capacity; default = requests">
                                {input(row.burst, path("burst"), "")}
                            </Field>
                            <label class="check" title="One bucket per client for every Envoy that follows this admin API, instead of one per Envoy">
                                <input type="checkbox" name=move || path("scope").get() bind:checked=row.global />" Fleet-wide"
                            </label>
                            <button type="button" class="icon-btn" title="Remove this limit" aria-label="Remove limit"
                                disabled=move || rows.with(|r| r.len() <= 1)
                                on:click=move |_| rows.update(|r| r.retain(|x| x.id != row.id))>"×"</button>
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small" on:click=move |_| {
                let last = rows.with(|r| r.last().map(LimitRow::draft));
                rows.update(|r| r.push(LimitRow::from_draft(LimitDraft::after(last.as_ref()))));
            }>"+ Add a limit"</button>
        </div>
    }
}

#[derive(Debug, Clone, PartialEq)]
enum SaveState {
    Idle,
    Saving,
    Failed(api::ApiError),
}

/// The editor for a new rule (`existing: None`) or a stored one.
#[component]
fn RuleEditor(
    initial: RuleSpec,
    existing: Option<RuleView>,
    #[prop(optional)] prefill_override: Option<String>,
) -> impl IntoView {
    let ctx = Ctx::get();
    let navigate = use_navigate();
    let mut plain = model::Draft::from_spec(&initial);
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
    let draft = Draft::from_model(plain);
    // JSON mode: for what the form cannot express (composite keys), or by choice.
    let composite = matches!(initial.key, KeySpec::Composite(_));
    let json_mode = RwSignal::new(composite);
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
            let (spec, problems) = draft.to_spec();
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
                Ok(spec) if matches!(spec.key, KeySpec::Composite(_)) => {
                    ctx.flash(false, "Composite keys can only be edited as JSON.");
                }
                Ok(spec) => {
                    let fresh = Draft::from_model(model::Draft::from_spec(&spec));
                    copy_draft(&fresh, &draft);
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
                <Show when=move || json_mode.get() fallback=move || view! { <FormBody draft=draft is_new=is_new /> }>
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
                    <A href="/rules" attr:class="btn">"Cancel"</A>
                    <button type="submit" class="btn primary" data-test="save" disabled=move || save_state.get() == SaveState::Saving>
                        {move || if save_state.get() == SaveState::Saving { "Saving…" } else if is_new { "Create rule" } else { "Save changes" }}
                    </button>
                </div>
                <details class="preview">
                    <summary>"Request body sent to the API"</summary>
                    <pre>{move || preview.get().unwrap_or_else(|| "(not valid JSON)".into())}</pre>
                </details>
            </form>
        </div>
    }
}

/// Replaces every input of `into` with `from`'s (switching from JSON back to the form).
fn copy_draft(from: &Draft, into: &Draft) {
    for (a, b) in [
        (from.id, into.id),
        (from.name, into.name),
        (from.description, into.description),
        (from.priority, into.priority),
        (from.host, into.host),
        (from.path_prefix, into.path_prefix),
        (from.path_exact, into.path_exact),
        (from.path_regex, into.path_regex),
        (from.methods, into.methods),
        (from.key_kind, into.key_kind),
        (from.key_value, into.key_value),
        (from.hops, into.hops),
        (from.cost_kind, into.cost_kind),
        (from.cost_fixed, into.cost_fixed),
        (from.cost_header, into.cost_header),
        (from.cost_max, into.cost_max),
        (from.cost_default, into.cost_default),
        (from.failure, into.failure),
        (from.status, into.status),
    ] {
        b.set(a.get_untracked());
    }
    into.enabled.set(from.enabled.get_untracked());
    into.shadow.set(from.shadow.get_untracked());
    into.rate_limit_headers
        .set(from.rate_limit_headers.get_untracked());
    into.grpc_status.set(from.grpc_status.get_untracked());
    into.headers.set(from.headers.get_untracked());
    into.limits.set(from.limits.get_untracked());
    into.overrides.set(from.overrides.get_untracked());
}

fn select(
    value: RwSignal<String>,
    name: &'static str,
    options: &'static [(&'static str, &'static str)],
) -> impl IntoView {
    view! {
        <select name=name on:change=move |ev| value.set(event_target_value(&ev))>
            {options.iter().map(|(v, label)| view! {
                <option value=*v prop:selected=move || value.get() == *v>{*label}</option>
            }).collect_view()}
        </select>
    }
}

#[component]
fn FormBody(draft: Draft, is_new: bool) -> impl IntoView {
    let d = draft;
    let header_index = move |id: usize| {
        d.headers
            .with(|hs| hs.iter().position(|h| h.id == id).unwrap_or(0))
    };
    let override_index = move |id: usize| {
        d.overrides
            .with(|os| os.iter().position(|o| o.id == id).unwrap_or(0))
    };
    view! {
        <section class="card">
            <h2>"Rule"</h2>
            <div class="grid2">
                <Field label="Name" path="name" hint="letters, digits, - _ . (shown to clients)">
                    {input(d.name, "name", "api-per-key")}
                </Field>
                {if is_new {
                    view! {
                        <Field label="Id (optional)" path="id" hint="stable bucket identity; defaults to the name">
                            {input(d.id, "id", "")}
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
                {input(d.description, "description", "What this rule protects, and why")}
            </Field>
            <div class="grid3">
                <Field label="Priority" path="priority" hint="higher runs first">
                    {input(d.priority, "priority", "0")}
                </Field>
                <div class="field">
                    <label>"Mode"</label>
                    <label class="check"><input type="checkbox" name="shadow" bind:checked=d.shadow />" Shadow mode (count, never deny)"</label>
                </div>
                <div class="field">
                    <label>"Status"</label>
                    <label class="check"><input type="checkbox" name="enabled" bind:checked=d.enabled />" Enabled"</label>
                </div>
            </div>
        </section>

        <section class="card">
            <h2>"Which requests"</h2>
            <p class="muted small">"All given conditions must hold; leave everything empty to match every request."</p>
            <div class="grid2">
                <Field label="Path prefix" path="match.path_prefix">{input(d.path_prefix, "match.path_prefix", "/api/")}</Field>
                <Field label="Exact path" path="match.path_exact">{input(d.path_exact, "match.path_exact", "")}</Field>
                <Field label="Path regex" path="match.path_regex" hint="must match the whole path">{input(d.path_regex, "match.path_regex", "")}</Field>
                <Field label="Host" path="match.host">{input(d.host, "match.host", "api.example.com or *.example.com")}</Field>
                <Field label="Methods" path=Signal::derive(move || d.methods.with(|m| methods_field(m))) hint="comma-separated; empty = any">
                    {input(d.methods, "match.methods", "GET, POST")}
                </Field>
            </div>
            <For each=move || d.headers.get() key=|h| h.id let:h>
                {
                    let path = move |part: &'static str| Signal::derive(move || {
                        let i = header_index(h.id);
                        if part.is_empty() { format!("match.headers[{i}]") } else { format!("match.headers[{i}].{part}") }
                    });
                    view! {
                        <div class="inline-row">
                            <Field label="Header" path=path("name")>{input(h.name, path("name"), "x-tenant")}</Field>
                            <Field label="must be" path=path("")>
                                <select on:change=move |ev| h.kind.set(event_target_value(&ev))>
                                    {[("present", "present"), ("absent", "absent"), ("equals", "equal to")].into_iter().map(|(v, l)| view! {
                                        <option value=v prop:selected=move || h.kind.get() == v>{l}</option>
                                    }).collect_view()}
                                </select>
                            </Field>
                            <Show when=move || h.kind.get() == "equals">
                                <Field label="Value" path=path("equals")>{input(h.value, path("equals"), "")}</Field>
                            </Show>
                            <button type="button" class="icon-btn" aria-label="Remove header condition"
                                on:click=move |_| d.headers.update(|hs| hs.retain(|x| x.id != h.id))>"×"</button>
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small" on:click=move |_| d.headers.update(|hs| hs.push(HeaderRow {
                id: row_id(), name: text(""), kind: text("present"), value: text(""),
            }))>"+ Header condition"</button>
        </section>

        <section class="card">
            <h2>"Whose bucket"</h2>
            <div class="grid2">
                <Field label="Client key" path="key">
                    {select(d.key_kind, "key_kind", &[
                        ("header", "a request header"), ("client_ip", "the client IP"), ("query", "a query parameter"),
                        ("path", "the path"), ("global", "everyone together (global)"),
                    ])}
                </Field>
                {move || match d.key_kind.get().as_str() {
                    "header" => view! { <Field label="Header name" path="key.header">{input(d.key_value, "key.header", "x-api-key")}</Field> }.into_any(),
                    "query" => view! { <Field label="Parameter name" path="key.query">{input(d.key_value, "key.query", "api_key")}</Field> }.into_any(),
                    "client_ip" => view! {
                        <Field label="Trusted proxy hops" path="key.client_ip.trusted_hops" hint="0 = the TCP peer; N = Nth X-Forwarded-For entry from the right">
                            {input(d.hops, "key.client_ip.trusted_hops", "0")}
                        </Field>
                    }.into_any(),
                    _ => ().into_any(),
                }}
            </div>
        </section>

        <section class="card">
            <h2>"Limits"</h2>
            <p class="muted small">"A token bucket per client and limit: it refills at requests/period and holds at most burst. A request must fit every limit."</p>
            <Limits rows=d.limits prefix="limits" />
        </section>

        <section class="card" id="overrides">
            <h2>"Per-client overrides"</h2>
            <p class="muted small">"Different limits for one client key, e.g. a partner who may send more."</p>
            <For each=move || d.overrides.get() key=|o| o.id let:o>
                {
                    let base = Signal::derive(move || format!("overrides[{}]", override_index(o.id)));
                    view! {
                        <div class="override" data-test="override">
                            <div class="override-head">
                                <Field label="Client" path=Signal::derive(move || format!("{}.client", base.get()))>
                                    {input(o.client, Signal::derive(move || format!("{}.client", base.get())), "acme")}
                                </Field>
                                <button type="button" class="btn small danger-ghost" on:click=move |_| d.overrides.update(|os| os.retain(|x| x.id != o.id))>"Remove override"</button>
                            </div>
                            <Limits rows=o.limits prefix=Signal::derive(move || format!("{}.limits", base.get())) />
                        </div>
                    }
                }
            </For>
            <button type="button" class="btn small" data-test="add-override" on:click=move |_| d.overrides.update(|os| os.push(OverrideRow {
                id: row_id(), client: text(""), limits: RwSignal::new(vec![LimitRow::from_draft(LimitDraft::from_spec(None))]),
            }))>"+ Override for a client"</button>
        </section>

        <details class="card advanced">
            <summary><h2>"Cost, failure mode and response"</h2></summary>
            <div class="grid3">
                <Field label="Cost per request" path="cost">
                    {select(d.cost_kind, "cost_kind", &[("fixed", "fixed"), ("header", "from a request header")])}
                </Field>
                {move || if d.cost_kind.get() == "header" {
                    view! {
                        <Field label="Cost header" path="cost.header.name">{input(d.cost_header, "cost.header.name", "x-cost")}</Field>
                        <Field label="Max cost" path="cost.header.max">{input(d.cost_max, "cost.header.max", "100")}</Field>
                    }.into_any()
                } else {
                    view! { <Field label="Tokens" path="cost.fixed">{input(d.cost_fixed, "cost.fixed", "1")}</Field> }.into_any()
                }}
            </div>
            <div class="grid3">
                <Field label="When the rule cannot be evaluated" path="failure_mode">
                    {select(d.failure, "failure_mode", &[("", "proxy default"), ("open", "let requests through"), ("closed", "deny")])}
                </Field>
                <Field label="Denied status" path="response.status">{input(d.status, "response.status", "429")}</Field>
                <div class="field">
                    <label>"Headers"</label>
                    <label class="check"><input type="checkbox" bind:checked=d.rate_limit_headers />" Send RateLimit headers"</label>
                </div>
            </div>
        </details>
    }
}

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

/// A rule, read-only: what a viewer sees.
#[component]
fn RuleDetails(rule: RuleView) -> impl IntoView {
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
                    <span class=if s.mode == Mode::Shadow { "badge shadow" } else { "badge" }>{if s.mode == Mode::Shadow { "Shadow" } else { "Enforce" }}</span>
                </div>
            </div>
            <section class="card">
                <dl class="facts">
                    <dt>"Id"</dt><dd class="mono">{rule.id.clone()}</dd>
                    <dt>"Matches"</dt><dd>{format::matcher(&s.matcher)}</dd>
                    <dt>"Per"</dt><dd>{format::key(&s.key)}</dd>
                    <dt>"Limits"</dt><dd>{format::limits(&s.limits)}</dd>
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
