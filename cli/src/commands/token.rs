//! `sluice token create|list|revoke`: API tokens, directly in the database (the way in
//! before any token exists).

use anyhow::Context as _;
use sluice_admin::store::{Actor, Role, StoreError, now_ms, rfc3339};

use super::Failure;
use super::database::{DatabaseArgs, open_store};

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
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

/// Runs one token subcommand against the database.
pub async fn run(command: TokenCommand) -> Result<(), Failure> {
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
