//! `cargo xtask demo`: the whole product on one machine, until Ctrl-C.
//!
//! The admin API with the dashboard (a fresh SQLite file under `target/demo/`), the rules of
//! `examples/rules.yaml` applied through its API, an Envoy with the filter that follows it
//! (a proxy token made with the CLI), an echo upstream behind Envoy, and a bounded demo load
//! generator so the dashboard shows live traffic. Everything binds loopback addresses.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use sluice_harness::cmd::{self, note, step};
use sluice_harness::envoy::{EnvoyLaunch, EnvoyProcess};
use sluice_harness::serve;
use sluice_harness::upstream::EchoUpstream;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::dist::Dist;
use crate::{demo_load, dist, envoy};

/// How long Envoy may take to load the config and start the wasm VMs.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long Envoy may take to drain and exit after `/quitquitquit`, before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How long the admin API may take to migrate its database and listen.
const ADMIN_START_LIMIT: Duration = Duration::from_secs(30);
/// The names the demo's two Envoys poll under, as the dashboard lists them.
const PROXY_IDS: [&str; 2] = ["demo-envoy-1", "demo-envoy-2"];

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

    /// Where the second Envoy listens: both share the fleet-wide rule's limit.
    #[arg(long, default_value = "127.0.0.1:10001")]
    second_listen: SocketAddr,

    /// The second Envoy's admin interface (loopback only).
    #[arg(long, default_value = "127.0.0.1:9902")]
    second_envoy_admin: SocketAddr,

    /// The admin API and the dashboard (loopback only).
    #[arg(long, default_value = "127.0.0.1:8080")]
    admin_listen: SocketAddr,

    /// How long the demo load generator runs, in minutes (0: no generated traffic).
    #[arg(long, default_value_t = 30)]
    load_minutes: u64,
}

/// What the running demo is made of.
struct Setup {
    sluice: PathBuf,
    envoy: PathBuf,
    filter: PathBuf,
    database: String,
    admin_token: String,
}

pub fn demo(args: &DemoArgs) -> Result<()> {
    let upstream_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.upstream_port));
    // Fail on busy ports before a long build, and keep the upstream's port once we have it.
    let upstream_listener = check_ports(args, upstream_addr)?;

    let Dist {
        filter_wasm,
        sluice_bin,
    } = dist::build(dist::Profile::Release).context("step `build` failed")?;
    let envoy = envoy::ensure_envoy().context("step `provision Envoy` failed")?;

    let demo_dir = cmd::project_root().join("target").join("demo");
    step(format!("preparing {}", demo_dir.display()));
    std::fs::create_dir_all(&demo_dir)
        .with_context(|| format!("creating {}", demo_dir.display()))?;
    let db_file = demo_dir.join("sluice.db");
    // A fresh database each run: version 1 is the example rules, as in the README.
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db_file.clone().into_os_string();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
    let setup = Setup {
        sluice: sluice_bin,
        envoy,
        filter: filter_wasm,
        database: format!("sqlite://{}", db_file.display()),
        admin_token: random_token(),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(run(args, upstream_listener, &setup, &demo_dir))
}

/// A token only this run knows: 128 bits from the standard library's randomly keyed
/// hasher (seeded by the operating system).
fn random_token() -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(std::process::id());
    let b = RandomState::new().hash_one(std::time::SystemTime::now());
    format!("slc_demo_{a:016x}{b:016x}")
}

