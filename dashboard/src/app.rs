//! The shell: who is signed in, the sign-in screen, navigation, and the routes.

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use crate::api::{self, SESSION_PATH, SessionView, SignIn};
use crate::components::{Ctx, Spinner};
use crate::pages::{audit, clients, history, overview, rule_form, rules};

#[component]
pub fn App() -> impl IntoView {
    let ctx = Ctx {
        session: RwSignal::new(None),
        flash: RwSignal::new(None),
    };
    provide_context(ctx);
    api::on_unauthorized(move || {
        ctx.session.try_set(Some(None));
    });
    spawn_local(async move {
        let who = api::get::<SessionView>(SESSION_PATH).await.ok();
        ctx.session.set(Some(who));
    });

    view! {
        <Router>
            {move || match ctx.session.get() {
                None => view! { <div class="splash"><Spinner label="Starting…" /></div> }.into_any(),
                Some(None) => view! { <SignIn /> }.into_any(),
                Some(Some(who)) => view! { <Shell who=who /> }.into_any(),
            }}
        </Router>
    }
}

#[component]
fn Logo() -> impl IntoView {
    view! {
        <span class="logo" aria-hidden="true">
            <svg width="22" height="22" viewBox="0 0 24 24">
                <rect x="2" y="3" width="20" height="18" rx="4" fill="#2f6fde" />
                <path d="M6 15h3v-4h3v-3h3v-2" stroke="#fff" stroke-width="2" fill="none" stroke-linecap="round" stroke-linejoin="round" />
                <path d="M6 18h12" stroke="#9ec1ff" stroke-width="2" stroke-linecap="round" />
            </svg>
        </span>
    }
}

#[component]
fn SignIn() -> impl IntoView {
    let ctx = Ctx::get();
    let token = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let secret = token.get_untracked().trim().to_string();
        if secret.is_empty() {
            error.set(Some("Paste an API token to sign in.".to_string()));
            return;
        }
        busy.set(true);
        spawn_local(async move {
            match api::post_json::<SessionView>(SESSION_PATH, &SignIn { token: secret }).await {
                Ok(who) => {
                    error.set(None);
                    ctx.session.set(Some(Some(who)));
                }
                Err(e) => {
                    let message = match e.status {
                        401 => "That token is unknown or has been revoked.".to_string(),
                        403 => "Proxy tokens cannot sign in. Use a viewer, editor or admin token."
                            .to_string(),
                        _ => e.message(),
                    };
                    error.set(Some(message));
                    busy.set(false);
                }
            }
        });
    };
    view! {
        <div class="signin-page">
            <form class="signin card" on:submit=submit>
                <div class="signin-brand"><Logo />"Sluice"</div>
                <h1>"Sign in"</h1>
                <p class="muted">"Rate limiting for Envoy. Sign in with an API token that has the viewer, editor or admin role."</p>
                <label for="token">"API token"</label>
                <input id="token" name="token" type="password" autocomplete="off" spellcheck="false"
                    placeholder="slc_…" bind:value=token />
                {move || error.get().map(|e| view! { <div class="field-error" role="alert">{e}</div> })}
                <button type="submit" class="btn primary wide" disabled=move || busy.get()>
                    {move || if busy.get() { "Signing in…" } else { "Sign in" }}
                </button>
                <p class="hint">"No token? An admin can make one: "<code>"sluice token create --role viewer --name you"</code></p>
            </form>
        </div>
    }
}

#[component]
fn Shell(who: SessionView) -> impl IntoView {
    let ctx = Ctx::get();
    let sign_out = move |_| {
        spawn_local(async move {
            let _ = api::send("DELETE", SESSION_PATH, None, None).await;
            ctx.session.set(Some(None));
        });
    };
    let role = who.role.to_string();
    view! {
        <div class="shell">
            <header class="topbar">
                <A href="/" attr:class="brand"><Logo />"Sluice"</A>
                <nav class="nav" aria-label="Main">
                    <A href="/" exact=true>"Overview"</A>
                    <A href="/rules">"Rules"</A>
                    <A href="/clients">"Clients"</A>
                    <A href="/history">"History"</A>
                    <A href="/audit">"Audit log"</A>
                </nav>
                <div class="who">
                    <span class="who-name" title="Signed in with this token">{who.token_name.clone()}</span>
                    <span class=format!("role role-{role}") data-test="role" data-role=role.clone()>{role.clone()}</span>
                    <button type="button" class="btn ghost small" on:click=sign_out>"Sign out"</button>
                </div>
            </header>
            {move || ctx.flash.get().map(|(ok, text)| view! {
                <div class=if ok { "flash ok" } else { "flash bad" } role="status">{text}</div>
            })}
            <main class="main">
                <Routes fallback=|| view! {
                    <div class="page"><h1>"Not found"</h1><p>"There is no page here. "<A href="/">"Go to the overview"</A></p></div>
                }>
                    <Route path=path!("/") view=overview::Overview />
                    <Route path=path!("/rules") view=rules::Rules />
                    <Route path=path!("/rules/new") view=rule_form::NewRule />
                    <Route path=path!("/rules/:id") view=rule_form::EditRule />
                    <Route path=path!("/clients") view=clients::Clients />
                    <Route path=path!("/clients/:client") view=clients::ClientDetail />
                    <Route path=path!("/history") view=history::History />
                    <Route path=path!("/audit") view=audit::Audit />
                </Routes>
            </main>
        </div>
    }
}
