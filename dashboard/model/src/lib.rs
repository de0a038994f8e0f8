//! The dashboard's logic that needs no browser: the rule form's draft and its translation
//! to and from rule specs, the JSON line diff, chart scales and the formatting of numbers
//! and rules. It compiles for the host, so `cargo test` covers it in seconds; the Leptos
//! app in `sluice-dashboard` (wasm32 only) draws with it.

pub mod diff;
pub mod draft;
pub mod fleet;
pub mod format;
pub mod scale;

pub use draft::FieldError;