fn check_ports(args: &DemoArgs, upstream_addr: SocketAddr) -> Result<TcpListener> {
    step("checking the demo's ports");
    let endpoints = [
        ("--listen", args.listen),
        ("--envoy-admin", args.envoy_admin),
        ("--second-listen", args.second_listen),
        ("--second-envoy-admin", args.second_envoy_admin),
        ("--admin-listen", args.admin_listen),
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
    // Envoy and the admin API bind these themselves; a probe bind now turns their obscure
    // failures into a clear one.
    for (flag, addr) in &endpoints[..endpoints.len() - 1] {
        drop(bind(flag, *addr)?);
    }
    let upstream = bind("--upstream-port", upstream_addr)?;
    note(format!(
        "free: {} and {} (Envoys), {} and {} (their admin), {} (admin API and dashboard), \
         {upstream_addr} (upstream)",
        args.listen,
        args.second_listen,
        args.envoy_admin,
        args.second_envoy_admin,
        args.admin_listen
    ));
    Ok(upstream)
}

/// One of the demo's Envoys.
#[derive(Debug, Clone, Copy)]
struct Edge {
    listen: SocketAddr,
    admin: SocketAddr,
    proxy_id: &'static str,
}

fn edges(args: &DemoArgs) -> [Edge; 2] {
    [
        Edge {
            listen: args.listen,
            admin: args.envoy_admin,
            proxy_id: PROXY_IDS[0],
        },
        Edge {
            listen: args.second_listen,
            admin: args.second_envoy_admin,
            proxy_id: PROXY_IDS[1],
        },
    ]
}

fn write_envoy_config(
    args: &DemoArgs,
    edge: &Edge,
    upstream_addr: SocketAddr,
    setup: &Setup,
    proxy_token: &str,
    demo_dir: &Path,
) -> Result<PathBuf> {
    let config = demo_dir.join(format!("{}.yaml", edge.proxy_id));
    step(format!("writing the Envoy config {}", config.display()));
    // No static rules: Envoy takes them from the admin API, pushed within a second of a change.
    let yaml = cmd::output(
        Command::new(&setup.sluice)
            .current_dir(cmd::project_root())
            .arg("envoy-config")
            .arg("--listen")
            .arg(edge.listen.to_string())
            .arg("--upstream")
            .arg(upstream_addr.to_string())
            .arg("--filter")
            .arg(&setup.filter)
            .args(["--concurrency", "2"])
            .arg("--envoy-admin")
            .arg(edge.admin.to_string())
            .arg("--admin-url")
            .arg(format!("http://{}", args.admin_listen))
            .args(["--proxy-token", proxy_token, "--proxy-id", edge.proxy_id]),
    )
    .context("step `sluice envoy-config` failed")?;
    std::fs::write(&config, yaml).with_context(|| format!("writing {}", config.display()))?;
    Ok(config)
}

async fn start_admin(
    args: &DemoArgs,
    setup: &Setup,
    demo_dir: &Path,
) -> Result<tokio::process::Child> {
    step(format!(
        "starting the admin API and dashboard on {}",
        args.admin_listen
    ));
    let log = demo_dir.join("sluice.log");
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut command = Command::new(&setup.sluice);
    command
        .args([
            "serve",
            "--listen",
            &args.admin_listen.to_string(),
            "--database",
            &setup.database,
        ])
        .env("SLUICE_ADMIN_TOKEN", &setup.admin_token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file);
    note(format!(
        "$ SLUICE_ADMIN_TOKEN=... {} serve --listen {} --database {}   (log: {})",
        setup.sluice.display(),
        args.admin_listen,
        setup.database,
        log.display()
    ));
    let mut child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", setup.sluice.display()))?;
    let stdout = child.stdout.take().context("the admin API's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(ADMIN_START_LIMIT, lines.next_line()).await;
    match first {
        Ok(Ok(Some(line))) if sluice_core::listening::Listening::parse(&line).is_some() => {
            note(line)
        }
        Ok(Ok(other)) => bail!(
            "the admin API did not start (it said {other:?}); see {}",
            log.display()
        ),
        Ok(Err(e)) => bail!("reading the admin API's output: {e}"),
        Err(_) => bail!(
            "the admin API did not listen within {} s; see {}",
            ADMIN_START_LIMIT.as_secs(),
            log.display()
        ),
    }
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

async fn run(
    args: &DemoArgs,
    upstream_listener: TcpListener,
    setup: &Setup,
    demo_dir: &Path,
) -> Result<()> {
    let upstream_addr = upstream_listener.local_addr().context("upstream address")?;
    step(format!("starting the echo upstream on {upstream_addr}"));
    // Stops when dropped, whatever path leaves this function.
    let _upstream = EchoUpstream::serve_on(upstream_listener)?;

    let mut signals = StopSignals::new()?;
    let mut admin = start_admin(args, setup, demo_dir).await?;

    step("creating tokens with the CLI (a proxy token per Envoy, a viewer token to try)");
    let edges = edges(args);
    let proxy_tokens = edges
        .iter()
        .map(|edge| serve::create_token(&setup.sluice, &setup.database, "proxy", edge.proxy_id))
        .collect::<Result<Vec<_>>>()?;
    let viewer_token =
        serve::create_token(&setup.sluice, &setup.database, "viewer", "demo-viewer")?;

    step("applying examples/rules.yaml through the API (sluice rules apply)");
    let rules = cmd::project_root().join("examples").join("rules.yaml");
    cmd::run(
        Command::new(&setup.sluice)
            .args(["rules", "apply", "-f"])
            .arg(&rules)
            .env("SLUICE_URL", format!("http://{}", args.admin_listen))
            .env("SLUICE_TOKEN", &setup.admin_token),
    )
    .context("step `sluice rules apply` failed")?;

    let mut configs = Vec::new();
    for (edge, token) in edges.iter().zip(&proxy_tokens) {
        configs.push(write_envoy_config(
            args,
            edge,
            upstream_addr,
            setup,
            token,
            demo_dir,
        )?);
    }
    // Envoy starts in a blocking wait (until its admin interface says LIVE), so Ctrl-C is
    // watched meanwhile; an Envoy started after it is killed when the task drops it.
    let starting = {
        let (envoy, demo_dir) = (setup.envoy.clone(), demo_dir.to_path_buf());
        tokio::task::spawn_blocking(move || {
            edges
                .iter()
                .zip(&configs)
                .map(|(edge, config)| start_envoy(&envoy, edge, config, &demo_dir))
                .collect::<Result<Vec<_>>>()
        })
    };
    let mut envoys = tokio::select! {
        started = starting => started.context("starting the Envoys")??,
        signal = signals.recv() => {
            note(format!("{signal} during start-up"));
            return Ok(());
        }
    };

    let load_for = Duration::from_secs(args.load_minutes * 60);
    let mut load = tokio::spawn(demo_load::run(args.listen, load_for));
    let mut load_running = args.load_minutes > 0;
    if load_running {
        step(format!(
            "demo traffic: 6 clients through Envoy for {} min (alice, bob, carol, dave, erin and keyless static requests)",
            args.load_minutes
        ));
    }
    print_info(args, setup, &viewer_token);

    // Envoy is a child process, not a future: look at it a few times a second.
    let mut envoy_check = tokio::time::interval(Duration::from_millis(250));
    let outcome = loop {
        tokio::select! {
            signal = signals.recv() => {
                note(format!("{signal}: shutting down"));
                break Ok(());
            }
            // Ctrl-C in a terminal reaches the Envoys and the admin API too (one process
            // group): a clean exit is that, a failed one is a crash.
            _ = envoy_check.tick() => {
                let exited = edges.iter().zip(&envoys).find_map(|(edge, envoy)| {
                    envoy.exit_status().map(|status| (edge, status))
                });
                if let Some((edge, status)) = exited {
                    break envoy_exited(edge, status);
                }
            }
            status = admin.wait() => break match status {
                Ok(s) if s.success() => Ok(()),
                other => Err(anyhow::anyhow!(
                    "the admin API exited unexpectedly ({}); see {}",
                    describe(other),
                    demo_dir.join("sluice.log").display()
                )),
            },
            counts = &mut load, if load_running => {
                load_running = false;
                if let Ok(counts) = counts {
                    let (allowed, throttled) = (counts.admitted(), counts.get(429));
                    note(format!(
                        "demo traffic finished: {allowed} allowed, {throttled} throttled, {} other, {} without an answer; the demo keeps running until Ctrl-C",
                        counts.responses() - allowed - throttled,
                        counts.errors
                    ));
                }
            }
        }
    };
    load.abort();
    let stopped = tokio::task::spawn_blocking(move || stop_envoys(&mut envoys))
        .await
        .context("stopping the Envoys")?;
    step("stopping the admin API");
    let _ = admin.start_kill();
    let _ = admin.wait().await;
    outcome.and(stopped)
}

/// Starts one of the demo's Envoys and waits until it is ready.
fn start_envoy(envoy: &Path, edge: &Edge, config: &Path, demo_dir: &Path) -> Result<EnvoyProcess> {
    step(format!(
        "starting Envoy {} on {}",
        edge.proxy_id, edge.listen
    ));
    let process = EnvoyProcess::start(&EnvoyLaunch {
        envoy,
        config,
        // The generated config's own worker count.
        concurrency: None,
        log_level: "warn",
        cpus: None,
        dir: demo_dir,
        name: edge.proxy_id,
        ready_timeout: READY_LIMIT,
        listener: None,
    })?;
    note(format!("$ {}", process.command()));
    note(format!(
        "Envoy {} is ready (log: {})",
        edge.proxy_id,
        process.log_path().display()
    ));
    Ok(process)
}

fn envoy_exited(edge: &Edge, status: ExitStatus) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("Envoy {} exited unexpectedly ({status})", edge.proxy_id)
    }
}

/// Stops every Envoy, each through its admin interface (Ctrl-C in a terminal also reaches
/// them, and they then exit by themselves), killing one only as a last resort.
fn stop_envoys(envoys: &mut [EnvoyProcess]) -> Result<()> {
    let mut outcome = Ok(());
    for envoy in envoys {
        step("stopping Envoy");
        match envoy.stop(STOP_LIMIT) {
            Ok(status) => note(format!("Envoy stopped ({status})")),
            Err(err) => outcome = Err(err),
        }
    }
    outcome
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(err) => format!("status unknown: {err}"),
    }
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

fn print_info(args: &DemoArgs, setup: &Setup, viewer_token: &str) {
    let admin = args.admin_listen;
    println!();
    println!("Sluice demo is running.");
    println!();
    println!("  Dashboard:    http://{admin}/");
    println!("  Admin token:  {}", setup.admin_token);
    println!("  Viewer token: {viewer_token}   (read-only: no edit controls)");
    println!();
    println!("Sign in with the admin token, edit a limit, and watch Envoy enforce it within a");
    println!("second. From another terminal:");
    println!();
    for (comment, command) in try_commands(args.listen, args.envoy_admin, args.second_listen) {
        println!("  # {comment}");
        println!("  {command}");
        println!();
    }
    println!("  # the same API the dashboard uses (also: /api/v1/proxies, which flags an Envoy");
    println!("  # enforcing fleet-wide limits on its own share while the coordinator is away)");
    println!(
        "  curl -s -H 'Authorization: Bearer {}' http://{admin}/api/v1/metrics/overview",
        setup.admin_token
    );
    println!();
    println!("Press Ctrl-C to stop.");
}

/// Keys the commands below spend: none of the demo's own clients (`demo_load.rs`) uses
/// them, so the reader sees exactly the limits the comments promise.
const TRY_KEY: &str = "try-me";
const TRY_PARTNER_KEY: &str = "try-partner";

/// The commands the running demo suggests, as (what it shows, the command). The README's
/// quick start shows the same commands for the default addresses (a test holds it to that).
fn try_commands(
    listen: SocketAddr,
    envoy_admin: SocketAddr,
    second: SocketAddr,
) -> Vec<(&'static str, String)> {
    vec![
        (
            "a burst on one key: ten 200s (api-per-key's burst), then 429s",
            format!(
                "for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' \
                 -H 'x-api-key: {TRY_KEY}' http://{listen}/api/hello; done"
            ),
        ),
        (
            "the same key again at once: a 429, its Retry-After and RateLimit fields and problem+json body",
            format!("curl -si -H 'x-api-key: {TRY_KEY}' http://{listen}/api/hello"),
        ),
        (
            "the filter's counters in Envoy",
            format!("curl -s http://{envoy_admin}/stats | grep sluice"),
        ),
        (
            "fleet-wide (partner-fleet: 10/s per key for both Envoys together): of 20 requests to each Envoy, about 10 in all are admitted, not 10 each",
            format!(
                "for port in {} {}; do for i in $(seq 20); do curl -s -o /dev/null -w '%{{http_code}} ' \
                 -H 'x-api-key: {TRY_PARTNER_KEY}' http://127.0.0.1:$port/partner/orders & done; done; wait; echo",
                listen.port(),
                second.port()
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        demo: DemoArgs,
    }

    #[test]
    fn the_readme_quick_start_shows_the_commands_the_demo_prints() {
        let args = Wrapper::parse_from(["demo"]).demo;
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
                .expect("README.md");
        for (comment, command) in try_commands(args.listen, args.envoy_admin, args.second_listen) {
            assert!(
                readme.contains(&format!("# {comment}\n{command}\n")),
                "README.md's quick start should show, as the demo prints it:\n# {comment}\n{command}"
            );
        }
    }

    #[test]
    fn the_suggested_keys_are_not_spent_by_the_demo_load() {
        let load = include_str!("demo_load.rs");
        for key in [TRY_KEY, TRY_PARTNER_KEY] {
            assert!(!load.contains(&format!("\"{key}\"")), "{key}");
        }
    }
}
