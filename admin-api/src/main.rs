//! The `sluice` command line.

use std::io::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_admin::api::AppState;
use sluice_admin::api::failed_auth::FailureLimit;
use sluice_admin::client::ApiClient;
use sluice_admin::envoy_config::{
    self, AdminConnection, AdminTls, AdminUrl, DEFAULT_ENVOY_ADMIN, EnvoyConfigError,
    EnvoyConfigOptions, PluginConfig, Upstream, UpstreamProtocol,
};
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::quota::Backend;
use sluice_admin::quota::redis::RedisBuckets;
use sluice_admin::rules_file::{self, RulesFormat};
use sluice_admin::server::{self, ADMIN_TOKEN_ENV, Bootstrap};
use sluice_admin::store::{Actor, Role, Store, StoreError, now_ms, rfc3339};
use sluice_core::config::{DEFAULT_SLOTS, FilterConfigSpec};
use sluice_core::spec::FailureMode;

/// Exit status for input the user must fix (bad rules, bad settings), as clap uses for bad
/// flags: scripts can tell it from an environment problem (status 1).
const EXIT_BAD_INPUT: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Token-bucket rate limiting for Envoy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the admin API: rules in a database, pushed to every connected Envoy.
    Serve(ServeArgs),
    /// Create or upgrade the database schema, then exit.
    Migrate(DatabaseArgs),
    /// Create, list or revoke API tokens (directly in the database).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Apply or export rules files through a running admin API.
    #[command(subcommand)]
    Rules(RulesCommand),
    /// Print an Envoy bootstrap (YAML) that runs the Sluice filter in front of an upstream.
    EnvoyConfig(EnvoyConfigArgs),
}

#[derive(Debug, clap::Args)]
struct DatabaseArgs {
    /// sqlite://FILE (created if missing) or postgres://USER:PASSWORD@HOST:PORT/DB.
    #[arg(
        long,
        env = "SLUICE_DATABASE",
        default_value = "sqlite://sluice.db",
        value_name = "URL"
    )]
    database: String,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    #[command(flatten)]
    db: DatabaseArgs,

    /// How long 10-second metric buckets are kept (e.g. 24h, 3d).
    #[arg(long = "retention-10s", value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    retention_10s: Duration,

    /// How long 1-minute metric buckets are kept.
    #[arg(long = "retention-1m", value_name = "DURATION", default_value = "14d", value_parser = humantime::parse_duration)]
    retention_1m: Duration,

    /// How long 1-hour metric buckets are kept.
    #[arg(long = "retention-1h", value_name = "DURATION", default_value = "400d", value_parser = humantime::parse_duration)]
    retention_1h: Duration,

    /// Keep global (fleet-wide) buckets in this Redis instead of in memory, so several
    /// `sluice serve` replicas share them and they survive restarts.
    #[arg(long, env = "SLUICE_REDIS", value_name = "redis://HOST:PORT[/DB]")]
    redis: Option<String>,

    /// Serve over TLS with this PEM certificate chain (the server's certificate first, then
    /// any intermediates). Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert's certificate.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Failed authentications (wrong tokens, sessions or sign-ins) one client address may
    /// make at once before it is answered 429; then one more every --auth-failure-refill.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::api::failed_auth::ALLOWED_FAILURES)]
    auth_failures: u64,

    /// How often a client address regains one failed authentication (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    auth_failure_refill: Duration,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token and print its secret (once: only its hash is stored).
    Create {
        /// admin (everything), editor (rules), viewer (read), proxy (ruleset poll only).
        #[arg(long)]
        role: Role,
        /// Who or what holds it, e.g. `ci-deploy` or `envoy-eu-1`.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        db: DatabaseArgs,
    },
    /// List tokens (never their secrets).
    List {
        #[command(flatten)]
        db: DatabaseArgs,
    },
    /// Revoke a token by id (`tok_...`); requests with it then get 401.
    Revoke {
        id: String,
        #[command(flatten)]
        db: DatabaseArgs,
    },
}

