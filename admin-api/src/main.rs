//! The `sluice` command line.

use std::io::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_admin::envoy_config::{
    self, DEFAULT_ENVOY_ADMIN, EnvoyConfigError, EnvoyConfigOptions, PluginConfig, Upstream,
};
use sluice_admin::rules_file;
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
    /// Print an Envoy bootstrap (YAML) that runs the Sluice filter in front of an upstream.
    EnvoyConfig(EnvoyConfigArgs),
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
    options.envoy_admin = args.envoy_admin;
    options.config_path = args.output.clone();

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
