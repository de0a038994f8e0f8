//! Talking to the admin API: `fetch` with the session cookie, JSON in and out, and
//! `application/problem+json` errors turned into [`ApiError`]s with their field list.

use std::cell::RefCell;

use serde::Serialize;
use serde::de::DeserializeOwned;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Request, RequestCredentials, RequestInit, Response};

/// The API's request and answer types, as the server defines them.
pub use sluice_api::{
    AuditList, ChangeKind, ChangeSummary, ClientHistory, ClientMetricsList, DiffView, FieldError,
    GlobalSyncView, Overview, Problem, ProxyList, RuleEstimate, RuleList, RuleMetricsList,
    RuleSpec, RuleView, Series, SeriesPoint, SessionView, SignIn, StreamEvent, VersionList,
    VersionView,
};

/// A failed call: the problem document's parts, or a network failure (status 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: String,
    pub title: String,
    pub detail: String,
    pub errors: Vec<FieldError>,
}

impl ApiError {
    fn network(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: 0,
            kind: String::new(),
            title: "Network error".to_string(),
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// One line for a banner.
    pub fn message(&self) -> String {
        match self.status {
            0 => format!("Cannot reach the admin API: {}", self.detail),
            404 if self.detail == "no such endpoint" => {
                "This admin API does not offer this yet (404).".to_string()
            }
            _ if self.detail.is_empty() => format!("{} ({})", self.title, self.status),
            _ => self.detail.clone(),
        }
    }
}

thread_local! {
    /// Called when a request is answered 401: the session ended (signed out elsewhere,
    /// expired, token revoked), so the app goes back to the sign-in screen.
    static ON_UNAUTHORIZED: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
}

pub fn on_unauthorized(f: impl Fn() + 'static) {
    ON_UNAUTHORIZED.with(|cell| *cell.borrow_mut() = Some(Box::new(f)));
}

/// A response's body and the headers the app uses.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub status: u16,
    pub etag: Option<String>,
    pub body: String,
}

fn js_error(value: JsValue) -> ApiError {
    let text = value
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| value.as_string())
        .unwrap_or_else(|| "request failed".to_string());
    ApiError::network(text)
}

/// Sends one request. `body` is JSON text; `content_type` defaults to JSON.
pub async fn send(
    method: &str,
    path: &str,
    body: Option<(&str, String)>,
    if_match: Option<&str>,
) -> Result<Fetched, ApiError> {
    let init = RequestInit::new();
    init.set_method(method);
    init.set_credentials(RequestCredentials::SameOrigin);
    if let Some((_, text)) = &body {
        init.set_body(&JsValue::from_str(text));
    }
    let request = Request::new_with_str_and_init(path, &init).map_err(js_error)?;
    let headers = request.headers();
    headers
        .set("accept", "application/json")
        .map_err(js_error)?;
    if let Some((content_type, _)) = &body {
        headers
            .set("content-type", content_type)
            .map_err(js_error)?;
    }
    if let Some(tag) = if_match {
        headers.set("if-match", tag).map_err(js_error)?;
    }
    let window = web_sys::window().ok_or_else(|| ApiError::network("no window"))?;
    let response: Response = JsFuture::from(window.fetch_with_request(&request))
        .await
        .map_err(js_error)?
        .dyn_into()
        .map_err(js_error)?;
    let status = response.status();
    let etag = response.headers().get("etag").ok().flatten();
    let text = JsFuture::from(response.text().map_err(js_error)?)
        .await
        .map_err(js_error)?
        .as_string()
        .unwrap_or_default();
    if (200..300).contains(&status) {
        return Ok(Fetched {
            status,
            etag,
            body: text,
        });
    }
    if status == 401 && path != SESSION_PATH {
        ON_UNAUTHORIZED.with(|cell| {
            if let Some(f) = cell.borrow().as_ref() {
                f();
            }
        });
    }
    let problem: Problem = serde_json::from_str(&text).unwrap_or(Problem {
        kind: String::new(),
        title: response.status_text(),
        status,
        detail: String::new(),
        errors: Vec::new(),
    });
    Err(ApiError {
        status,
        kind: problem.kind,
        title: problem.title,
        detail: problem.detail,
        errors: problem.errors,
    })
}

fn parse<T: DeserializeOwned>(fetched: &Fetched) -> Result<T, ApiError> {
    serde_json::from_str(&fetched.body).map_err(|e| ApiError {
        status: fetched.status,
        kind: String::new(),
        title: "Unexpected answer".to_string(),
        detail: format!("the admin API answered something unexpected: {e}"),
        errors: Vec::new(),
    })
}

pub async fn get<T: DeserializeOwned>(path: &str) -> Result<T, ApiError> {
    parse(&send("GET", path, None, None).await?)
}

pub async fn post_json<T: DeserializeOwned>(
    path: &str,
    body: &impl Serialize,
) -> Result<T, ApiError> {
    let text = serde_json::to_string(body).unwrap_or_default();
    parse(&send("POST", path, Some(("application/json", text)), None).await?)
}

/// A POST without a body (enable, disable, rollback), with an optional `If-Match`.
pub async fn post_empty<T: DeserializeOwned>(
    path: &str,
    if_match: Option<&str>,
) -> Result<T, ApiError> {
    parse(&send("POST", path, None, if_match).await?)
}

/// Percent-encodes one path segment or query value.
pub fn enc(text: &str) -> String {
    String::from(js_sys::encode_uri_component(text))
}

pub const SESSION_PATH: &str = "/api/v1/session";

/// Now, in Unix milliseconds (the browser's clock).
pub fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}