#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// The admin API.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// PEM CA certificates to trust besides the system's, for an https:// URL whose
    /// certificate a private CA issued.
    #[arg(long, env = "SLUICE_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// An API token (editor or admin to apply; any role but proxy to export).
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Yaml,
    Json,
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Make the stored rules match a rules file (idempotent: the same file twice changes
    /// nothing). Rules not in the file are kept unless --prune.
    Apply {
        /// A .json, .yaml or .yml rules file.
        #[arg(long, short = 'f', value_name = "FILE")]
        file: PathBuf,
        /// Delete stored rules that are not in the file.
        #[arg(long)]
        prune: bool,
        /// Show what would change without changing anything.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print the current rules as a rules file that `apply` takes back.
    Export {
        #[arg(long, value_enum, default_value_t = FormatArg::Yaml)]
        format: FormatArg,
        /// Write to this file instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, clap::Args)]
struct EnvoyConfigArgs {
    /// Address Envoy listens on for client traffic (port 0: any free port).
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,

    /// Where allowed requests go: IP:PORT of the upstream, or `direct` for Envoy to answer
    /// 200 "ok" itself (benchmarks, memory tests).
    #[arg(long, value_name = "IP:PORT|direct")]
    upstream: Upstream,

    /// What Envoy speaks to the upstream: `http2` for a gRPC upstream, `downstream` for the
    /// client's own protocol (gRPC and plain HTTP side by side).
    #[arg(long, value_enum, default_value_t = UpstreamProtocol::Http1)]
    upstream_protocol: UpstreamProtocol,

    /// The built filter (sluice_filter.wasm); written into the config as an absolute path.
    #[arg(long, value_name = "PATH.wasm")]
    filter: PathBuf,

    /// Rules enforced from start-up: a JSON or YAML list of rules (or `{rules: [...]}`).
    #[arg(long, value_name = "FILE.json|.yaml|.yml")]
    rules: Option<PathBuf>,

    /// Envoy worker threads, for the run command at the top of the output (Envoy takes
    /// it as a flag, not from the config).
    #[arg(long, value_name = "N")]
    concurrency: Option<NonZeroU32>,

    /// Address of Envoy's admin interface.
    #[arg(long, value_name = "IP:PORT", default_value_t = DEFAULT_ENVOY_ADMIN)]
    envoy_admin: SocketAddr,

    /// Bucket slots shared by all workers: bounds the filter's memory in Envoy
    /// (about 150 bytes each).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SLOTS)]
    slots: u32,

    /// What rules without their own failure mode do when they cannot be evaluated.
    #[arg(long, value_enum, default_value_t = FailureModeArg::Open)]
    failure_mode: FailureModeArg,

    /// Write the config to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Take rules from the admin API at this address: adds the control service (a
    /// singleton that long-polls the API) and a `sluice_admin` cluster. Needs
    /// --proxy-token; https:// needs --admin-ca; http:// to anything but a loopback
    /// address needs --insecure. Replicas of one admin API (sharing a PostgreSQL
    /// database): repeat the flag or separate URLs with commas; Envoy health-checks them
    /// and fails over between them.
    #[arg(
        long,
        value_name = "https://HOST:PORT",
        requires = "proxy_token",
        value_delimiter = ','
    )]
    admin_url: Vec<AdminUrl>,

    /// PEM CA certificates that the admin API's certificate must chain to (https://).
    #[arg(long, value_name = "FILE", requires = "admin_url")]
    admin_ca: Option<PathBuf>,

    /// The name the admin API's certificate must carry, sent as SNI (default: the URL's
    /// host; an IP address is then matched as an IP address and not sent).
    #[arg(long, value_name = "NAME", requires = "admin_ca")]
    admin_sni: Option<String>,

    /// A PEM client certificate Envoy presents to the admin API (or to a proxy in front of
    /// it that asks for one). Needs --admin-client-key.
    #[arg(long, value_name = "FILE", requires_all = ["admin_ca", "admin_client_key"])]
    admin_client_cert: Option<PathBuf>,

    /// The PEM private key of --admin-client-cert.
    #[arg(long, value_name = "FILE", requires = "admin_client_cert")]
    admin_client_key: Option<PathBuf>,

    /// Allow an http:// --admin-url to a non-loopback address: the proxy token then
    /// crosses the network in clear text.
    #[arg(long, requires = "admin_url")]
    insecure: bool,

    /// A token with the `proxy` role for the control service
    /// (`sluice token create --role proxy --name ...`).
    #[arg(long, value_name = "TOKEN", requires = "admin_url")]
    proxy_token: Option<String>,

    /// How this Envoy names itself to the admin API (default: Envoy's node id).
    #[arg(long, value_name = "ID", requires = "admin_url")]
    proxy_id: Option<String>,

    /// How often the control service syncs fleet-wide buckets with the admin API, 50 to
    /// 10,000 ms (default 250). Longer halves the coordinator's work per doubling, and the
    /// fleet then runs further behind its limit (about half an interval of the rate).
    #[arg(long, value_name = "MS", requires = "admin_url")]
    sync_interval_ms: Option<u32>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FailureModeArg {
    Open,
    Closed,
}

impl From<FailureModeArg> for FailureMode {
    fn from(mode: FailureModeArg) -> Self {
        match mode {
            FailureModeArg::Open => FailureMode::Open,
            FailureModeArg::Closed => FailureMode::Closed,
        }
    }
}

/// A failure with its exit status.
#[derive(Debug)]
enum Failure {
    /// The user's input is wrong; the message says what to change.
    BadInput(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Other(err)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::EnvoyConfig(args) => envoy_config(&args),
        command => match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime.block_on(run_async(command)),
            Err(err) => Err(Failure::Other(
                anyhow::Error::from(err).context("starting the async runtime"),
            )),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(Failure::Other(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_async(command: Command) -> Result<(), Failure> {
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Migrate(db) => {
            let store = open_store(&db).await?;
            println!("database {} is migrated", redact(&db.database));
            store.close().await;
            Ok(())
        }
        Command::Token(command) => token(command).await,
        Command::Rules(command) => rules(command).await,
        Command::EnvoyConfig(args) => envoy_config(&args),
    }
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

async fn open_store(db: &DatabaseArgs) -> Result<Store, Failure> {
    Store::open(&db.database).await.map_err(|err| match err {
        StoreError::UnsupportedUrl(_) => Failure::BadInput(err.to_string()),
        other => Failure::Other(
            anyhow::Error::from(other).context(format!("opening {}", redact(&db.database))),
        ),
    })
}

fn init_logging() {
    // RUST_LOG overrides, e.g. RUST_LOG=sluice_admin=debug shows every request.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files and CI logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn serve(args: ServeArgs) -> Result<(), Failure> {
    init_logging();
    // Checked before anything else, so a wrong file is reported at once and alone.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            sluice_admin::tls::server_config(cert, key)
                .map_err(|err| Failure::BadInput(err.to_string()))?,
        ),
        _ => None,
    };
    let auth_failures = FailureLimit {
        allowed: args.auth_failures,
        refill: args.auth_failure_refill,
    };
    if auth_failures.gcra().is_none() {
        return Err(Failure::BadInput(format!(
            "--auth-failures {} with --auth-failure-refill {}: allow at least 1, refill at least 1 ns, and keep their product under 146 years",
            args.auth_failures,
            humantime::format_duration(args.auth_failure_refill)
        )));
    }
    let store = open_store(&args.db).await?;
    let env_token = std::env::var(ADMIN_TOKEN_ENV).ok();
    match server::bootstrap_admin(&store, env_token.as_deref())
        .await
        .context("creating the bootstrap admin token")?
    {
        Bootstrap::FromEnv {
            created: true,
            token,
        } => {
            tracing::info!(id = %token.id, "stored {ADMIN_TOKEN_ENV} as an admin token");
        }
        Bootstrap::FromEnv { created: false, .. } | Bootstrap::NotNeeded => {}
        Bootstrap::EnvTokenRevoked(token) => {
            tracing::warn!(id = %token.id, "{ADMIN_TOKEN_ENV} names a revoked token; it stays revoked");
        }
        Bootstrap::Generated(token) => {
            eprintln!(
                "\nThe database had no API tokens, so an admin token was created. It is shown \
                 only this once (only its hash is stored):\n\n    {}\n\nUse it as \
                 `Authorization: Bearer TOKEN`, or SLUICE_TOKEN=... for `sluice rules`.\n",
                token.secret
            );
        }
    }
    let signals = ShutdownSignals::install().context("installing signal handlers")?;
    let metrics = MetricsConfig {
        retention_10s: args.retention_10s,
        retention_1m: args.retention_1m,
        retention_1h: args.retention_1h,
        ..MetricsConfig::default()
    };
    let quota = match &args.redis {
        None => Backend::Memory,
        Some(url) => {
            let redis = RedisBuckets::connect(url)
                .await
                .with_context(|| format!("connecting to Redis at {url}"))?;
            tracing::info!(%url, "global buckets are kept in Redis");
            Backend::Redis(redis)
        }
    };
    let state = AppState::with_options(store.clone(), metrics, quota, auth_failures)
        .await
        .context("reading the current ruleset version")?;
    let server = match tls {
        Some(tls) => server::start_tls(state, args.listen, tls).await,
        None => server::start(state, args.listen).await,
    }
    .with_context(|| format!("listening on {}", args.listen))?;
    // One stable line on stdout for scripts and tests that start `sluice serve` on port 0
    // (`sluice_core::listening` reads it back).
    println!("{}", server.listening());
    let _ = std::io::stdout().flush();
    tracing::info!(
        addr = %server.addr(),
        database = %redact(&args.db.database),
        backend = store.backend().name(),
        "admin API ready"
    );
    signals.wait().await;
    tracing::info!("shutting down");
    server.stop().await.context("serving")?;
    store.close().await;
    Ok(())
}

/// SIGINT (Ctrl-C) or SIGTERM (what service managers and container runtimes send).
///
/// Installed before the address is printed: whoever reads that line may signal at once,
/// and a signal before the handler exists would kill the process without a clean stop.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> std::io::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

async fn token(command: TokenCommand) -> Result<(), Failure> {
    match command {
        TokenCommand::Create { role, name, db } => {
            let store = open_store(&db).await?;
            let created = store
                .create_token(&Actor::cli(), &name, role, now_ms())
                .await
                .map_err(|err| match err {
                    StoreError::Invalid(e) => Failure::BadInput(format!("--name: {}", e)),
                    other => Failure::Other(other.into()),
                })?;
            eprintln!(
                "created {} token {} ({}); the secret below is shown only now:",
                created.info.role, created.info.id, created.info.name
            );
            // The secret alone on stdout, so `TOKEN=$(sluice token create ...)` works.
            println!("{}", created.secret);
            store.close().await;
        }
        TokenCommand::List { db } => {
            let store = open_store(&db).await?;
            let tokens = store.list_tokens().await.context("listing tokens")?;
            println!(
                "{:<18} {:<7} {:<24} {:<25} STATUS",
                "ID", "ROLE", "NAME", "CREATED"
            );
            for t in tokens {
                let status = match t.revoked_at {
                    Some(at) => format!("revoked {}", rfc3339(at)),
                    None => "active".to_string(),
                };
                println!(
                    "{:<18} {:<7} {:<24} {:<25} {status}",
                    t.id,
                    t.role.as_str(),
                    t.name,
                    rfc3339(t.created_at)
                );
            }
            store.close().await;
        }
        TokenCommand::Revoke { id, db } => {
            let store = open_store(&db).await?;
            let info = store
                .revoke_token(&Actor::cli(), &id, now_ms())
                .await
                .map_err(|err| match err {
                    StoreError::TokenNotFound(_) => Failure::BadInput(err.to_string()),
                    other => Failure::Other(other.into()),
                })?;
            println!("revoked {} ({}, {})", info.id, info.name, info.role);
            store.close().await;
        }
    }
    Ok(())
}

fn api_failure(err: sluice_admin::client::ClientError) -> Failure {
    if err.is_client_error() {
        Failure::BadInput(err.to_string())
    } else {
        Failure::Other(err.into())
    }
}

async fn rules(command: RulesCommand) -> Result<(), Failure> {
    match command {
        RulesCommand::Apply {
            file,
            prune,
            dry_run,
            api,
        } => {
            let format = RulesFormat::from_path(&file).ok_or_else(|| {
                Failure::BadInput(format!(
                    "{}: expected a .json, .yaml or .yml file",
                    file.display()
                ))
            })?;
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Failure::BadInput(format!("{}: {e}", file.display())))?;
            let client =
                ApiClient::new(&api.url, &api.token, api.ca.as_deref()).map_err(api_failure)?;
            let summary = client
                .apply(text, format, prune, dry_run)
                .await
                .map_err(|err| match api_failure(err) {
                    Failure::BadInput(m) => Failure::BadInput(format!("{}: {m}", file.display())),
                    other => other,
                })?;
            let version = summary.version;
            if summary.changed {
                let verb = if dry_run { "would change" } else { "applied" };
                println!(
                    "{verb} {}{}",
                    file.display(),
                    if dry_run {
                        format!(" (now at version {version})")
                    } else {
                        format!(": ruleset version {version}")
                    }
                );
                for (label, ids) in [
                    ("added", &summary.added),
                    ("updated", &summary.updated),
                    ("removed", &summary.removed),
                ] {
                    if !ids.is_empty() {
                        println!("  {label}: {}", ids.join(", "));
                    }
                }
            } else {
                println!("{}: no changes (ruleset version {version})", file.display());
            }
        }
        RulesCommand::Export {
            format,
            output,
            api,
        } => {
            let client =
                ApiClient::new(&api.url, &api.token, api.ca.as_deref()).map_err(api_failure)?;
            let format = match format {
                FormatArg::Yaml => RulesFormat::Yaml,
                FormatArg::Json => RulesFormat::Json,
            };
            let text = client.export(format).await.map_err(api_failure)?;
            match output {
                Some(path) => {
                    std::fs::write(&path, text)
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
                None => {
                    let mut stdout = std::io::stdout().lock();
                    stdout
                        .write_all(text.as_bytes())
                        .and_then(|()| stdout.flush())
                        .context("writing to standard output")?;
                }
            }
        }
    }
    Ok(())
}

fn envoy_config(args: &EnvoyConfigArgs) -> Result<(), Failure> {
    let filter = std::path::absolute(&args.filter)
        .with_context(|| format!("resolving the filter path {}", args.filter.display()))?;
    if !filter.is_file() {
        eprintln!(
            "warning: {} does not exist yet; Envoy will fail to load the filter until it does \
             (build it with `cargo xtask build`)",
            filter.display()
        );
    }

    let rules = match &args.rules {
        // Even an unreadable file is for the user to fix (a typo'd path, permissions).
        Some(path) => rules_file::read_rules_file(path)
            .map_err(|err| Failure::BadInput(format!("{:#}", anyhow::Error::from(err))))?,
        None => Vec::new(),
    };
    let spec = FilterConfigSpec {
        rules,
        failure_mode: args.failure_mode.into(),
        slots: args.slots,
        ..FilterConfigSpec::default()
    };

    let mut options = EnvoyConfigOptions::new(args.listen, args.upstream, filter);
    options.plugin = PluginConfig::Spec(spec);
    options.concurrency = args.concurrency;
    options.upstream_protocol = args.upstream_protocol;
    options.envoy_admin = args.envoy_admin;
    options.config_path = args.output.clone();
    if let (Some((url, replicas)), Some(token)) = (args.admin_url.split_first(), &args.proxy_token)
    {
        let mut admin = AdminConnection::new(url.clone(), token.clone());
        admin.replicas = replicas.to_vec();
        admin.proxy_id = args.proxy_id.clone();
        admin.sync_interval_ms = args.sync_interval_ms;
        admin.insecure = args.insecure;
        admin.tls = admin_tls(args)?;
        options.admin = Some(admin);
    }

    let yaml = envoy_config::render(&options).map_err(|err| match err {
        EnvoyConfigError::InvalidFilterConfig(errors) => {
            let mut message = String::from("the filter configuration is invalid:");
            for problem in &errors.0 {
                message.push_str("\n  ");
                message.push_str(&blame(&problem.field, args.rules.as_deref()));
                message.push_str(": ");
                message.push_str(&problem.message);
            }
            Failure::BadInput(message)
        }
        EnvoyConfigError::InvalidControlConfig(errors) => {
            Failure::BadInput(format!("--admin-url/--proxy-token/--proxy-id: {errors}"))
        }
        EnvoyConfigError::PlainHttpToRemote(_)
        | EnvoyConfigError::MixedAdminSchemes(..)
        | EnvoyConfigError::AdminCaMissing(_)
        | EnvoyConfigError::AdminTlsWithoutHttps(_) => Failure::BadInput(err.to_string()),
        other => Failure::Other(other.into()),
    })?;

    match &args.output {
        Some(path) => {
            std::fs::write(path, &yaml).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(yaml.as_bytes())
                .and_then(|()| stdout.flush())
                .context("writing to standard output")?;
        }
    }
    Ok(())
}

/// `--admin-ca` and the flags beside it, with absolute paths (Envoy resolves relative
/// ones against its own working directory). Files that cannot be read here are refused:
/// they are usually on the machine Envoy runs on, and a typo is best caught now.
fn admin_tls(args: &EnvoyConfigArgs) -> Result<Option<AdminTls>, Failure> {
    let Some(ca) = &args.admin_ca else {
        return Ok(None);
    };
    let file = |flag: &str, path: &Path| -> Result<PathBuf, Failure> {
        let absolute = std::path::absolute(path)
            .map_err(|e| Failure::BadInput(format!("--{flag} {}: {e}", path.display())))?;
        std::fs::File::open(&absolute)
            .map_err(|e| Failure::BadInput(format!("--{flag} {}: {e}", path.display())))?;
        Ok(absolute)
    };
    let mut tls = AdminTls::new(file("admin-ca", ca)?);
    tls.sni = args.admin_sni.clone();
    if let (Some(cert), Some(key)) = (&args.admin_client_cert, &args.admin_client_key) {
        tls.client_cert = Some((
            file("admin-client-cert", cert)?,
            file("admin-client-key", key)?,
        ));
    }
    Ok(Some(tls))
}

/// Names where a problem must be fixed: the rules file and the rule's field, or the flag.
fn blame(field: &str, rules_file: Option<&Path>) -> String {
    match field {
        "slots" => "--slots".to_string(),
        "failure_mode" => "--failure-mode".to_string(),
        _ if field.starts_with("rules") => match rules_file {
            Some(path) => format!("{}: {field}", path.display()),
            None => field.to_string(),
        },
        _ => field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn admin_url_and_proxy_token_come_together() {
        let base = [
            "sluice",
            "envoy-config",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "direct",
            "--filter",
            "f.wasm",
        ];
        let with = |extra: &[&str]| Cli::try_parse_from(base.iter().chain(extra));
        assert!(with(&[]).is_ok());
        assert!(with(&["--admin-url", "http://127.0.0.1:8080"]).is_err());
        assert!(with(&["--proxy-token", "t"]).is_err());
        assert!(with(&["--admin-url", "ftp://a:1", "--proxy-token", "t"]).is_err());
        assert!(with(&["--admin-url", "https://a:1", "--proxy-token", "t"]).is_ok());
        let https = ["--admin-url", "https://a:1", "--proxy-token", "t"];
        let tls = |extra: &[&str]| with(&[&https[..], extra].concat());
        assert!(tls(&["--admin-ca", "ca.pem", "--admin-sni", "a"]).is_ok());
        assert!(tls(&["--admin-sni", "a"]).is_err(), "SNI without a CA");
        assert!(
            tls(&["--admin-ca", "c", "--admin-client-cert", "x"]).is_err(),
            "a client certificate without its key"
        );
        assert!(tls(&["--admin-ca", "c", "--admin-client-key", "k"]).is_err());
        assert!(
            tls(&[
                "--admin-ca",
                "c",
                "--admin-client-cert",
                "x",
                "--admin-client-key",
                "k"
            ])
            .is_ok()
        );
        assert!(
            with(&["--insecure"]).is_err(),
            "--insecure without an admin URL"
        );
        assert!(
            with(&[
                "--admin-url",
                "http://127.0.0.1:8080",
                "--proxy-token",
                "t",
                "--proxy-id",
                "e"
            ])
            .is_ok()
        );
    }

    #[test]
    fn passwords_are_redacted_from_database_urls() {
        assert_eq!(
            redact("postgres://sluice:hunter2@db:5432/sluice"),
            "postgres://sluice:***@db:5432/sluice"
        );
        assert_eq!(
            redact("postgres://sluice@db/sluice"),
            "postgres://sluice@db/sluice"
        );
        assert_eq!(redact("sqlite://sluice.db"), "sqlite://sluice.db");
    }
}
