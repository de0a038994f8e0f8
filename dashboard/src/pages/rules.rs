//! The rules: search, filter, enable/disable, shadow mode, delete with confirmation.

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::components::A;
use serde_json::json;
use sluice_core::spec::{Mode, Scope};

use crate::api::{self, RuleList, RuleMetricsList, RuleView, enc, now_ms};
use crate::chart::Sparkline;
use crate::components::{Confirm, Ctx, Empty, Load, Spinner, load};
use crate::format;
use crate::pages::overview::{ALLOWED, THROTTLED};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filter {
    All,
    Enabled,
    Disabled,
    Shadow,
}

#[component]
pub fn Rules() -> impl IntoView {
    let ctx = Ctx::get();
    let search = RwSignal::new(String::new());
    let filter = RwSignal::new(Filter::All);
    let rules = load(Some(15_000), || {
        api::get::<RuleList>("/api/v1/rules?limit=1000")
    });
    let metrics = load(Some(15_000), || async move {
        let to = now_ms();
        api::get::<RuleMetricsList>(&format!(
            "/api/v1/metrics/rules?from={}&to={to}",
            to - 900_000
        ))
        .await
    });
    let visible = move || {
        let needle = search.get().to_lowercase();
        let f = filter.get();
        rules
            .ready()
            .map(|l| l.rules)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                let s = &r.spec;
                let text_ok = needle.is_empty()
                    || s.name.to_lowercase().contains(&needle)
                    || r.id.to_lowercase().contains(&needle)
                    || s.description.to_lowercase().contains(&needle);
                let kind_ok = match f {
                    Filter::All => true,
                    Filter::Enabled => s.enabled,
                    Filter::Disabled => !s.enabled,
                    Filter::Shadow => s.mode == Mode::Shadow,
                };
                text_ok && kind_ok
            })
            .collect::<Vec<_>>()
    };
    let total = move || rules.ready().map_or(0, |l| l.rules.len());

    view! {
        <div class="page">
            <div class="page-head">
                <div>
                    <h1>"Rules"</h1>
                    <p class="muted">{move || match total() {
                        0 => "Evaluated highest priority first; every change makes a new ruleset version.".to_string(),
                        1 => "1 rule, evaluated highest priority first.".to_string(),
                        n => format!("{n} rules, evaluated highest priority first."),
                    }}</p>
                </div>
                <div class="head-tools">
                    {move || ctx.can_edit().then(|| view! {
                        <A href="/rules/new" attr:class="btn primary" attr:data-test="new-rule">"New rule"</A>
                    })}
                </div>
            </div>
            <div class="toolbar">
                <input type="search" class="search" placeholder="Search by name, id or description"
                    aria-label="Search rules" bind:value=search />
                <div class="segmented" role="group" aria-label="Filter">
                    {[(Filter::All, "All"), (Filter::Enabled, "Enabled"), (Filter::Disabled, "Disabled"), (Filter::Shadow, "Shadow")]
                        .into_iter()
                        .map(|(f, label)| view! {
                            <button type="button" class=("on", move || filter.get() == f) on:click=move |_| filter.set(f)>{label}</button>
                        })
                        .collect_view()}
                </div>
            </div>
            <section class="card flush">
                {move || match rules.get() {
                    Load::Loading => view! { <Spinner /> }.into_any(),
                    Load::Failed(e) => view! { <crate::components::ErrorBanner error=e /> }.into_any(),
                    Load::Ready(l) if l.rules.is_empty() => view! {
                        <Empty title="No rules yet">
                            {if ctx.can_edit() { "Create one with “New rule”, or apply a rules file: " } else { "An editor can create rules here, or apply a rules file: " }}
                            <code>"sluice rules apply -f rules.yaml"</code>
                        </Empty>
                    }.into_any(),
                    Load::Ready(_) => {
                        let rows = visible();
                        if rows.is_empty() {
                            view! { <Empty title="No matching rules">"Nothing matches this search and filter."</Empty> }.into_any()
                        } else {
                            view! {
                                <div class="rule-list" data-test="rule-list">
                                    <div class="rule-row head">
                                        <span>"Rule"</span><span>"Limits"</span><span>"Throttled, 15 min"</span><span>"Mode"</span><span>"Enabled"</span><span></span>
                                    </div>
                                    {rows.into_iter().map(|r| view! { <RuleRow rule=r metrics=metrics.state on_change=Callback::new(move |()| rules.refresh()) /> }).collect_view()}
                                </div>
                            }.into_any()
                        }
                    }
                }}
            </section>
        </div>
    }
}

