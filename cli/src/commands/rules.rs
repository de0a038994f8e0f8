//! `sluice rules apply|export`: rules files through a running admin API, with the
//! command line's HTTP client ([`sluice_client`]); `sluice rules import`: rules files from
//! another rate limiter's configuration ([`sluice_rules_file::envoy_ratelimit`]), offline.

use std::path::{Path, PathBuf};

use clap::{Subcommand, ValueEnum};
use sluice_client::ApiClient;
use sluice_rules_file::RulesFormat;
use sluice_rules_file::envoy_ratelimit::{self, Bindings};

use super::{Failure, write_output};

#[derive(Debug, clap::Args)]
pub struct ApiArgs {
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
pub enum FormatArg {
    Yaml,
    Json,
}

impl From<FormatArg> for RulesFormat {
    fn from(format: FormatArg) -> RulesFormat {
        match format {
            FormatArg::Yaml => RulesFormat::Yaml,
            FormatArg::Json => RulesFormat::Json,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
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
    /// Convert another rate limiter's configuration into a rules file, saying what could
    /// not be converted and why. Nothing is sent: check the result with
    /// `apply --dry-run -f FILE`, then apply it.
    Import {
        /// What FILE is.
        #[arg(long, value_enum)]
        from: ImportFrom,
        /// The configuration to convert (envoy-ratelimit: its YAML descriptor file).
        file: PathBuf,
        /// The Envoy configuration (YAML or JSON) whose `rate_limits` actions produce the
        /// descriptors: it binds every descriptor key and gives each limit its routes.
        #[arg(long, value_name = "FILE")]
        envoy: Option<PathBuf>,
        /// Without --envoy: descriptor key KEY is the value of request header NAME (a
        /// `request_headers` action). Repeat for several keys.
        #[arg(long = "header", value_name = "KEY=NAME", value_parser = key_binding)]
        headers: Vec<(String, String)>,
        /// `X-Forwarded-For` hops to trust for `remote_address` (0: the TCP peer).
        #[arg(long, default_value_t = 0)]
        trusted_hops: u32,
        /// What the rules are for: `filter` (HTTP rules for the wasm filter, bound to
        /// requests by --envoy or --header) or `rls` (rules with a `descriptor`, for
        /// `sluice serve --rls-listen`: Envoy's native ratelimit filter keeps sending the
        /// descriptors it sends envoyproxy/ratelimit).
        #[arg(long = "for", value_enum, default_value_t = ImportFor::Filter, conflicts_with_all = ["envoy", "headers"])]
        target: ImportFor,
        #[arg(long, value_enum, default_value_t = FormatArg::Yaml)]
        format: FormatArg,
        /// Write to this file instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

/// What `rules import` writes rules for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportFor {
    /// The wasm filter: HTTP matches and client keys.
    Filter,
    /// Sluice's rate limit service: descriptor rules.
    Rls,
}

/// The configurations `rules import` reads.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ImportFrom {
    /// envoyproxy/ratelimit's descriptor configuration.
    EnvoyRatelimit,
}

fn key_binding(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((key, header)) if !key.is_empty() && !header.is_empty() => {
            Ok((key.to_string(), header.to_ascii_lowercase()))
        }
        _ => Err(format!("expected KEY=HEADER-NAME, got `{arg}`")),
    }
}

fn api_failure(err: sluice_client::ClientError) -> Failure {
    if err.is_client_error() {
        Failure::BadInput(err.to_string())
    } else {
        Failure::Other(err.into())
    }
}

/// Runs one rules subcommand through the API at `--url`.
pub async fn run(command: RulesCommand) -> Result<(), Failure> {
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
            // A dry run's estimate, per added or changed rule, from the last hour of reports.
            for estimate in &summary.estimates {
                println!("  estimate: {}", estimate.sentence());
            }
        }
        RulesCommand::Export {
            format,
            output,
            api,
        } => {
            let client =
                ApiClient::new(&api.url, &api.token, api.ca.as_deref()).map_err(api_failure)?;
            let text = client.export(format.into()).await.map_err(api_failure)?;
            write_output(output.as_deref(), &text)?;
        }
        RulesCommand::Import {
            from: ImportFrom::EnvoyRatelimit,
            file,
            envoy,
            headers,
            trusted_hops,
            target,
            format,
            output,
        } => import_envoy_ratelimit(
            &file,
            envoy.as_deref(),
            &Bindings {
                headers: headers.into_iter().collect(),
                trusted_hops,
            },
            target,
            format,
            output.as_deref(),
        )?,
    }
    Ok(())
}

/// `rules import --from envoy-ratelimit`: the rules go to the output, what was skipped and
/// what to know to standard error.
fn import_envoy_ratelimit(
    file: &Path,
    envoy: Option<&Path>,
    bindings: &Bindings,
    target: ImportFor,
    format: FormatArg,
    output: Option<&Path>,
) -> Result<(), Failure> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| Failure::BadInput(format!("{}: {e}", path.display())))
    };
    let config = read(file)?;
    let envoy_text = envoy.map(read).transpose()?;
    let import = match target {
        ImportFor::Filter => envoy_ratelimit::import(&config, envoy_text.as_deref(), bindings),
        ImportFor::Rls => envoy_ratelimit::import_for_rls(&config),
    }
    .map_err(|e| Failure::BadInput(e.to_string()))?;
    for skipped in &import.skipped {
        eprintln!("skipped {}: {}", skipped.what, skipped.why);
    }
    for note in &import.notes {
        eprintln!("note: {note}");
    }
    if import.rules.is_empty() {
        return Err(Failure::BadInput(format!(
            "{}: nothing could be converted (see above)",
            file.display()
        )));
    }
    let format = RulesFormat::from(format);
    let rules = sluice_rules_file::render_rules(&import.rules, format)
        .map_err(|e| anyhow::anyhow!("writing the rules: {e}"))?;
    let text = match format {
        RulesFormat::Yaml => format!(
            "# Sluice rules imported from {} (envoy-ratelimit).\n# Check with: sluice rules apply --dry-run -f FILE\n{rules}",
            file.display()
        ),
        RulesFormat::Json => rules,
    };
    write_output(output, &text)?;
    eprintln!(
        "converted {} rule(s); {} part(s) skipped",
        import.rules.len(),
        import.skipped.len()
    );
    Ok(())
}
