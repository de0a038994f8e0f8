//! The floor of any proxy-wasm HTTP filter: it creates a context per request and returns
//! `Continue` from every callback, touching nothing else.
//!
//! `cargo xtask bench` runs it beside Envoy with no filter and beside Sluice, so that the
//! cost of the wasm boundary itself (VM entry, context creation and teardown) is told
//! apart from the cost of Sluice's own work. It must stay this small: anything added here
//! moves the baseline.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_context_id| Box::new(PassthroughRoot));
}}

/// The per-VM root context: makes one [`Passthrough`] per request.
#[derive(Debug)]
struct PassthroughRoot;

impl Context for PassthroughRoot {}

impl RootContext for PassthroughRoot {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Passthrough))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The per-request context. The SDK's default callbacks all return `Continue`; the
/// request-headers one is spelled out because it is the one every real filter overrides.
#[derive(Debug)]
struct Passthrough;

impl Context for Passthrough {}

impl HttpContext for Passthrough {
    fn on_http_request_headers(
        &mut self,
        _num_headers: usize,
        _end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        proxy_wasm::types::Action::Continue
    }
}
