//! Pieces every page uses: loading state, error and empty states, stat cards, badges,
//! a confirmation dialog, the flash message, and keeping data fresh.

use std::future::Future;

use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::{ApiError, SessionView};

/// What a page knows about one thing it loads.
#[derive(Debug, Clone, PartialEq)]
pub enum Load<T> {
    Loading,
    Ready(T),
    Failed(ApiError),
}

impl<T: Clone> Load<T> {
    pub fn ready(&self) -> Option<T> {
        match self {
            Load::Ready(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// A value loaded by `fetch`: now, again whenever a signal `fetch` reads changes, on
/// [`Loaded::refresh`], and every `every_ms` if given. A refresh keeps showing the old
/// value until the new one arrives (no flashing), and a late answer to an older request
/// never overwrites a newer one.
#[derive(Debug)]
pub struct Loaded<T: Send + Sync + 'static> {
    pub state: RwSignal<Load<T>>,
    trigger: Trigger,
}

impl<T: Send + Sync + 'static> Clone for Loaded<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Send + Sync + 'static> Copy for Loaded<T> {}

impl<T: Clone + Send + Sync + 'static> Loaded<T> {
    pub fn refresh(&self) {
        self.trigger.notify();
    }

    pub fn get(&self) -> Load<T> {
        self.state.get()
    }

    pub fn ready(&self) -> Option<T> {
        self.state.with(Load::ready)
    }
}

pub fn load<T, F, Fut>(every_ms: Option<u64>, fetch: F) -> Loaded<T>
where
    T: Clone + Send + Sync + 'static,
    F: Fn() -> Fut + 'static,
    Fut: Future<Output = Result<T, ApiError>> + 'static,
{
    let state = RwSignal::new(Load::Loading);
    let trigger = Trigger::new();
    let generation = StoredValue::new(0_u64);
    Effect::new(move |_| {
        trigger.track();
        let request = fetch();
        let mine = generation.get_value() + 1;
        generation.set_value(mine);
        spawn_local(async move {
            let result = request.await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok(v) => {
                    state.try_set(Load::Ready(v));
                }
                // A failed refresh of something already shown keeps it, unless the
                // session is gone; the first failure is shown.
                Err(e) => {
                    let keep =
                        state.with_untracked(|s| matches!(s, Load::Ready(_))) && e.status != 401;
                    if !keep {
                        state.try_set(Load::Failed(e));
                    }
                }
            }
        });
    });
    if let Some(ms) = every_ms {
        if let Ok(handle) = set_interval_with_handle(
            move || trigger.notify(),
            std::time::Duration::from_millis(ms),
        ) {
            on_cleanup(move || handle.clear());
        }
    }
    Loaded { state, trigger }
}

/// Everything the app shares.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// `None` until known, then who is signed in (`Some(None)`: nobody).
    pub session: RwSignal<Option<Option<SessionView>>>,
    pub flash: RwSignal<Option<(bool, String)>>,
}

impl Ctx {
    pub fn get() -> Ctx {
        expect_context::<Ctx>()
    }

    pub fn can_edit(&self) -> bool {
        self.session.with(|s| {
            s.as_ref()
                .and_then(|s| s.as_ref())
                .is_some_and(|s| s.role.can_edit_rules())
        })
    }

    /// A message that shows at the top for a few seconds (`ok`: green, else red).
    pub fn flash(&self, ok: bool, message: impl Into<String>) {
        self.flash.set(Some((ok, message.into())));
        let flash = self.flash;
        let _ = set_timeout_with_handle(
            move || {
                flash.try_set(None);
            },
            std::time::Duration::from_secs(4),
        );
    }
}

#[component]
pub fn Spinner(#[prop(default = "Loading…")] label: &'static str) -> impl IntoView {
    view! { <div class="state loading" role="status"><span class="spin"></span>{label}</div> }
}

#[component]
pub fn ErrorBanner(error: ApiError) -> impl IntoView {
    view! {
        <div class="banner error" role="alert">
            <strong>{error.title.clone()}</strong>
            " "
            {error.message()}
        </div>
    }
}

#[component]
pub fn Empty(title: &'static str, children: Children) -> impl IntoView {
    view! {
        <div class="state empty">
            <div class="empty-title">{title}</div>
            <div class="empty-body">{children()}</div>
        </div>
    }
}

/// Renders a [`Load`]: a spinner, an error, or `ready(value)`.
pub fn show<T: Clone + Send + Sync + 'static, V: IntoView + 'static>(
    loaded: Loaded<T>,
    ready: impl Fn(T) -> V + Send + Sync + 'static,
) -> impl IntoView {
    move || match loaded.get() {
        Load::Loading => view! { <Spinner /> }.into_any(),
        Load::Failed(e) => view! { <ErrorBanner error=e /> }.into_any(),
        Load::Ready(v) => ready(v).into_any(),
    }
}

#[component]
pub fn Stat(
    label: &'static str,
    #[prop(into)] value: Signal<String>,
    #[prop(optional, into)] note: Signal<String>,
    #[prop(default = "")] tone: &'static str,
    /// The card's `data-test` name, for the browser tests.
    #[prop(optional)]
    test: &'static str,
) -> impl IntoView {
    view! {
        <div class=format!("stat {tone}") data-test=(!test.is_empty()).then_some(test)>
            <div class="stat-label">{label}</div>
            <div class="stat-value">{move || value.get()}</div>
            <div class="stat-note">{move || note.get()}</div>
        </div>
    }
}

/// A choice of time windows, as a segmented control.
#[component]
pub fn WindowPicker(value: RwSignal<u64>, options: &'static [u64]) -> impl IntoView {
    view! {
        <div class="segmented" role="group" aria-label="Time window">
            {options
                .iter()
                .map(|&s| {
                    view! {
                        <button type="button"
                            class=("on", move || value.get() == s)
                            aria-pressed=move || (value.get() == s).to_string()
                            on:click=move |_| value.set(s)>
                            {crate::format::window(s)}
                        </button>
                    }
                })
                .collect_view()}
        </div>
    }
}

/// A modal asking to confirm something destructive. Shown while `open` is true.
#[component]
pub fn Confirm(
    open: RwSignal<bool>,
    title: String,
    body: String,
    action: &'static str,
    on_confirm: Callback<()>,
) -> impl IntoView {
    view! {
        <Show when=move || open.get()>
            <div class="modal-backdrop" on:click=move |_| open.set(false)>
                <div class="modal" role="dialog" aria-modal="true" on:click=|ev| ev.stop_propagation()>
                    <h3>{title.clone()}</h3>
                    <p>{body.clone()}</p>
                    <div class="modal-actions">
                        <button type="button" class="btn" on:click=move |_| open.set(false)>"Cancel"</button>
                        <button type="button" class="btn danger" data-test="confirm"
                            on:click=move |_| { open.set(false); on_confirm.run(()); }>
                            {action}
                        </button>
                    </div>
                </div>
            </div>
        </Show>
    }
}

#[component]
pub fn Badge(
    #[prop(into)] text: String,
    #[prop(default = "")] tone: &'static str,
) -> impl IntoView {
    view! { <span class=format!("badge {tone}")>{text}</span> }
}
