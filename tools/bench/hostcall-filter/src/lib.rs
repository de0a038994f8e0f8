//! A benchmark probe, not part of the product: an HTTP filter that makes one host call
//! `k` times per request and otherwise does what the pass-through filter does.
//!
//! `cargo xtask bench --only hostcalls` runs one Envoy per (call, k) beside the
//! pass-through filter (k = 0); the slope of Envoy CPU per request over k is the price of
//! one call. The plugin configuration is two words, `<call> <k>`, e.g. `header 16`, so
//! that parsing it pulls in nothing (no serde) and the module stays as small as the
//! pass-through one. Errors from the host are ignored: the call is made either way, and
//! the probe must not add work of its own.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};

/// The shared-data key the shared-data calls read and write.
const SHARED_KEY: &str = "hostcall.bench";
/// The request header the header calls read (the bench sends it on every request).
const HEADER: &str = "x-api-key";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_context_id| Box::new(ProbeRoot::default()));
}}

/// The host call to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// `get_http_request_header` of one header.
    Header,
    /// `get_http_request_headers`: the whole header map, as a filter reading everything.
    HeaderMap,
    /// `get_property(source.address)`: the peer address a client-IP key reads.
    PeerAddress,
    /// `get_current_time`.
    Clock,
    /// `get_shared_data` of one small key.
    SharedGet,
    /// `set_shared_data` of one key with a compare-and-swap value (the one just read).
    SharedCasSet,
    /// `increment_metric` of one counter.
    MetricIncrement,
    /// `add_http_response_header` (in the response-headers callback).
    AddResponseHeader,
    /// `send_http_response` with a small body: made once (k must be 1), it replaces the
    /// route's own direct response.
    SendLocalReply,
}

impl Call {
    fn parse(word: &str) -> Option<Call> {
        Some(match word {
            "header" => Call::Header,
            "header_map" => Call::HeaderMap,
            "peer_address" => Call::PeerAddress,
            "clock" => Call::Clock,
            "shared_get" => Call::SharedGet,
            "shared_cas_set" => Call::SharedCasSet,
            "metric_increment" => Call::MetricIncrement,
            "add_response_header" => Call::AddResponseHeader,
            "send_local_reply" => Call::SendLocalReply,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    call: Call,
    k: u32,
    metric: u32,
}

#[derive(Debug, Default)]
struct ProbeRoot {
    plan: Option<Plan>,
}

impl Context for ProbeRoot {}

impl RootContext for ProbeRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(bytes) = self.get_plugin_configuration() else {
            return false;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut words = text.split_whitespace();
        let call = words.next().and_then(Call::parse);
        let k = words.next().and_then(|w| w.parse::<u32>().ok());
        let (Some(call), Some(k)) = (call, k) else {
            log::error!("hostcall probe: expected `<call> <k>`, got {text:?}");
            return false;
        };
        // The key exists before the first request, as Sluice's slots do after warm-up.
        let _ = hostcalls::set_shared_data(SHARED_KEY, Some(&[0u8; 26]), None);
        let metric = hostcalls::define_metric(MetricType::Counter, "hostcall_bench").unwrap_or(0);
        self.plan = Some(Plan { call, k, metric });
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Probe { plan: self.plan }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Debug)]
struct Probe {
    plan: Option<Plan>,
}

impl Context for Probe {}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(Plan { call, k, metric }) = self.plan else {
            return Action::Continue;
        };
        for _ in 0..k {
            match call {
                Call::Header => {
                    let _ = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, HEADER);
                }
                Call::HeaderMap => {
                    let _ = hostcalls::get_map_bytes(MapType::HttpRequestHeaders);
                }
                Call::PeerAddress => {
                    let _ = hostcalls::get_property(vec!["source", "address"]);
                }
                Call::Clock => {
                    let _ = hostcalls::get_current_time();
                }
                Call::SharedGet => {
                    let _ = hostcalls::get_shared_data(SHARED_KEY);
                }
                Call::SharedCasSet => {
                    // The CAS of the key as this worker last wrote it is not returned by
                    // a set, so each set uses CAS 0 (unconditional): the same lock, copy
                    // and map update as a conditional set that succeeds.
                    let _ = hostcalls::set_shared_data(SHARED_KEY, Some(&[1u8; 26]), Some(0));
                }
                Call::MetricIncrement => {
                    let _ = hostcalls::increment_metric(metric, 1);
                }
                Call::AddResponseHeader => return Action::Continue,
                Call::SendLocalReply => {
                    let sent = hostcalls::send_http_response(
                        429,
                        vec![("content-type", "application/problem+json")],
                        Some(b"{\"title\":\"Too Many Requests\"}"),
                    );
                    return if sent.is_ok() {
                        Action::Pause
                    } else {
                        Action::Continue
                    };
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(Plan {
            call: Call::AddResponseHeader,
            k,
            ..
        }) = self.plan
        {
            for _ in 0..k {
                let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, "x-hostcall", "12");
            }
        }
        Action::Continue
    }
}
