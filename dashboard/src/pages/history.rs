//! Ruleset versions: who changed what and when, the diff each version made, and one-click
//! rollback (which makes a new version, so rolling back is itself undoable).

use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::{self, ChangeKind, ChangeSummary, DiffView, RuleSpec, VersionList, VersionView};
use crate::components::{Confirm, Ctx, Empty, Load, Spinner, load, show};
use crate::diff::JsonDiff;
use crate::format;

#[component]
pub fn History() -> impl IntoView {
    let versions = load(Some(15_000), || {
        api::get::<VersionList>("/api/v1/versions?limit=200")
    });
    let selected = RwSignal::new(None::<u64>);
    // The newest version is selected until the user picks one.
    let current = move || {
        versions
            .ready()
            .and_then(|l| l.versions.first().map(|v| v.version))
    };
    let shown = move || selected.get().or_else(current);

    view! {
        <div class="page">
            <div class="page-head">
                <div>
                    <h1>"History"</h1>
                    <p class="muted">"Every change to the rules is a new ruleset version. Rolling back restores an old ruleset as a new version."</p>
                </div>
            </div>
            {show(versions, move |list| {
                if list.versions.is_empty() {
                    return view! { <Empty title="No changes yet">"The first rule you create becomes version 1."</Empty> }.into_any();
                }
                let head = list.versions.first().map_or(0, |v| v.version);
                view! {
                    <div class="split">
                        <section class="card flush version-list" data-test="versions">
                            {list.versions.into_iter().map(|v| {
                                let n = v.version;
                                view! {
                                    <button type="button" class=move || if shown() == Some(n) { "version on" } else { "version" }
                                        data-test="version" data-version=n on:click=move |_| selected.set(Some(n))>
                                        <div class="version-top">
                                            <span class="version-n">"v"{n}</span>
                                            {(n == head).then(|| view! { <span class="badge good">"current"</span> })}
                                            <span class="muted small">{format::ago(&v.created_at)}</span>
                                        </div>
                                        <div class="version-summary">{v.summary.clone()}</div>
                                        <div class="muted small">{v.actor_name.clone()}" · "{v.action.clone()}" · "{v.rule_count}" rules"</div>
                                    </button>
                                }
                            }).collect_view()}
                        </section>
                        <section class="card">
                            {move || shown().map(|n| {
                                let version = versions.ready().and_then(|l| l.versions.into_iter().find(|v| v.version == n));
                                view! { <VersionDetail version=n info=version head=head on_rollback=Callback::new(move |()| { selected.set(None); versions.refresh(); }) /> }
                            })}
                        </section>
                    </div>
                }.into_any()
            })}
        </div>
    }
}

#[component]
fn VersionDetail(
    version: u64,
    info: Option<VersionView>,
    head: u64,
    on_rollback: Callback<()>,
) -> impl IntoView {
    let ctx = Ctx::get();
    let diff = load(None, move || async move {
        api::get::<DiffView>(&format!(
            "/api/v1/diff?from={}&to={version}",
            version.saturating_sub(1)
        ))
        .await
    });
    let confirm = RwSignal::new(false);
    let busy = RwSignal::new(false);
    let rollback = Callback::new(move |()| {
        busy.set(true);
        spawn_local(async move {
            match api::post_empty::<ChangeSummary>(
                &format!("/api/v1/versions/{version}/rollback"),
                None,
            )
            .await
            {
                Ok(s) if s.changed => ctx.flash(
                    true,
                    format!(
                        "Rolled back to version {version}: the rules are now version {}.",
                        s.version
                    ),
                ),
                Ok(_) => ctx.flash(
                    true,
                    format!("The rules already equal version {version}; nothing changed."),
                ),
                Err(e) => ctx.flash(false, e.message()),
            }
            busy.set(false);
            on_rollback.run(());
        });
    });
    view! {
        <div class="version-detail" data-test="version-detail">
            <div class="card-head">
                <div>
                    <h2>"Version "{version}</h2>
                    {info.map(|v| view! {
                        <p class="muted small">{format::timestamp(&v.created_at)}" · "{v.actor_name}" · "{v.action}</p>
                    })}
                </div>
                {(ctx.can_edit() && version != head).then(|| view! {
                    <button type="button" class="btn" data-test="rollback" disabled=move || busy.get() on:click=move |_| confirm.set(true)>
                        {format!("Roll back to v{version}")}
                    </button>
                    <Confirm open=confirm title=format!("Roll back to version {version}?")
                        body=format!("The rules become exactly as they were at version {version}, saved as a new version {}. Proxies apply it within a second.", head + 1)
                        action="Roll back" on_confirm=rollback />
                })}
            </div>
            {move || match diff.get() {
                Load::Loading => view! { <Spinner /> }.into_any(),
                Load::Failed(e) => view! { <crate::components::ErrorBanner error=e /> }.into_any(),
                Load::Ready(d) if d.changes.is_empty() => view! { <p class="muted">"This version changed no rule."</p> }.into_any(),
                Load::Ready(d) => view! {
                    <p class="muted small">{format!("Changes from version {} to {}:", d.from, d.to)}</p>
                    {d.changes.into_iter().map(|c| {
                        let tone = match c.change { ChangeKind::Added => "good", ChangeKind::Removed => "bad", ChangeKind::Changed => "warn" };
                        let (before, after) = (as_json(c.before.as_ref()), as_json(c.after.as_ref()));
                        view! {
                            <div class="change">
                                <div class="change-head"><span class="mono">{c.id.clone()}</span><span class=format!("badge {tone}")>{c.change.as_str()}</span></div>
                                <JsonDiff before=before after=after />
                            </div>
                        }
                    }).collect_view()}
                }.into_any(),
            }}
        </div>
    }
}

/// A rule as the JSON the diff shows.
fn as_json(spec: Option<&RuleSpec>) -> Option<serde_json::Value> {
    spec.and_then(|s| serde_json::to_value(s).ok())
}
