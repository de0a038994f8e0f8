//! Clients: the most throttled ones over a chosen window, and one client in detail
//! (which rules throttled it, and when), with a jump to an override for it.

use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_params_map;

use crate::api::{
    self, ClientHistory as Detail, ClientMetricsList as ClientList, RuleList, enc, now_ms,
};
use crate::chart::{Line, TimeChart};
use crate::components::{Ctx, Empty, Load, WindowPicker, load, show};
use crate::format;
use crate::pages::overview::{THROTTLED, bucket_seconds};

const WINDOWS: &[u64] = &[300, 900, 3600, 86_400];

#[component]
pub fn Clients() -> impl IntoView {
    let window = RwSignal::new(900_u64);
    let rule = RwSignal::new(String::new());
    let rules = load(None, || api::get::<RuleList>("/api/v1/rules?limit=1000"));
    let clients = load(Some(5_000), move || {
        let w = window.get();
        let r = rule.get();
        async move {
            let to = now_ms();
            let mut path = format!(
                "/api/v1/metrics/clients?from={}&to={to}&limit=50",
                to - w as i64 * 1000
            );
            if !r.is_empty() {
                path.push_str(&format!("&rule={}", enc(&r)));
            }
            api::get::<ClientList>(&path).await
        }
    });
    view! {
        <div class="page">
            <div class="page-head">
                <div>
                    <h1>"Clients"</h1>
                    <p class="muted">"The clients denied most often. Counts are upper bounds when a client shares a summary slot (shown as ±)."</p>
                </div>
                <div class="head-tools">
                    <select aria-label="Rule" on:change=move |ev| rule.set(event_target_value(&ev))>
                        <option value="">"All rules"</option>
                        {move || rules.ready().map(|l| l.rules.into_iter().map(|r| {
                            let id = r.id.clone();
                            view! { <option value=id.clone() prop:selected=move || rule.get() == id>{r.spec.name.clone()}</option> }
                        }).collect_view())}
                    </select>
                    <WindowPicker value=window options=WINDOWS />
                </div>
            </div>
            <section class="card flush">
                {show(clients, move |list| {
                    if list.clients.is_empty() {
                        return view! {
                            <Empty title="Nobody throttled">{format!("No client was throttled in the last {}.", format::window(window.get_untracked()))}</Empty>
                        }.into_any();
                    }
                    let max = list.clients.iter().map(|c| c.throttled).max().unwrap_or(1).max(1);
                    view! {
                        <table class="table clients" data-test="clients">
                            <thead><tr><th class="num">"#"</th><th>"Client"</th><th>"Rule"</th><th class="num">"Throttled"</th><th class="hide-sm wide-col"></th></tr></thead>
                            <tbody>
                                {list.clients.into_iter().enumerate().map(|(i, c)| {
                                    let href = format!("/clients/{}", enc(&c.client));
                                    let name = c.client.clone();
                                    let rule_name = c.rule.clone();
                                    let width = format!("width:{:.1}%", c.throttled as f64 / max as f64 * 100.0);
                                    view! {
                                        <tr data-test="client-row" data-client=c.client.clone()>
                                            <td class="num muted">{i + 1}</td>
                                            <td><A href=href attr:class="client mono">{name}</A></td>
                                            <td><A href=format!("/rules/{}", enc(&c.rule))>{rule_name}</A></td>
                                            <td class="num">{format::count(c.throttled)}
                                                {(c.error > 0).then(|| view! { <span class="muted small">" ±"{format::count(c.error)}</span> })}
                                                {(c.tokens > 0).then(|| view! { <div class="muted small" data-test="client-tokens">{format::count(c.tokens)}" tokens"</div> })}
                                            </td>
                                            <td class="hide-sm"><div class="bar"><div class="bar-fill" style=width></div></div></td>
                                        </tr>
                                    }
                                }).collect_view()}
                            </tbody>
                        </table>
                    }.into_any()
                })}
            </section>
        </div>
    }
}

#[component]
pub fn ClientDetail() -> impl IntoView {
    let ctx = Ctx::get();
    let params = use_params_map();
    let client = move || {
        let raw = params.with(|p| p.get("client").unwrap_or_default());
        js_sys::decode_uri_component(&raw)
            .map(String::from)
            .unwrap_or(raw)
    };
    let window = RwSignal::new(900_u64);
    let detail = load(Some(5_000), move || {
        let c = client();
        let w = window.get();
        async move {
            let to = now_ms();
            api::get::<Detail>(&format!(
                "/api/v1/metrics/clients/{}?from={}&to={to}",
                enc(&c),
                to - w as i64 * 1000
            ))
            .await
        }
    });
    let span = Signal::derive(move || {
        let to = now_ms();
        (to - window.get() as i64 * 1000, to)
    });
    view! {
        <div class="page">
            <div class="crumbs"><A href="/clients">"Clients"</A>" / "<span class="mono">{client}</span></div>
            <div class="page-head">
                <div>
                    <h1 class="mono">{client}</h1>
                    <p class="muted">"When this client was throttled, and by which rules."</p>
                </div>
                <WindowPicker value=window options=WINDOWS />
            </div>
            {move || match detail.get() {
                Load::Loading => view! { <crate::components::Spinner /> }.into_any(),
                Load::Failed(e) => view! { <crate::components::ErrorBanner error=e /> }.into_any(),
                Load::Ready(d) if d.rules.is_empty() => view! {
                    <section class="card"><Empty title="Not throttled">{format!("{} was not throttled in the last {}.", client(), format::window(window.get_untracked()))}</Empty></section>
                }.into_any(),
                Load::Ready(d) => d.rules.into_iter().map(|r| {
                    let step = d.step_seconds;
                    let now = now_ms();
                    let lines = vec![Line {
                        label: "Throttled",
                        color: THROTTLED,
                        points: r
                            .points
                            .iter()
                            .filter_map(|p| bucket_seconds(p.t, step, now).map(|secs| (p.t, p.throttled as f64 / secs)))
                            .collect(),
                        fill: true,
                        dashed: false,
                    }];
                    let override_href = format!("/rules/{}?override={}", enc(&r.rule), enc(&client()));
                    view! {
                        <section class="card" data-test="client-rule">
                            <div class="card-head">
                                <div>
                                    <h2><A href=format!("/rules/{}", enc(&r.rule))>{r.rule.clone()}</A></h2>
                                    <p class="muted small">{format::count(r.throttled)}" requests throttled in the last "{format::window(window.get_untracked())}</p>
                                </div>
                                {ctx.can_edit().then(|| view! {
                                    <A href=override_href attr:class="btn primary" attr:data-test="create-override">"Create an override for this client"</A>
                                })}
                            </div>
                            <TimeChart lines=Signal::stored(lines) unit="throttled / s" window=span height=180.0 empty="Not throttled in this window" />
                        </section>
                    }
                }).collect_view().into_any(),
            }}
        </div>
    }
}
