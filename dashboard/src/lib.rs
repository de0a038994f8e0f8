//! Sluice's dashboard: a client-side Leptos app over the admin API's JSON REST API.
//!
//! Everything a screen shows or changes goes through the same `/api/v1` endpoints that
//! scripts use (so every screen is also scriptable). The app signs in once with an API
//! token (`POST /api/v1/session`); the browser then holds only an HttpOnly session cookie.
//! Rule forms validate as you type with the very code the server runs,
//! `sluice_core::rule::Rule::try_from`, compiled to wasm32 with the rest of the app.
//!
//! * [`api`]: fetch, problem documents, the API's types.
//! * [`app`]: the shell (sign-in, navigation, session) and the routes.
//! * [`pages`]: overview, rules and the rule form, clients, history and audit.
//! * [`chart`]: plain SVG time-series charts and sparklines.

pub mod api;
pub mod app;
pub mod chart;
pub mod components;
pub mod diff;
pub mod format;
pub mod pages;

use wasm_bindgen::prelude::wasm_bindgen;

/// Entry point, called by the generated JavaScript once the module is instantiated.
#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(app::App);
}
