//! The form's building blocks: a labelled field that shows its problem, and the inputs it
//! holds, each bound to a typed signal: text, a number (its text as typed, parsed as it
//! changes), a choice from a `<select>`, and a checkbox that switches between two values.

use leptos::prelude::*;
use sluice_dashboard_model::draft::{Choice, Number, Whole};

use crate::api::FieldError;

/// What every field needs to show its error.
#[derive(Debug, Clone, Copy)]
pub(super) struct FormCtx {
    /// The live check's problems, the form's own first.
    pub errors: Memo<Vec<FieldError>>,
    /// The problems the API named on the last save.
    pub server: RwSignal<Vec<FieldError>>,
    /// Set by a save attempt: every problem shows, touched or not.
    pub show_all: RwSignal<bool>,
}

/// A labelled input with its error. The error shows once the field was touched (typed
/// in or left), after a save attempt, or when the API named this field.
#[component]
pub(super) fn Field(
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

/// A text input named `name` (the field path the API would name it by).
pub(super) fn text(
    value: RwSignal<String>,
    name: impl Into<Signal<String>>,
    placeholder: &'static str,
) -> impl IntoView {
    let name = name.into();
    view! { <input type="text" name=move || name.get() placeholder=placeholder autocomplete="off" spellcheck="false" bind:value=value /> }
}

/// A text input holding a number: it shows the text as typed, and every keystroke parses
/// it into the signal (the model turns what does not parse into the field's problem).
pub(super) fn number<T: Whole>(
    value: RwSignal<Number<T>>,
    name: impl Into<Signal<String>>,
    placeholder: &'static str,
) -> impl IntoView {
    let name = name.into();
    view! {
        <input type="text" name=move || name.get() placeholder=placeholder autocomplete="off" spellcheck="false"
            prop:value=move || value.with(|n| n.text().to_string())
            on:input=move |ev| value.set(Number::parse(event_target_value(&ev))) />
    }
}

/// A `<select>` of `options` (each a choice and its label), named `name` if given.
pub(super) fn select<T: Choice>(
    value: RwSignal<T>,
    name: Option<Signal<String>>,
    options: &'static [(T, &'static str)],
) -> impl IntoView {
    view! {
        <select name=move || name.map(|n| n.get()) on:change=move |ev| {
            if let Some(choice) = T::from_value(&event_target_value(&ev)) {
                value.set(choice);
            }
        }>
            {options.iter().map(|&(choice, label)| view! {
                <option value=choice.value() prop:selected=move || value.get() == choice>{label}</option>
            }).collect_view()}
        </select>
    }
}

/// A checkbox that sets `value` to `on` when checked and to `off` when not.
pub(super) fn switch<T>(
    value: RwSignal<T>,
    on: T,
    off: T,
    name: impl Into<Signal<String>>,
) -> impl IntoView
where
    T: Copy + PartialEq + Send + Sync + 'static,
{
    let name = name.into();
    view! {
        <input type="checkbox" name=move || name.get()
            prop:checked=move || value.get() == on
            on:change=move |ev| value.set(if event_target_checked(&ev) { on } else { off }) />
    }
}
