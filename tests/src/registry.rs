//! A throwaway container registry (Debian's `docker-registry`, the CNCF Distribution
//! registry) and skopeo, for checking image layouts with tools that share no code with the
//! writer.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_harness::http::http_request;
use sluice_harness::{DOCKER_REGISTRY_ENV, SKOPEO_ENV};

/// How long a fresh registry may take to answer `GET /v2/`.
const START_LIMIT: Duration = Duration::from_secs(20);

/// `docker-registry` on a free 127.0.0.1 port, storing in a private temporary folder, with no
/// authentication and plain HTTP. Killed when dropped, whether the test passed or not.
#[derive(Debug)]
pub struct Registry {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry; panics with its log when it does not answer within 20 s.
    pub fn start() -> Registry {
        let binary = tool(DOCKER_REGISTRY_ENV, "docker-registry");
        let dir = tempfile::Builder::new()
            .prefix("sluice-registry-")
            .tempdir()
            .expect("a folder for the registry");
        // Free when we look; the registry binds it a moment later, and a clash fails the
        // start-up loudly rather than silently.
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\n",
                dir.path().join("storage").display()
            ),
        )
        .expect("writing the registry's configuration");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("registry log");
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("registry log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", binary.display()));
        let mut registry = Registry { child, addr, dir };
        let answered =
            sluice_harness::wait_until("the registry to answer GET /v2/", START_LIMIT, || {
                if let Ok(Some(status)) = registry.child.try_wait() {
                    anyhow::bail!("the registry exited at start-up ({status})");
                }
                Ok(http_request(addr, "GET", "/v2/", &[], "")
                    .is_ok_and(|(status, _)| status == 200))
            });
        if let Err(err) = answered {
            panic!("{err:#}\nits log:\n{}", registry.log());
        }
        registry
    }

    /// `127.0.0.1:PORT`, as image names start.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the registry has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// skopeo, run with no signature policy of the machine's (`--insecure-policy`: the images are
/// unsigned local builds) and plain HTTP to the test registry.
#[derive(Debug, Clone)]
pub struct Skopeo {
    binary: PathBuf,
}

impl Skopeo {
    pub fn from_env() -> Skopeo {
        Skopeo {
            binary: tool(SKOPEO_ENV, "skopeo"),
        }
    }

    /// `skopeo copy FROM TO`, where either may be the plain-HTTP test registry.
    pub fn copy(&self, from: &str, to: &str) {
        self.run(&[
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            from,
            to,
        ]);
    }

    /// `skopeo inspect --raw NAME`: the manifest's bytes as the source serves them.
    pub fn raw_manifest(&self, name: &str) -> Vec<u8> {
        self.run(&["inspect", "--raw", "--tls-verify=false", name])
    }

    /// `skopeo inspect --config --raw NAME`: the image configuration's bytes.
    pub fn raw_config(&self, name: &str) -> Vec<u8> {
        self.run(&["inspect", "--config", "--raw", "--tls-verify=false", name])
    }

    /// `skopeo inspect NAME`: skopeo's own reading of an image, as JSON.
    pub fn inspect(&self, name: &str) -> serde_json::Value {
        let out = self.run(&["inspect", "--tls-verify=false", name]);
        serde_json::from_slice(&out).expect("skopeo inspect prints JSON")
    }

    fn run(&self, args: &[&str]) -> Vec<u8> {
        let mut command = Command::new(&self.binary);
        command.arg("--insecure-policy").args(args);
        let out = command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("starting {}: {err}", self.binary.display()));
        assert!(
            out.status.success(),
            "`{} --insecure-policy {}` failed ({}):\n{}",
            self.binary.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

/// A tool from its environment variable (set by `cargo xtask test`) or PATH.
fn tool(env: &str, name: &str) -> PathBuf {
    std::env::var_os(env)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .or_else(|| sluice_harness::cmd::which(name))
        .filter(|path| Path::new(path).is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found: run the image test with `cargo xtask test` (it installs \
                 Debian's skopeo and docker-registry), or set {env}"
            )
        })
}
