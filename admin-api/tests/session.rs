//! The dashboard's sign-in (`/api/v1/session`), its cookie, and the dashboard's files at
//! `/`, on SQLite and PostgreSQL alike.

use serde::Serialize;
use serde_json::json;
use sluice_admin::store::Role;
use sluice_admin::testing::{Req, TestApp, TestDb, items, rule};

sluice_admin::on_every_backend!(
    a_token_signs_in_and_the_cookie_then_acts_as_it,
    proxy_and_unknown_tokens_cannot_sign_in,
    signing_out_or_revoking_the_token_ends_the_session,
    cookie_changes_must_come_from_the_same_origin,
    the_dashboard_is_served_with_an_app_fallback,
);

/// The `sluice_session=...` pair from a Set-Cookie header.
fn session_cookie(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().trim().to_string()
}

/// A sign-in with `token` (a secret, or anything).
fn sign_in_request(api: &TestApp, token: impl Serialize) -> Req {
    api.post("/api/v1/session")
        .no_token()
        .json(&json!({ "token": token }))
}

async fn sign_in(api: &TestApp, token: &str) -> String {
    let resp = sign_in_request(api, token).expect(201).await;
    let set_cookie = resp.header("set-cookie").unwrap().to_string();
    assert!(set_cookie.starts_with("sluice_session="), "{set_cookie}");
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    assert!(set_cookie.contains("SameSite=Strict"), "{set_cookie}");
    assert!(set_cookie.contains("Path=/"), "{set_cookie}");
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");
    session_cookie(&set_cookie)
}

async fn a_token_signs_in_and_the_cookie_then_acts_as_it(db: TestDb) {
    let api = TestApp::new(&db).await;
    let editor = db.token(Role::Editor).await;
    let cookie = sign_in(&api, &editor).await;
    // The id is random and the token is nowhere in it.
    assert!(!cookie.contains(&editor));

    let me = api
        .get("/api/v1/session")
        .cookie(&format!("theme=dark; {cookie}"))
        .expect(200)
        .await
        .json();
    assert_eq!(me["role"], "editor");
    assert_eq!(me["token_name"], "test-editor");

    // The cookie writes, and the audit log names the token behind it.
    api.post("/api/v1/rules")
        .cookie(&cookie)
        .same_origin()
        .json(&rule("from-the-dashboard"))
        .expect(201)
        .await;
    let audit = api.read("/api/v1/audit").await;
    assert_eq!(audit["entries"][0]["actor_name"], "test-editor");

    // A viewer's session reads but may not write.
    let viewer = db.token(Role::Viewer).await;
    let viewer_cookie = sign_in(&api, &viewer).await;
    api.get("/api/v1/rules")
        .cookie(&viewer_cookie)
        .expect(200)
        .await;
    api.post("/api/v1/rules/from-the-dashboard/disable")
        .cookie(&viewer_cookie)
        .same_origin()
        .expect(403)
        .await;

    // Behind a TLS-terminating proxy the cookie is Secure.
    let resp = api
        .post("/api/v1/session")
        .no_token()
        .header("x-forwarded-proto", "https")
        .json(&json!({ "token": viewer }))
        .expect(201)
        .await;
    assert!(resp.header("set-cookie").unwrap().contains("; Secure"));
}

async fn proxy_and_unknown_tokens_cannot_sign_in(db: TestDb) {
    let api = TestApp::new(&db).await;
    let proxy = db.token(Role::Proxy).await;
    let resp = sign_in_request(&api, proxy).expect(403).await;
    assert!(resp.header("set-cookie").is_none());
    assert_eq!(resp.json()["type"], "urn:sluice:forbidden");
    let resp = sign_in_request(&api, "slc_not-a-token").expect(401).await;
    assert!(resp.header("set-cookie").is_none());
    api.post("/api/v1/session")
        .no_token()
        .json(&json!({ "secret": "x" }))
        .expect(422)
        .await;
    // A made-up cookie is no session.
    api.get("/api/v1/session")
        .cookie("sluice_session=made-up")
        .expect(401)
        .await;
    api.get("/api/v1/session").no_token().expect(401).await;
}

