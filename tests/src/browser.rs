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

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use sluice_core::listening::{Listening, Scheme};

use crate::artifacts::{Artifacts, workspace_root};
use crate::tls::TestPki;

/// Set by `cargo xtask test` (it installs Debian's `chromium` if missing).
pub const CHROMIUM_ENV: &str = "SLUICE_CHROMIUM";
/// Set by `cargo xtask test` (Debian's `chromium-driver`).
pub const CHROMEDRIVER_ENV: &str = "SLUICE_CHROMEDRIVER";

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
    process: Child,
    listening: Listening,
    /// Over TLS: a client configuration trusting the server's CA.
    tls: Option<Arc<rustls::ClientConfig>>,
    database: String,
    admin_token: String,
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
        let admin_token = format!("slc_test_admin_{:016x}", rand_u64());
        let mut command = Command::new(&sluice);
        command.args(["serve", "--listen", "127.0.0.1:0", "--database", &database]);
        if let Some(pki) = pki {
            command
                .arg("--tls-cert")
                .arg(pki.server_cert())
                .arg("--tls-key")
                .arg(pki.server_key());
        }
        let mut process = command
            .env("SLUICE_ADMIN_TOKEN", &admin_token)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", sluice.display()))?;
        let stdout = process.stdout.take().context("the server's stdout")?;
        // The one stdout line: `listening on http(s)://IP:PORT`.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => line,
            Err(_) => {
                let _ = process.kill();
                bail!("sluice serve printed no address within 30 s");
            }
        };
        let listening = Listening::parse(&line)
            .filter(|l| {
                l.scheme
                    == if pki.is_some() {
                        Scheme::Https
                    } else {
                        Scheme::Http
                    }
            })
            .with_context(|| format!("unexpected first line from sluice serve: {line:?}"))?;
        Ok(AdminServer {
            process,
            listening,
            tls: pki.map(TestPki::client_config),
            database,
            admin_token,
            _dir: dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.listening.addr
    }

    /// `http(s)://IP:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.listening.url())
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// `sluice token create --role ROLE --name NAME` on this server's database; the secret.
    pub fn create_token(&self, role: &str, name: &str) -> Result<String> {
        let sluice = Artifacts::from_env().sluice_bin();
        let out = Command::new(sluice)
            .args([
                "token",
                "create",
                "--role",
                role,
                "--name",
                name,
                "--database",
                &self.database,
            ])
            .stderr(Stdio::null())
            .output()
            .context("running sluice token create")?;
        if !out.status.success() {
            bail!("sluice token create failed ({})", out.status);
        }
        let secret = String::from_utf8(out.stdout)?.trim().to_string();
        if !secret.starts_with("slc_") {
            bail!("sluice token create printed {secret:?}");
        }
        Ok(secret)
    }

    pub fn database_path(&self) -> &Path {
        self._dir.path()
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

impl AdminServer {
    /// A request to the API with the admin token: `(status, body)`.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, String)> {
        self.call_as(&self.admin_token, method, path, body)
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
        use std::io::{Read, Write};
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
        let mut stream = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr(),
            token,
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("no status")?;
        Ok((status, body.to_string()))
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
