//! `GET /api/v1/ruleset?after=VERSION&wait=SECONDS`: the proxies' long-poll, the contract
//! in `sluice_core::wire`.
//!
//! A proxy behind the current version gets the whole [`RulesetDocument`] at once. A proxy
//! that is current is held until a change commits (a `watch` channel wakes every held
//! poll within milliseconds) or `wait` seconds pass, then gets `304 Not Modified`. Each
//! poll also records the proxy (id, address, version it runs, last error), so the poll is
//! the heartbeat too.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_api::schema::RulesetDocumentSchema;
use sluice_api::{PollQuery, etag};
use sluice_core::wire::{
    PROXY_ERROR_HEADER, PROXY_ID_HEADER, PROXY_RULESET_VERSION_HEADER, RulesetDocument,
};
use utoipa::IntoParams;

use super::AppState;
use super::auth::{Auth, PollRuleset};
use super::body::{Params, Peer};
use super::error::ApiError;
use super::openapi::AuthErrors;
use super::proxy_ids::IdPath;
use super::rules::version_header;
use crate::store::{ProxySeen, now_ms};
use sluice_core::report::MAX_PROXY_ID_LEN;

/// How long a poll is held when `wait` is not given, and the most it may ask for.
pub(crate) const DEFAULT_WAIT_SECONDS: u64 = 30;
pub(crate) const MAX_WAIT_SECONDS: u64 = 60;
/// Longest error message stored: headers are the proxy's to fill.
const MAX_PROXY_ERROR_LEN: usize = 2048;

/// What a proxy says about itself when it polls. The server reads these leniently:
/// bookkeeping never costs a proxy its rules, so a value it cannot use is ignored.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // Read from the header map, leniently; the struct documents them.
pub(crate) struct ProxyHeaders {
    /// The proxy's id; polls with it are listed at /api/v1/proxies when it is 1 to 128
    /// visible ASCII characters owned by the first token that used it. Any other value is
    /// accepted and not recorded (the rules are served all the same), so the document
    /// states no pattern for it.
    #[param(rename = "x-sluice-proxy-id", value_type = String, required = false)]
    proxy_id: Option<String>,
    /// The ruleset version the proxy runs, in decimal (anything else counts as 0).
    #[param(rename = "x-sluice-ruleset-version", value_type = String, required = false)]
    ruleset_version: Option<String>,
    /// The proxy's last error, if any (cut to 2,048 bytes).
    #[param(rename = "x-sluice-proxy-error", value_type = String, required = false)]
    proxy_error: Option<String>,
}

/// Marks a proxy as polling while a poll is held; dropped when the poll ends, also when
/// the proxy hangs up and axum drops the handler's future.
struct Polling<'a> {
    state: &'a AppState,
    proxy: Option<String>,
}

impl<'a> Polling<'a> {
    fn start(state: &'a AppState, proxy: Option<String>) -> Polling<'a> {
        state.inner.metrics.long_polls.inc();
        if let (Some(id), Ok(mut polling)) = (&proxy, state.inner.polling.lock()) {
            *polling.entry(id.clone()).or_insert(0) += 1;
        }
        Polling { state, proxy }
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.state.inner.metrics.long_polls.dec();
        if let (Some(id), Ok(mut polling)) = (&self.proxy, self.state.inner.polling.lock()) {
            if let Some(n) = polling.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    polling.remove(id);
                }
            }
        }
    }
}

fn header_text(headers: &HeaderMap, name: &str, max: usize) -> Option<String> {
    let value = headers.get(name)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let text = text.trim();
    (!text.is_empty()).then(|| text.chars().take(max).collect())
}

#[utoipa::path(
    get, path = "/api/v1/ruleset", tag = "ruleset",
    params(
        PollQuery,
        ProxyHeaders,
    ),
    responses(
        (status = 200, description = "The whole ruleset, newer than `after`: enabled and disabled rules",
         body = RulesetDocumentSchema, content_type = "application/json",
         headers(("ETag" = String), ("x-sluice-ruleset-version" = u64))),
        (status = 304, description = "Nothing newer than `after` within `wait` seconds (or the server is shutting down)"),
        AuthErrors,
    ),
)]
pub(crate) async fn get_ruleset(
    State(state): State<AppState>,
    auth: Auth<PollRuleset>,
    Params(query): Params<PollQuery>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // The id follows the rule every path does (`proxy_ids`); one that breaks it, or that
    // another token owns, is not recorded, but the proxy still gets its rules: bookkeeping
    // never costs a proxy its rules. The refusal is counted.
    let proxy_id = header_text(&headers, PROXY_ID_HEADER, MAX_PROXY_ID_LEN + 1).filter(|id| {
        state
            .proxy_ids()
            .claim(IdPath::Ruleset, id, &auth.token)
            .inspect_err(|refusal| tracing::debug!(proxy = %id, ?refusal, "proxy id not recorded"))
            .is_ok()
    });
    if let Some(id) = &proxy_id {
        let seen = ProxySeen {
            id: id.clone(),
            address: peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
            token_id: Some(auth.token.id.clone()),
            ruleset_version: header_text(&headers, PROXY_RULESET_VERSION_HEADER, 32)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            error: header_text(&headers, PROXY_ERROR_HEADER, MAX_PROXY_ERROR_LEN),
        };
        // Bookkeeping must never cost a proxy its rules.
        if let Err(err) = state.store().record_proxy(&seen, now_ms()).await {
            tracing::warn!(proxy = %id, %err, "could not record the proxy");
        }
    }

    let after = query.after.map_or(0, |a| a.0);
    let wait = query.wait.unwrap_or(DEFAULT_WAIT_SECONDS);
    if wait > MAX_WAIT_SECONDS {
        return Err(ApiError::BadRequest(format!(
            "wait must be at most {MAX_WAIT_SECONDS} seconds"
        )));
    }
    let wait = Duration::from_secs(wait);
    // Subscribe before reading, so a change committed in between still wakes us.
    let mut version = state.inner.version.subscribe();
    let mut shutdown = state.inner.shutdown.subscribe();
    if *version.borrow_and_update() <= after && !wait.is_zero() && !*shutdown.borrow() {
        let _polling = Polling::start(&state, proxy_id);
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() || *version.borrow_and_update() > after {
                        break;
                    }
                }
                () = &mut deadline => break,
                _ = shutdown.wait_for(|down| *down) => break,
            }
        }
    }
    let current = *version.borrow();
    if current <= after {
        return Ok((StatusCode::NOT_MODIFIED, [version_header(current)]).into_response());
    }
    let (version, body) = document(&state).await?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::ETAG,
                HeaderValue::from_str(&etag(version)).unwrap_or(HeaderValue::from_static("\"\"")),
            ),
            version_header(version),
        ],
        body,
    )
        .into_response())
}

/// The current document, serialised once per version however many proxies poll.
async fn document(state: &AppState) -> Result<(u64, Bytes), ApiError> {
    let wanted = *state.inner.version.borrow();
    if let Ok(cache) = state.inner.document.lock() {
        if let Some((version, bytes)) = cache.as_ref() {
            if *version >= wanted {
                return Ok((*version, bytes.clone()));
            }
        }
    }
    let doc: RulesetDocument = state.store().document().await?;
    let bytes =
        Bytes::from(serde_json::to_vec(&doc).map_err(|e| ApiError::Internal(e.to_string()))?);
    if let Ok(mut cache) = state.inner.document.lock() {
        if cache.as_ref().is_none_or(|(v, _)| *v < doc.version) {
            *cache = Some((doc.version, bytes.clone()));
        }
    }
    Ok((doc.version, bytes))
}