async fn signing_out_or_revoking_the_token_ends_the_session(db: TestDb) {
    let api = TestApp::new(&db).await;
    let viewer = db.token(Role::Viewer).await;
    let cookie = sign_in(&api, &viewer).await;
    let resp = api
        .delete("/api/v1/session")
        .cookie(&cookie)
        .expect(204)
        .await;
    assert!(resp.header("set-cookie").unwrap().contains("Max-Age=0"));
    api.get("/api/v1/session").cookie(&cookie).expect(401).await;

    let cookie = sign_in(&api, &viewer).await;
    let tokens = api.read("/api/v1/tokens").await;
    let id = items(&tokens["tokens"])
        .find(|t| t["name"] == "test-viewer")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.delete(&format!("/api/v1/tokens/{id}"))
        .expect(200)
        .await;
    api.get("/api/v1/rules").cookie(&cookie).expect(401).await;
}

/// A request's name, its extra headers, and the status expected.
type Case = (&'static str, &'static [(&'static str, &'static str)], u16);

/// A change made with the cookie must say it comes from the dashboard's own origin: the
/// exact scheme and host in `Origin`, or `Sec-Fetch-Site: same-origin`. Anything else,
/// no `Origin` at all included, is refused; reads need neither.
async fn cookie_changes_must_come_from_the_same_origin(db: TestDb) {
    let api = TestApp::new(&db).await;
    let admin = api.admin.clone();
    let cookie = sign_in(&api, &admin).await;
    let host = "127.0.0.1:8080";
    let cases: [Case; 11] = [
        ("same-origin", &[("origin", "http://127.0.0.1:8080")], 201),
        ("no-origin", &[], 401),
        ("cross-site", &[("origin", "http://evil.example")], 401),
        ("other-scheme", &[("origin", "https://127.0.0.1:8080")], 401),
        ("other-port", &[("origin", "http://127.0.0.1:8081")], 401),
        ("null-origin", &[("origin", "null")], 401),
        (
            "fetch-same-origin",
            &[("sec-fetch-site", "same-origin")],
            201,
        ),
        (
            "fetch-same-site",
            &[
                ("sec-fetch-site", "same-site"),
                ("origin", "http://127.0.0.1:8080"),
            ],
            401,
        ),
        ("fetch-cross-site", &[("sec-fetch-site", "cross-site")], 401),
        // Behind a TLS-terminating proxy the dashboard's origin is https.
        (
            "tls-fronted",
            &[
                ("origin", "https://127.0.0.1:8080"),
                ("x-forwarded-proto", "https"),
            ],
            201,
        ),
        (
            "tls-fronted-http-origin",
            &[
                ("origin", "http://127.0.0.1:8080"),
                ("x-forwarded-proto", "https"),
            ],
            401,
        ),
    ];
    for (name, headers, status) in cases {
        let mut request = api
            .post("/api/v1/rules")
            .cookie(&cookie)
            .header("host", host);
        for (header, value) in headers {
            request = request.header(header, value);
        }
        let response = request.json(&rule(name)).send().await;
        assert_eq!(
            response.status.as_u16(),
            status,
            "{name}: {}",
            response.text()
        );
    }
    // Reads need no Origin.
    api.get("/api/v1/rules").cookie(&cookie).expect(200).await;
}

async fn the_dashboard_is_served_with_an_app_fallback(db: TestDb) {
    let api = TestApp::new(&db).await;
    // Built or not, `/` and app routes answer HTML; unknown API paths stay JSON.
    for path in ["/", "/rules/api-per-key", "/clients"] {
        let resp = api.get(path).no_token().send().await;
        assert!(
            resp.status.as_u16() == 200 || resp.status.as_u16() == 503,
            "{path}: {}",
            resp.status
        );
        assert_eq!(
            resp.header("content-type"),
            Some("text/html; charset=utf-8"),
            "{path}"
        );
        // The app's own scripts and wasm only, never framed (the browser tests run the
        // dashboard under exactly this policy).
        let csp = resp.header("content-security-policy").unwrap_or_default();
        for directive in [
            "default-src 'self'",
            "script-src 'self' 'wasm-unsafe-eval'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert_eq!(
            resp.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(
            resp.header("referrer-policy"),
            Some("no-referrer"),
            "{path}"
        );
    }
    let resp = api.get("/api/v1/nope").expect(404).await;
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    // API answers are never sniffed into something else either.
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
    api.get("/assets/missing-0000.js")
        .no_token()
        .expect(404)
        .await;
    api.post("/rules").no_token().expect(404).await;
}
