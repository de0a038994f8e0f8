//! `cargo xtask demo`: Envoy with the Sluice filter in front of a small echo server, running
//! until Ctrl-C.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cmd::{self, note, step};
use crate::dist::Dist;
use crate::{dist, envoy, upstream};

/// How long Envoy may take to load the config and start the wasm VMs.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long Envoy may take to drain and exit after `/quitquitquit`.
const STOP_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where Envoy listens for the demo traffic (loopback only).
    #[arg(long, default_value = "127.0.0.1:10000")]
    listen: SocketAddr,

    /// Port of the echo upstream on 127.0.0.1.
    #[arg(long, default_value_t = 8081)]
    upstream_port: u16,

    /// Envoy's admin interface (loopback only).
    #[arg(long, default_value = "127.0.0.1:9901")]
    envoy_admin: SocketAddr,
}

pub fn demo(args: &DemoArgs) -> Result<()> {
    let upstream_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.upstream_port));
    // Fail on busy ports before a long build, and keep the upstream's port once we have it.
    let upstream_listener = check_ports(args, upstream_addr)?;

    let dist = dist::build().context("step `build` failed")?;
    let envoy = envoy::ensure_envoy().context("step `provision Envoy` failed")?;
    let config = write_envoy_config(args, upstream_addr, &dist)?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(run(args, upstream_listener, &envoy, &config))
}

fn check_ports(args: &DemoArgs, upstream_addr: SocketAddr) -> Result<TcpListener> {
    step("checking the demo's ports");
    let endpoints = [
        ("--listen", args.listen),
        ("--envoy-admin", args.envoy_admin),
        ("--upstream-port", upstream_addr),
    ];
    for (flag, addr) in endpoints {
        if !addr.ip().is_loopback() {
            bail!("{flag} {addr}: the demo binds only to loopback addresses (127.0.0.0/8, ::1)");
        }
    }
    for (i, (flag, addr)) in endpoints.iter().enumerate() {
        if let Some((other, _)) = endpoints[i + 1..]
            .iter()
            .find(|(_, a)| a.port() == addr.port())
        {
            bail!("{flag} and {other} both use port {}", addr.port());
        }
    }
    let bind = |flag: &str, addr: SocketAddr| {
        TcpListener::bind(addr).with_context(|| {
            format!(
                "{addr} ({flag}) is not free: stop what holds it (`ss -ltnp 'sport = :{}'`) \
                 or choose another with {flag}",
                addr.port()
            )
        })
    };
    // Envoy binds these itself; a probe bind now turns its obscure failure into a clear one.
    drop(bind("--listen", args.listen)?);
    drop(bind("--envoy-admin", args.envoy_admin)?);
    let upstream = bind("--upstream-port", upstream_addr)?;
    note(format!(
        "free: {} (Envoy), {} (Envoy admin), {upstream_addr} (upstream)",
        args.listen, args.envoy_admin
    ));
    Ok(upstream)
}

fn write_envoy_config(args: &DemoArgs, upstream_addr: SocketAddr, dist: &Dist) -> Result<PathBuf> {
    let root = cmd::project_root();
    let rules = root.join("examples").join("rules.yaml");
    let demo_dir = root.join("target").join("demo");
    let config = demo_dir.join("envoy.yaml");
    step(format!("writing the Envoy config {}", config.display()));
    if !rules.is_file() {
        bail!(
            "{} is missing: the demo's rate-limit rules",
            rules.display()
        );
    }
    let yaml = cmd::output(
        Command::new(&dist.sluice_bin)
            .current_dir(&root)
            .arg("envoy-config")
            .arg("--listen")
            .arg(args.listen.to_string())
            .arg("--upstream")
            .arg(upstream_addr.to_string())
            .arg("--filter")
            .arg(&dist.filter_wasm)
            .arg("--rules")
            .arg(&rules)
            .args(["--concurrency", "2"])
            .arg("--envoy-admin")
            .arg(args.envoy_admin.to_string()),
    )
    .context("step `sluice envoy-config` failed")?;
    std::fs::create_dir_all(&demo_dir)
        .with_context(|| format!("creating {}", demo_dir.display()))?;
    std::fs::write(&config, yaml).with_context(|| format!("writing {}", config.display()))?;
    Ok(config)
}

