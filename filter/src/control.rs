//! The control service: a singleton root context on Envoy's main thread (bootstrap
//! extension, same `vm_id` and module as the filter) that follows the admin API.
//!
//! It long-polls `GET /api/v1/ruleset?after=VERSION`: the admin API answers at once when
//! a newer ruleset exists and otherwise holds the request until one does. Each answer is
//! validated whole before it is published to the workers; a ruleset that fails is
//! refused (the last good one stays) and reported on the next poll. When the admin API
//! is unreachable or answers garbage, the service retries with exponential backoff and
//! the workers keep enforcing what they have.

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use sluice_core::config::ControlConfigSpec;
use sluice_core::wire::{
    PROXY_ERROR_HEADER, PROXY_ID_HEADER, PROXY_RULESET_VERSION_HEADER, RULESET_PATH,
    RulesetDocument,
};

use crate::metrics::ControlMetrics;
use crate::ruleset_channel;

/// How often the service checks whether a retry is due.
pub const TICK: Duration = Duration::from_millis(250);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
// Short enough that a restarted admin API is followed again within seconds.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Extra time the HTTP call may take beyond the poll's own hold time.
const CALL_SLACK: Duration = Duration::from_secs(5);
/// Longest error text sent back to the admin API.
const MAX_ERROR_LEN: usize = 300;

/// The control service's state between callbacks.
#[derive(Debug)]
pub struct ControlService {
    config: ControlConfigSpec,
    proxy_id: String,
    /// The version published to the workers.
    running_version: u64,
    /// The newest version seen, including a refused one, so a bad ruleset is not
    /// fetched again in a loop: the next poll waits for a newer one.
    seen_version: u64,
    last_error: Option<String>,
    in_flight: bool,
    retry_at: Duration,
    backoff: Duration,
    metrics: ControlMetrics,
}

impl ControlService {
    pub fn new(config: ControlConfigSpec) -> ControlService {
        let proxy_id = config.proxy_id.clone().unwrap_or_else(default_proxy_id);
        // After a VM reload, shared data still holds what this service published.
        let running_version = ruleset_channel::published_version()
            .ok()
            .flatten()
            .unwrap_or(0);
        log::info!(
            "control service for proxy {proxy_id}: following the admin API through cluster {} \
             from ruleset version {running_version}",
            config.admin_cluster
        );
        ControlService {
            config,
            proxy_id,
            running_version,
            seen_version: running_version,
            last_error: None,
            in_flight: false,
            retry_at: Duration::ZERO,
            backoff: FIRST_BACKOFF,
            metrics: ControlMetrics::define(),
        }
    }

    /// Called on every tick: starts a poll when none is running and no backoff is due.
    pub fn on_tick(&mut self) {
        if !self.in_flight && now() >= self.retry_at {
            self.poll();
        }
    }

    fn poll(&mut self) {
        let path = format!(
            "{RULESET_PATH}?after={}&wait={}",
            self.seen_version, self.config.poll_timeout_seconds
        );
        let authorization = format!("Bearer {}", self.config.token);
        let version = self.running_version.to_string();
        let mut headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.config.admin_authority.as_str()),
            ("authorization", authorization.as_str()),
            (PROXY_ID_HEADER, self.proxy_id.as_str()),
            (PROXY_RULESET_VERSION_HEADER, version.as_str()),
        ];
        if let Some(error) = &self.last_error {
            headers.push((PROXY_ERROR_HEADER, error.as_str()));
        }
        let timeout = Duration::from_secs(u64::from(self.config.poll_timeout_seconds)) + CALL_SLACK;
        self.metrics.polls.inc();
        match hostcalls::dispatch_http_call(
            &self.config.admin_cluster,
            headers,
            None,
            vec![],
            timeout,
        ) {
            Ok(_) => self.in_flight = true,
            Err(status) => self.fail(format!(
                "cannot call cluster {}: {status:?}",
                self.config.admin_cluster
            )),
        }
    }

    /// Called with the answer to a poll (or its failure: no headers at all).
    pub fn on_response(&mut self, body_size: usize) {
        self.in_flight = false;
        let status = hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders)
            .ok()
            .and_then(|headers| headers.into_iter().find(|(name, _)| name == ":status"))
            .and_then(|(_, value)| {
                std::str::from_utf8(&value)
                    .ok()
                    .and_then(|s| s.parse::<u16>().ok())
            });
        match status {
            Some(200) => {
                let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                    .ok()
                    .flatten();
                self.apply(body.as_deref().unwrap_or_default());
            }
            // Nothing changed while the poll was held: ask again at once.
            Some(304) => self.succeed(),
            Some(401 | 403) => self.fail(format!(
                "the admin API refused the proxy token (HTTP {})",
                status.unwrap_or(0)
            )),
            Some(other) => self.fail(format!("the admin API answered HTTP {other}")),
            None => self
                .fail("the admin API did not answer (connection failed or timed out)".to_string()),
        }
        if !self.in_flight && now() >= self.retry_at {
            self.poll();
        }
    }

    fn apply(&mut self, body: &[u8]) {
        let doc = match RulesetDocument::from_json(body) {
            Ok(doc) => doc,
            Err(e) => return self.fail(format!("the admin API sent an unreadable ruleset: {e}")),
        };
        if doc.version <= self.running_version {
            // An answer to an older question; nothing to do.
            return self.succeed();
        }
        match doc.compile() {
            Ok(ruleset) => match ruleset_channel::publish(&doc) {
                Ok(()) => {
                    log::info!(
                        "applied ruleset version {} ({} rules)",
                        doc.version,
                        ruleset.rules().len()
                    );
                    self.running_version = doc.version;
                    self.seen_version = doc.version;
                    self.last_error = None;
                    self.metrics.updates.inc();
                    self.metrics.version.set(doc.version);
                    self.succeed();
                }
                Err(e) => self.fail(e),
            },
            Err(errors) => {
                // Keep the last good ruleset; tell the admin API why on the next poll and
                // wait for a newer version instead of fetching this one again.
                self.metrics.refused.inc();
                self.seen_version = doc.version;
                let message = format!("refused ruleset version {}: {errors}", doc.version);
                log::error!("{message}");
                self.last_error = Some(header_safe(&message));
                self.backoff = FIRST_BACKOFF;
                self.retry_at = Duration::ZERO;
            }
        }
    }

    fn succeed(&mut self) {
        self.backoff = FIRST_BACKOFF;
        self.retry_at = Duration::ZERO;
    }

    fn fail(&mut self, message: String) {
        self.metrics.errors.inc();
        log::warn!("{message}; retrying in {} s", self.backoff.as_secs());
        self.last_error = Some(header_safe(&message));
        self.retry_at = now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// Envoy's node id when it has one, else an id made from the start time.
fn default_proxy_id() -> String {
    hostcalls::get_property(vec!["node", "id"])
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|id| !id.is_empty())
        .map(|id| header_safe(&id))
        .unwrap_or_else(|| format!("envoy-{:x}", now().as_nanos()))
}

fn now() -> Duration {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default()
}

/// Header values must be visible ASCII: anything else becomes `?`, and long messages
/// are cut.
fn header_safe(text: &str) -> String {
    text.chars()
        .take(MAX_ERROR_LEN)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}
