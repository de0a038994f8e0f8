//! The dashboard, served at `/` from files embedded in the binary.
//!
//! `cargo xtask build` builds the Leptos app (wasm32 + wasm-bindgen) into
//! `dashboard/dist/` before it builds this crate, and rust-embed puts those files into
//! the binary. `allow_missing` and `build.rs` let a native build work before the
//! dashboard was ever built: `/` then explains how to build it.
//!
//! Files under `assets/` carry a content hash in their names, so they are cached for a
//! year; `index.html` is revalidated on every load (its ETag makes that a 304). Any other
//! path without a file extension is a route of the app (`/rules/api-per-key`) and gets
//! `index.html`, which routes on the client. Unknown `/api/` paths stay JSON 404s.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::Embed;

use crate::http::{header_items, no_such_endpoint};

#[derive(Embed)]
#[folder = "../dashboard/dist/"]
#[allow_missing = true]
struct Assets;

const INDEX: &str = "index.html";

/// Hashed, immutable build outputs.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The app loads only its own scripts, styles and the API; wasm needs
/// `wasm-unsafe-eval`; Leptos sets `style` attributes, hence `unsafe-inline` for styles.
const CSP: &str = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; \
                   style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const NOT_BUILT: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>Sluice</title></head><body style=\"font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;line-height:1.5\">\
<h1>Sluice</h1><p>The dashboard was not built into this binary. Build it with \
<code>cargo xtask build</code> (which builds the dashboard, then this binary).</p>\
<p>The JSON API is at <a href=\"/api/v1/openapi.json\">/api/v1/openapi.json</a>.</p></body></html>";

/// The dashboard beside the API (see `crate::server::app`): every path the API does not
/// route.
pub(crate) fn router() -> Router {
    Router::new().fallback(serve)
}

/// Dashboard files and routes; unknown `/api/` paths, and anything but GET and HEAD,
/// are the API's JSON 404s.
async fn serve(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let api_path = path == "/api" || path.starts_with("/api/");
    if api_path || (method != Method::GET && method != Method::HEAD) {
        return no_such_endpoint().into_response();
    }
    let name = path.trim_start_matches('/');
    let name = if name.is_empty() { INDEX } else { name };
    let (name, file) = match Assets::get(name) {
        Some(file) => (name, file),
        None if name == INDEX || is_app_route(name) => match Assets::get(INDEX) {
            Some(file) => (INDEX, file),
            None => return not_built(),
        },
        None => return (StatusCode::NOT_FOUND, "not found\n").into_response(),
    };
    // A gzipped copy, when the build made one and the browser takes it.
    let gzipped = accepts_gzip(&headers)
        .then(|| Assets::get(&format!("{name}.gz")))
        .flatten();
    let encoded = gzipped.is_some();
    let file = gzipped.unwrap_or(file);
    let etag = format!(
        "\"{}{}\"",
        hex(&file.metadata.sha256_hash()[..12]),
        if encoded { "-gz" } else { "" }
    );
    let mut response = if if_none_match(&headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else if method == Method::HEAD {
        let mut head = StatusCode::OK.into_response();
        head.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(file.data.len()));
        head
    } else {
        (StatusCode::OK, Body::from(file.data.into_owned())).into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(name)),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if name.starts_with("assets/") {
            IMMUTABLE
        } else {
            "no-cache"
        }),
    );
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, etag);
    }
    if encoded {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if Assets::get(&format!("{name}.gz")).is_some() {
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    security_headers(h, name.ends_with(".html"));
    response
}

/// A path the app routes itself: not under `assets/` and without a file extension.
fn is_app_route(name: &str) -> bool {
    !name.starts_with("assets/") && !name.rsplit('/').next().unwrap_or("").contains('.')
}

fn not_built() -> Response {
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, NOT_BUILT).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    security_headers(h, true);
    response
}

fn security_headers(h: &mut HeaderMap, html: bool) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if html {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    header_items(headers, header::ACCEPT_ENCODING, ',').any(|coding| {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
        name.eq_ignore_ascii_case("gzip") && !refused
    })
}

fn if_none_match(headers: &HeaderMap, etag: &str) -> bool {
    header_items(headers, header::IF_NONE_MATCH, ',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == etag || t == "*")
}

fn content_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map_or("", |(_, ext)| ext);
    match ext {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_routes_are_extensionless_paths_outside_assets() {
        assert!(is_app_route("rules"));
        assert!(is_app_route("rules/api-per-key"));
        assert!(is_app_route("clients/alice"));
        assert!(!is_app_route("assets/app-0123.js"));
        assert!(!is_app_route("favicon.ico"));
        assert!(!is_app_route("assets/missing"));
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("assets/a-1.wasm"), "application/wasm");
        assert_eq!(
            content_type("assets/a-1.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type("assets/a-1.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("x"), "application/octet-stream");
    }

    /// Headers holding one value.
    fn one(name: header::HeaderName, value: &'static str) -> HeaderMap {
        HeaderMap::from_iter([(name, HeaderValue::from_static(value))])
    }

    #[test]
    fn gzip_is_used_unless_refused() {
        assert!(accepts_gzip(&one(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br"
        )));
        assert!(!accepts_gzip(&one(header::ACCEPT_ENCODING, "br, gzip;q=0")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn etags_match_with_or_without_weakness_and_in_lists() {
        let h = one(header::IF_NONE_MATCH, "\"a\", W/\"b\"");
        assert!(if_none_match(&h, "\"b\""));
        assert!(!if_none_match(&h, "\"c\""));
    }
}
