//! `sluice rules apply|export`: rules files through a running admin API, with the
//! command line's HTTP client ([`sluice_client`]).

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use sluice_client::ApiClient;
use sluice_rules_file::RulesFormat;

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
            write_output(output.as_deref(), &text)?;
        }
    }
    Ok(())
}
