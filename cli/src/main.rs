//! The `sluice` command line: the subcommands, and how their failures become exit
//! statuses. Each subcommand lives in its own module of `cli/`.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::Failure;
use commands::database::DatabaseArgs;
use commands::envoy_config::EnvoyConfigArgs;
use commands::render::RenderCommand;
use commands::rules::RulesCommand;
use commands::serve::ServeArgs;
use commands::token::TokenCommand;

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
    // Boxed: its flags make it several times larger than the other commands.
    EnvoyConfig(Box<EnvoyConfigArgs>),
    /// Print what to apply on a platform: Istio or Envoy Gateway resources, a filter
    /// snippet for your own Envoy, or the admin API's Kubernetes manifests.
    #[command(subcommand)]
    Render(RenderCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // Pure generation: no async runtime needed.
        Command::EnvoyConfig(args) => commands::envoy_config::run(&args),
        Command::Render(command) => commands::render::run(&command),
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
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Migrate(db) => commands::database::migrate(&db).await,
        Command::Token(command) => commands::token::run(command).await,
        Command::Rules(command) => commands::rules::run(command).await,
        Command::EnvoyConfig(args) => commands::envoy_config::run(&args),
        Command::Render(command) => commands::render::run(&command),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn render_flags_that_cannot_go_together_are_refused() {
        let parse = |args: &[&str]| Cli::try_parse_from(["sluice", "render"].iter().chain(args));
        let istio = ["istio", "--namespace", "shop"];
        let with = |extra: &[&str]| parse(&[&istio[..], extra].concat());
        assert!(with(&[]).is_ok());
        assert!(
            parse(&["istio"]).is_err(),
            "a WasmPlugin needs its namespace"
        );
        assert!(with(&["--selector", "app=web", "--target-ref", "Gateway/eg"]).is_err());
        assert!(with(&["--selector", "app"]).is_err(), "not KEY=VALUE");
        assert!(with(&["--target-ref", "Pod/web"]).is_err());
        assert!(
            with(&["--insecure"]).is_err(),
            "--insecure without --admin-url"
        );
        assert!(with(&["--wasm", "f.wasm", "--sha256", "ab"]).is_err());
        assert!(with(&["--phase", "authz", "--admin-url", "https://a.example"]).is_ok());
        assert!(
            parse(&["envoy-gateway", "--namespace", "default"]).is_err(),
            "no Gateway"
        );
        assert!(parse(&["kubernetes", "--output", "a.yaml", "--output-dir", "d"]).is_err());
        assert!(parse(&["kubernetes", "--database", "postgres", "--replicas", "3"]).is_ok());
        assert!(parse(&["envoy", "--filter-wasm", "f.wasm", "--insecure"]).is_err());
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
}
