//! Test support: a fresh database per test on every backend, and a small request builder
//! that drives the router with `tower::ServiceExt::oneshot` or a real server over HTTP.
//!
//! `on_every_backend!(a, b)` turns `async fn a(db: TestDb)` into `sqlite::a` and
//! `postgres::a`: one behaviour suite, run against both databases. The PostgreSQL half
//! needs `SLUICE_TEST_POSTGRES_URL` (`cargo xtask test` provides a throwaway server); it
//! fails without it when `SLUICE_REQUIRE_POSTGRES=1` (as under xtask) and is skipped with
//! a notice otherwise.

use std::net::SocketAddr;
use std::panic::Location;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::http::AppState;
use crate::server::{self, ServeOptions, Server};
use crate::store::{Actor, Role, Store, now_ms};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::Value;
use tower::ServiceExt as _;

pub const POSTGRES_URL_ENV: &str = "SLUICE_TEST_POSTGRES_URL";
pub const REQUIRE_POSTGRES_ENV: &str = "SLUICE_REQUIRE_POSTGRES";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh, migrated database that disappears with the test.
#[derive(Debug)]
pub struct TestDb {
    pub store: Store,
    pub url: String,
    pub backend: Backend,
    _dir: Option<tempfile::TempDir>,
    _postgres: Option<PostgresDb>,
}

/// A database created on the test server for one test; dropped (forcibly) after it.
#[derive(Debug)]
struct PostgresDb {
    server_url: String,
    name: String,
}

impl Drop for PostgresDb {
    fn drop(&mut self) {
        let server_url = self.server_url.clone();
        let name = self.name.clone();
        // Drop cannot await, and the test's runtime may be gone: a thread with its own
        // runtime drops the database, even after a failed (panicking) test.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                sqlx::any::install_default_drivers();
                let pool = sqlx::AnyPool::connect(&server_url).await.ok()?;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::query(&sql).execute(&pool).await.ok()?;
                pool.close().await;
                Some(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("note: could not drop test database {}", self.name);
        }
    }
}

fn random_suffix() -> String {
    use rand::Rng as _;
    let n: u64 = rand::rng().random();
    format!("{n:016x}")
}

/// `postgres://user@host:port/db?x` with another database name.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{name}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

impl TestDb {
    /// A new database on `backend`, or `None` (after a notice) when PostgreSQL is not
    /// available and not required.
    pub async fn new(backend: Backend) -> Option<TestDb> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
                let store = Store::open(&url).await.expect("open sqlite");
                Some(TestDb {
                    store,
                    url,
                    backend,
                    _dir: Some(dir),
                    _postgres: None,
                })
            }
            Backend::Postgres => {
                let Ok(server_url) = std::env::var(POSTGRES_URL_ENV) else {
                    if std::env::var(REQUIRE_POSTGRES_ENV).is_ok_and(|v| v == "1") {
                        panic!(
                            "{REQUIRE_POSTGRES_ENV}=1 but {POSTGRES_URL_ENV} is not set: \
                             the PostgreSQL half of the suite cannot run"
                        );
                    }
                    static NOTICE: OnceLock<()> = OnceLock::new();
                    NOTICE.get_or_init(|| {
                        eprintln!(
                            "note: {POSTGRES_URL_ENV} is not set, so the PostgreSQL tests pass \
                             without running; `cargo xtask test` runs them against a real server"
                        );
                    });
                    return None;
                };
                sqlx::any::install_default_drivers();
                let name = format!("sluice_t_{}", random_suffix());
                let admin = sqlx::AnyPool::connect(&server_url)
                    .await
                    .expect("connect to the test PostgreSQL server");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&admin)
                    .await
                    .expect("create a test database");
                admin.close().await;
                let postgres = PostgresDb {
                    server_url: server_url.clone(),
                    name: name.clone(),
                };
                let url = with_database(&server_url, &name);
                let store = Store::open(&url).await.expect("open postgres");
                Some(TestDb {
                    store,
                    url,
                    backend,
                    _dir: None,
                    _postgres: Some(postgres),
                })
            }
        }
    }

    /// The ruleset version, the rules, the audit entries and the versions listed: what a
    /// refused change must leave alone.
    pub async fn footprint(&self) -> (u64, u64, u64, usize) {
        (
            self.store.current_version().await.unwrap(),
            self.store.rule_count().await.unwrap(),
            self.store.audit_count().await.unwrap(),
            self.store.list_versions(1000, None).await.unwrap().len(),
        )
    }

    /// The secret of a token with `role` that the command line has revoked.
    pub async fn revoked_token(&self, role: Role) -> String {
        let secret = self.token(role).await;
        let id = self.token_id(&secret).await;
        self.store
            .revoke_token(&Actor::cli(), &id, now_ms())
            .await
            .unwrap();
        secret
    }

    /// The id of the token with this secret.
    pub async fn token_id(&self, secret: &str) -> String {
        let found = self.store.find_token(secret).await.expect("find token");
        found.expect("no token has this secret").id
    }

    /// A token with `role`, created directly in the database; returns its secret.
    pub async fn token(&self, role: Role) -> String {
        self.store
            .create_token(&Actor::system(), &format!("test-{role}"), role, now_ms())
            .await
            .expect("create token")
            .secret
    }
}