async fn run(
    args: &DemoArgs,
    upstream_listener: TcpListener,
    envoy: &Path,
    config: &Path,
) -> Result<()> {
    step(format!(
        "starting the echo upstream on {}",
        upstream_listener.local_addr().context("upstream address")?
    ));
    upstream_listener
        .set_nonblocking(true)
        .context("making the upstream listener non-blocking")?;
    let listener = tokio::net::TcpListener::from_std(upstream_listener)
        .context("handing the upstream listener to tokio")?;
    let mut upstream = tokio::spawn(upstream::serve(listener));

    let mut signals = StopSignals::new()?;
    step("starting Envoy");
    let mut command = Command::new(envoy);
    command
        .arg("-c")
        .arg(config)
        .args(["--log-level", "warn"])
        // Hot restart would claim base id 0; a second Envoy (e.g. the integration tests')
        // could not start while the demo runs.
        .arg("--disable-hot-restart")
        .stdin(Stdio::null());
    note(format!("$ {}", cmd::display(&command)));
    let mut envoy_process = tokio::process::Command::from(command)
        // Never leave an Envoy behind holding the ports, whatever path leaves this function.
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", envoy.display()))?;

    tokio::select! {
        ready = wait_ready(args.envoy_admin) => ready?,
        status = envoy_process.wait() => bail!("Envoy exited during start-up ({})", describe(status)),
        signal = signals.recv() => {
            note(format!("{signal} during start-up"));
            return stop_envoy(args.envoy_admin, &mut envoy_process).await;
        }
    }
    print_examples(args);

    tokio::select! {
        signal = signals.recv() => note(format!("{signal}: shutting down")),
        status = envoy_process.wait() => bail!("Envoy exited unexpectedly ({})", describe(status)),
        result = &mut upstream => bail!("the echo upstream stopped: {:?}", result),
    }
    let stopped = stop_envoy(args.envoy_admin, &mut envoy_process).await;
    upstream.abort();
    stopped
}

/// Ctrl-C and SIGTERM, caught from before Envoy starts so that neither leaves it running.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    fn new() -> Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt()).context("listening for Ctrl-C")?,
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "Ctrl-C",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

async fn stop_envoy(admin: SocketAddr, envoy: &mut tokio::process::Child) -> Result<()> {
    step("stopping Envoy");
    // Ctrl-C in a terminal also reaches Envoy (same process group), which then exits by itself;
    // otherwise ask it through the admin interface, and kill it only as a last resort.
    let _ = admin_request(admin, "POST", "/quitquitquit").await;
    match tokio::time::timeout(STOP_LIMIT, envoy.wait()).await {
        Ok(status) => note(format!("Envoy stopped ({})", describe(status))),
        Err(_elapsed) => {
            note(format!(
                "Envoy still running after {} s: killing it",
                STOP_LIMIT.as_secs()
            ));
            envoy.kill().await.context("killing Envoy")?;
        }
    }
    Ok(())
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(err) => format!("status unknown: {err}"),
    }
}

/// Waits until Envoy's admin `/ready` answers 200 (listeners up, wasm VMs loaded).
async fn wait_ready(admin: SocketAddr) -> Result<()> {
    let deadline = tokio::time::Instant::now() + READY_LIMIT;
    loop {
        if let Ok(response) = admin_request(admin, "GET", "/ready").await {
            if response.starts_with("HTTP/1.1 200") {
                note("Envoy is ready");
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "Envoy was not ready within {} s (see its log above)",
                READY_LIMIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A minimal HTTP/1.1 exchange with Envoy's admin interface (loopback, tiny responses; Envoy
/// answers HTTP/1.0 with 426, so `Connection: close` marks the end instead).
async fn admin_request(admin: SocketAddr, method: &str, path: &str) -> Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(admin).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\
             Content-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("{method} {path}: Envoy admin did not answer"))?
        .with_context(|| format!("{method} {path} on {admin}"))
}

fn print_examples(args: &DemoArgs) {
    let listen = args.listen;
    let admin = args.envoy_admin;
    println!();
    println!("Sluice demo is running. Try, from another terminal:");
    println!();
    println!("  # one request through Envoy and the filter");
    println!("  curl -si -H 'x-api-key: alice' http://{listen}/api/hello");
    println!();
    println!("  # a burst: watch 200s turn into 429s once alice's bucket is empty");
    println!(
        "  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' \
         -H 'x-api-key: alice' http://{listen}/api/hello; done"
    );
    println!();
    println!("  # the filter's counters in Envoy");
    println!("  curl -s http://{admin}/stats | grep wasmcustom");
    println!();
    println!("Press Ctrl-C to stop.");
}
