//! Driving the dashboard in a real browser: headless Chromium through chromedriver
//! (WebDriver over plain HTTP on loopback, with fantoccini), and a real `sluice serve`
//! to point it at.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use sluice_tests::browser::{AdminServer, Browser};
//! let admin = AdminServer::start()?;
//! let browser = Browser::start().await?;
//! browser.client().goto(&admin.url("/")).await?;
//! browser.screenshot("signin").await?;
//! # Ok(()) }
//! ```

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use sluice_core::listening::Scheme;
use sluice_harness::http::http_request;
use sluice_harness::serve::{self, ADMIN_TOKEN, AdminApi, Serve};

use crate::artifacts::{Artifacts, workspace_root};
use crate::tls::TestPki;

pub use sluice_harness::{CHROMEDRIVER_ENV, CHROMIUM_ENV};

/// The flags that make Chromium run headless and quiet in a container.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
];

fn tool(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Whether Chromium and chromedriver are installed (`cargo xtask test` makes sure).
pub fn browser_available() -> bool {
    tool(CHROMIUM_ENV, "/usr/bin/chromium").is_file()
        && tool(CHROMEDRIVER_ENV, "/usr/bin/chromedriver").is_file()
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn wait_for_port(addr: SocketAddr, timeout: Duration, child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited during start-up ({status})");
        }
        if Instant::now() >= deadline {
            bail!(
                "{what} did not listen on {addr} within {} s",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Headless Chromium under chromedriver; both stop when this is dropped.
#[derive(Debug)]
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A browser with a fresh profile and a 1440×1000 window.
    pub async fn start() -> Result<Browser> {
        Browser::start_with_args(Vec::new()).await
    }

    /// [`Browser::start`] trusting the server certificate of `pki` (and no other it would
    /// otherwise refuse). Chromium has no flag for an extra CA; it takes the SHA-256 of a
    /// certificate's public key in `--ignore-certificate-errors-spki-list`, honoured with
    /// a `--user-data-dir`, which every browser here has.
    pub async fn start_trusting(pki: &TestPki) -> Result<Browser> {
        Browser::start_with_args(vec![format!(
            "--ignore-certificate-errors-spki-list={}",
            pki.server_spki_sha256()
        )])
        .await
    }

    async fn start_with_args(extra: Vec<String>) -> Result<Browser> {
        let chromium = tool(CHROMIUM_ENV, "/usr/bin/chromium");
        let chromedriver = tool(CHROMEDRIVER_ENV, "/usr/bin/chromedriver");
        let port = free_port()?;
        let mut driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", chromedriver.display()))?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if let Err(e) = wait_for_port(addr, Duration::from_secs(20), &mut driver, "chromedriver") {
            let _ = driver.kill();
            return Err(e);
        }
        let profile = tempfile::Builder::new()
            .prefix("sluice-chromium-")
            .tempdir()
            .context("creating a browser profile folder")?;
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push("--window-size=1440,1000".to_string());
        args.extend(extra);
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            bail!("capabilities are a JSON object");
        };
        let connected = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://{addr}"))
            .await;
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                let _ = driver.kill();
                let _ = driver.wait();
                bail!("chromedriver could not start {}: {e}", chromium.display());
            }
        };
        Ok(Browser {
            client: Some(client),
            driver,
            _profile: profile,
        })
    }

    pub fn client(&self) -> &Client {
        self.client
            .as_ref()
            .expect("the browser is open until closed")
    }

    /// Saves a PNG of the window as `target/screenshots/{name}.png`.
    pub async fn screenshot(&self, name: &str) -> Result<PathBuf> {
        let png = self
            .client()
            .screenshot()
            .await
            .context("taking a screenshot")?;
        let dir = screenshots_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Ends the WebDriver session (Chromium exits), then chromedriver.
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `target/screenshots/`.
pub fn screenshots_dir() -> PathBuf {
    workspace_root().join("target").join("screenshots")
}

/// `sluice serve` on 127.0.0.1 with a SQLite file in a temporary folder and a known admin
/// token; killed when dropped.
#[derive(Debug)]
pub struct AdminServer {
    /// Before `_dir`: the server stops before its database's folder goes.
    api: AdminApi,
    /// Over TLS: a client configuration trusting the server's CA.
    tls: Option<Arc<rustls::ClientConfig>>,
    database: String,
    _dir: tempfile::TempDir,
}

impl AdminServer {
    pub fn start() -> Result<AdminServer> {
        AdminServer::start_with(None)
    }

    /// [`AdminServer::start`] over TLS with `pki`'s server certificate.
    pub fn start_tls(pki: &TestPki) -> Result<AdminServer> {
        AdminServer::start_with(Some(pki))
    }

    fn start_with(pki: Option<&TestPki>) -> Result<AdminServer> {
        let sluice = Artifacts::from_env().sluice_bin().to_path_buf();
        let dir = tempfile::Builder::new()
            .prefix("sluice-admin-")
            .tempdir()
            .context("creating a folder for the database")?;
        let database = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let mut serve = Serve::new(sluice, database.clone());
        serve.show_log = true;
        if let Some(pki) = pki {
            serve.flags = vec![
                "--tls-cert".into(),
                pki.server_cert().display().to_string(),
                "--tls-key".into(),
                pki.server_key().display().to_string(),
            ];
        }
        let api = AdminApi::start(&serve)?;
        let expected = if pki.is_some() {
            Scheme::Https
        } else {
            Scheme::Http
        };
        if api.listening().scheme != expected {
            bail!("`sluice serve` said {}", api.listening());
        }
        Ok(AdminServer {
            api,
            tls: pki.map(TestPki::client_config),
            database,
            _dir: dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.api.addr()
    }

    /// `http(s)://IP:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api.url())
    }

    pub fn admin_token(&self) -> &str {
        ADMIN_TOKEN
    }

    /// `sluice token create --role ROLE --name NAME` on this server's database; the secret.
    pub fn create_token(&self, role: &str, name: &str) -> Result<String> {
        serve::create_token(
            Artifacts::from_env().sluice_bin(),
            &self.database,
            role,
            name,
        )
    }

    pub fn database_path(&self) -> &Path {
        self._dir.path()
    }
}

impl AdminServer {
    /// A request to the API with the admin token: `(status, body)`.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, String)> {
        self.call_as(ADMIN_TOKEN, method, path, body)
    }

    /// A request to the API with `token`: `(status, body)`. Plain blocking HTTP on loopback,
    /// for test set-up and checks (over TLS: the harness's client, trusting the test CA).
    pub fn call_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, String)> {
        if let Some(tls) = &self.tls {
            let method = method.parse().context("an HTTP method")?;
            let mut request = crate::Req::new(method, path)
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json");
            if let Some(body) = body {
                request.body = body.to_string().into();
            }
            // The harness's client blocks; the browser tests call from a multi-threaded
            // runtime, whose worker this frees meanwhile.
            let resp = tokio::task::block_in_place(|| {
                crate::Client::connect_tls(self.addr(), 1, Arc::clone(tls)).send(request)
            });
            return Ok((resp.status, resp.body));
        }
        let bearer = format!("Bearer {token}");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        http_request(
            self.addr(),
            method,
            path,
            &[
                ("Authorization", bearer.as_str()),
                ("Content-Type", "application/json"),
            ],
            &body,
        )
    }

    /// GET with the admin token, as JSON; fails unless 200.
    pub fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let (status, body) = self.call("GET", path, None)?;
        if status != 200 {
            bail!("GET {path}: {status} {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("GET {path}: {body}"))
    }
}