#[component]
fn RuleRow(
    rule: RuleView,
    metrics: RwSignal<Load<RuleMetricsList>>,
    on_change: Callback<()>,
) -> impl IntoView {
    let ctx = Ctx::get();
    let can_edit = ctx.can_edit();
    let id = rule.id.clone();
    let spec = rule.spec.clone();
    let etag = rule.etag();
    let busy = RwSignal::new(false);
    let confirm = RwSignal::new(false);
    let href = format!("/rules/{}", enc(&id));

    let act = {
        let id = id.clone();
        let etag = etag.clone();
        move |what: &'static str| {
            let id = id.clone();
            let etag = etag.clone();
            busy.set(true);
            spawn_local(async move {
                let path = format!("/api/v1/rules/{}", enc(&id));
                let result = match what {
                    "enable" | "disable" => {
                        api::send("POST", &format!("{path}/{what}"), None, Some(&etag)).await
                    }
                    "shadow" | "enforce" => {
                        let body = json!({ "mode": what }).to_string();
                        api::send(
                            "PATCH",
                            &path,
                            Some(("application/merge-patch+json", body)),
                            Some(&etag),
                        )
                        .await
                    }
                    _ => api::send("DELETE", &path, None, Some(&etag)).await,
                };
                busy.set(false);
                match result {
                    Ok(_) => {
                        let done = match what {
                            "enable" => "enabled",
                            "disable" => "disabled",
                            "shadow" => "switched to shadow mode",
                            "enforce" => "switched to enforce mode",
                            _ => "deleted",
                        };
                        ctx.flash(true, format!("Rule {id} {done}."));
                    }
                    Err(e) if e.status == 409 => ctx.flash(false, format!("Rule {id} was changed by someone else meanwhile; the list is reloaded, try again.")),
                    Err(e) => ctx.flash(false, e.message()),
                }
                on_change.run(());
            });
        }
    };
    let toggle_enabled = {
        let act = act.clone();
        let enabled = spec.enabled;
        move |_| act(if enabled { "disable" } else { "enable" })
    };
    let toggle_mode = {
        let act = act.clone();
        let shadow = spec.mode == Mode::Shadow;
        move |_| act(if shadow { "enforce" } else { "shadow" })
    };
    let delete = {
        let act = act.clone();
        Callback::new(move |()| act("delete"))
    };
    let trend = {
        let id = id.clone();
        move || {
            metrics.with(|m| match m {
                Load::Ready(list) => list.rules.iter().find(|r| r.rule == id).cloned(),
                _ => None,
            })
        }
    };
    let shadow = spec.mode == Mode::Shadow;
    let enabled = spec.enabled;
    let fleet_wide = spec.limits.iter().any(|l| l.scope == Scope::Global);
    let title = spec.name.clone();
    let delete_title = format!("Delete rule {}?", spec.name);
    view! {
        <div class=if enabled { "rule-row" } else { "rule-row off" } data-test="rule-row" data-rule=id.clone()>
            <div class="rule-main">
                <A href=href.clone() attr:class="rule-name">{title}</A>
                {(spec.id.is_some()).then(|| view! { <span class="muted small mono">" "{id.clone()}</span> })}
                {fleet_wide.then(|| view! {
                    " "
                    <span class="badge" data-test="fleet-wide"
                        title="One bucket per client across every Envoy following this admin API; the traffic shown is the whole fleet's">
                        "Fleet-wide"
                    </span>
                })}
                {spec.elastic.as_ref().map(|e| view! {
                    " "
                    <span class="badge" data-test="elastic" title=format!("Elastic: {}", format::elastic(e))>
                        "Elastic"
                    </span>
                })}
                <div class="muted small">{format::matcher(&spec.matcher)}" · per "{format::key(&spec.key)}
                    {(!spec.overrides.is_empty()).then(|| format!(" · {} override{}", spec.overrides.len(), if spec.overrides.len() == 1 { "" } else { "s" }))}
                </div>
                {(!spec.description.is_empty()).then(|| view! { <div class="small">{spec.description.clone()}</div> })}
                {let trend = trend.clone(); move || trend()
                    .and_then(|m| format::shaping(m.warned, m.delayed, m.delay_wait_ms, m.in_flight_refused))
                    .map(|text| view! { <div class="muted small" data-test="rule-shaping">{text}" in 15 min"</div> })}
            </div>
            <div class="rule-limits" data-test="limits">{format::limits(&spec.limits)}</div>
            <div class="rule-trend">
                {move || match trend() {
                    Some(m) => {
                        let color = if m.denied > 0 { THROTTLED } else { ALLOWED };
                        view! {
                            <Sparkline values=m.sparkline.clone() color=color width=90.0 height=24.0 />
                            <span class="small">{format::count(m.denied)}" · "{format::percent(m.throttle_ratio)}</span>
                        }.into_any()
                    }
                    None => view! { <span class="muted small">"no traffic"</span> }.into_any(),
                }}
            </div>
            <div class="rule-mode">
                {if spec.mode == Mode::Warn {
                    // The pill switches enforce and shadow; a warn rule's mode is changed in
                    // its form, so a click never turns it into a shadow rule.
                    view! {
                        <span class="badge shadow" data-test="mode-warn"
                            title="Warn-mode rules never deny; over their limit they tell the client. Edit the rule to change its mode.">
                            "Warn"
                        </span>
                    }.into_any()
                } else if can_edit {
                    view! {
                        <button type="button" class=if shadow { "pill shadow" } else { "pill" } disabled=move || busy.get()
                            title="Shadow rules never deny; they count what they would deny" data-test="mode-toggle" on:click=toggle_mode>
                            {if shadow { "Shadow" } else { "Enforce" }}
                        </button>
                    }.into_any()
                } else {
                    view! { <span class=if shadow { "badge shadow" } else { "badge" }>{if shadow { "Shadow" } else { "Enforce" }}</span> }.into_any()
                }}
            </div>
            <div class="rule-enabled">
                {if can_edit {
                    view! {
                        <button type="button" role="switch" aria-checked=enabled.to_string() class=if enabled { "switch on" } else { "switch" }
                            disabled=move || busy.get() data-test="enable-toggle" aria-label="Enabled" on:click=toggle_enabled>
                            <span class="knob"></span>
                        </button>
                    }.into_any()
                } else {
                    view! { <span class=if enabled { "badge good" } else { "badge" }>{if enabled { "On" } else { "Off" }}</span> }.into_any()
                }}
            </div>
            <div class="rule-actions">
                {can_edit.then(|| view! {
                    <A href=href.clone() attr:class="btn small" attr:data-test="edit">"Edit"</A>
                    <button type="button" class="btn small danger-ghost" data-test="delete" on:click=move |_| confirm.set(true)>"Delete"</button>
                    <Confirm open=confirm title=delete_title.clone()
                        body="Its clients stop being limited by it within a second. The rule stays in the version history, so a rollback brings it back.".to_string()
                        action="Delete rule" on_confirm=delete />
                })}
            </div>
        </div>
    }
}