/// Runs each `async fn NAME(db: TestDb)` on SQLite and on PostgreSQL.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = $crate::testing::TestDb::new($crate::testing::Backend::Sqlite).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = $crate::testing::TestDb::new($crate::testing::Backend::Postgres).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
    };
}

/// The router over a test database, with an admin token.
#[derive(Debug, Clone)]
pub struct TestApp {
    pub app: Router,
    pub state: AppState,
    pub admin: String,
}

impl TestApp {
    pub async fn new(db: &TestDb) -> TestApp {
        let state = AppState::new(db.store.clone()).await.expect("state");
        TestApp::over(db, state).await
    }

    /// An app over `state` (built by the test), with an admin token of `db`.
    pub async fn over(db: &TestDb, state: AppState) -> TestApp {
        TestApp {
            app: server::app(state.clone(), true),
            admin: db.token(Role::Admin).await,
            state,
        }
    }

    pub fn req(&self, method: Method, path: &str) -> Req {
        Req {
            app: self.app.clone(),
            method,
            path: path.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            peer: None,
        }
        .token(&self.admin)
    }

    pub fn get(&self, path: &str) -> Req {
        self.req(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> Req {
        self.req(Method::POST, path)
    }

    pub fn put(&self, path: &str) -> Req {
        self.req(Method::PUT, path)
    }

    pub fn patch(&self, path: &str) -> Req {
        self.req(Method::PATCH, path)
    }

    pub fn delete(&self, path: &str) -> Req {
        self.req(Method::DELETE, path)
    }

    /// The server's own Prometheus metrics (`/metrics`), as text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").send().await.expect(200).text()
    }

    /// The OpenAPI document, fetched as anyone may (no token).
    pub async fn openapi(&self) -> Value {
        self.get("/api/v1/openapi.json")
            .no_token()
            .send()
            .await
            .expect(200)
            .json()
    }

    /// Creates `rule` as the admin: 201, or the test fails where it called this.
    #[track_caller]
    pub fn create(&self, rule: &Value) -> impl Future<Output = Resp> + use<> {
        let caller = Location::caller();
        let request = self.post("/api/v1/rules").json(rule);
        async move { request.send().await.expect_at(201, caller) }
    }

    /// GETs `path` as the admin: 200 and its JSON, or the test fails where it called this.
    #[track_caller]
    pub fn read(&self, path: &str) -> impl Future<Output = Value> + use<> {
        let caller = Location::caller();
        let request = self.get(path);
        async move { request.send().await.expect_at(200, caller).json() }
    }
}

/// One request through the router.
#[derive(Debug)]
pub struct Req {
    app: Router,
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The TCP peer the server sees (none: like a router driven without a socket).
    peer: Option<SocketAddr>,
}

impl Req {
    /// Sends the request as if from `peer`.
    pub fn from(mut self, peer: SocketAddr) -> Req {
        self.peer = Some(peer);
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn token(self, token: &str) -> Req {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// Sends the dashboard's session cookie instead of a token.
    pub fn cookie(self, cookie: &str) -> Req {
        self.no_token().header("cookie", cookie)
    }

    /// Sends the `Host` and `Origin` a browser sends with a change made from the
    /// dashboard's own page (over plain HTTP).
    pub fn same_origin(self) -> Req {
        self.header("host", DASHBOARD_HOST)
            .header("origin", &format!("http://{DASHBOARD_HOST}"))
    }

    pub fn no_token(mut self) -> Req {
        self.headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case("authorization"));
        self
    }

    pub fn json(self, value: &Value) -> Req {
        self.raw("application/json", serde_json::to_vec(value).unwrap())
    }

    pub fn raw(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Req {
        self.body = body.into();
        self.header("content-type", content_type)
    }

    /// Sends the request and asserts its status: `req.expect(201).await` is
    /// `req.send().await.expect(201)`, failing where the test called it.
    #[track_caller]
    pub fn expect(self, status: u16) -> impl Future<Output = Resp> {
        let caller = Location::caller();
        async move { self.send().await.expect_at(status, caller) }
    }

    pub async fn send(self) -> Resp {
        let mut request = Request::builder().method(self.method).uri(&self.path);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(peer) = self.peer {
            request = request.extension(ConnectInfo(peer));
        }
        let request = request.body(Body::from(self.body)).unwrap();
        let response = self.app.oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Resp {
            status,
            headers,
            body,
        }
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status, showing the body when it differs.
    #[track_caller]
    pub fn expect(self, status: u16) -> Resp {
        self.expect_at(status, Location::caller())
    }

    /// [`Resp::expect`] for a request made at `caller`.
    fn expect_at(self, status: u16, caller: &Location<'_>) -> Resp {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status (request at {caller}); body: {}",
            self.text()
        );
        self
    }

    /// The `field` of every problem in a 422.
    pub fn fields(&self) -> Vec<String> {
        self.json()["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| e["field"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Asserts that `text` holds `needle`, showing all of `text` when it does not.
#[track_caller]
pub fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
}

/// The items of a JSON array (the test fails if `list` is none).
pub fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
}

/// The example rule from the issue that must be accepted as is.
pub fn example_rule() -> Value {
    serde_json::json!({"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},
        "limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],"mode":"enforce"})
}

/// A small valid rule named `name`.
pub fn rule(name: &str) -> Value {
    serde_json::json!({"name": name, "key": "global", "limits": [{"requests": 10, "period": "second"}]})
}

/// Bounds every wait of a test that runs a server, so a broken server fails the test instead
/// of hanging it.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The host the dashboard is reached at in [`Req::same_origin`].
pub const DASHBOARD_HOST: &str = "sluice.test:8080";

/// A real `sluice serve` (in this process) on 127.0.0.1 over a test database, with an admin
/// token and an HTTP client.
#[derive(Debug)]
pub struct TestServer {
    pub server: Server,
    pub base: String,
    pub admin: String,
    pub http: reqwest::Client,
}

impl TestServer {
    pub async fn start(db: &TestDb) -> TestServer {
        TestServer::start_with(db, ServeOptions::default()).await
    }

    /// A server with `options` (its connection limits, TLS, a separate metrics listener,
    /// which binds 127.0.0.1 too). `base` is `https://` with TLS, which `http` does not
    /// trust: TLS tests bring their own client.
    pub async fn start_with(db: &TestDb, options: ServeOptions) -> TestServer {
        let state = AppState::new(db.store.clone()).await.unwrap();
        TestServer::over(db, state, options).await
    }

    /// A server over `state`, which the test keeps (to change its bounds while it runs).
    pub async fn over(db: &TestDb, state: AppState, options: ServeOptions) -> TestServer {
        let server = server::start_with(state, "127.0.0.1:0".parse().unwrap(), options)
            .await
            .unwrap();
        let base = server.listening().url();
        TestServer {
            server,
            base,
            admin: db.token(Role::Admin).await,
            http: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .unwrap(),
        }
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.admin)
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.admin)
    }

    /// GETs `path` as the admin, and its JSON (whatever the status).
    pub async fn json(&self, path: &str) -> Value {
        self.get(path).send().await.unwrap().json().await.unwrap()
    }

    pub async fn create(&self, rule: &Value) -> u64 {
        let response = self.post("/api/v1/rules").json(rule).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        response.json::<Value>().await.unwrap()["revision"]
            .as_u64()
            .unwrap()
    }

    /// The server's own metrics: from its separate `/metrics` listener if it has one.
    pub async fn metrics(&self) -> String {
        let base = match self.server.metrics_addr() {
            Some(addr) => format!("http://{addr}"),
            None => self.base.clone(),
        };
        let response = self
            .http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    /// How many long-polls the server is holding, from its own metrics.
    pub async fn held_polls(&self) -> u64 {
        held_polls(&self.http, &self.base).await
    }

    pub async fn wait_for_held_polls(&self, n: u64) {
        let deadline = Instant::now() + PATIENCE;
        while self.held_polls().await < n {
            assert!(Instant::now() < deadline, "the polls were never held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The server at `base`'s own metrics, as Prometheus text.
pub async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// How many long-polls the server at `base` is holding, from its own metrics.
pub async fn held_polls(http: &reqwest::Client, base: &str) -> u64 {
    metrics_text(http, base)
        .await
        .lines()
        .find_map(|l| l.strip_prefix("sluice_admin_long_polls "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
