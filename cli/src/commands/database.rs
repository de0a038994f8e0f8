//! The database every server-side subcommand opens, and `sluice migrate`.

use sluice_admin::store::{Store, StoreError};

use super::Failure;

#[derive(Debug, clap::Args)]
pub struct DatabaseArgs {
    /// sqlite://FILE (created if missing) or postgres://USER:PASSWORD@HOST:PORT/DB.
    #[arg(
        long,
        env = "SLUICE_DATABASE",
        default_value = "sqlite://sluice.db",
        value_name = "URL"
    )]
    pub database: String,
}

/// `sluice migrate`: opening the store creates or upgrades the schema.
pub async fn migrate(db: &DatabaseArgs) -> Result<(), Failure> {
    let store = open_store(db).await?;
    println!("database {} is migrated", redact(&db.database));
    store.close().await;
    Ok(())
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
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

pub async fn open_store(db: &DatabaseArgs) -> Result<Store, Failure> {
    Store::open(&db.database).await.map_err(|err| match err {
        StoreError::UnsupportedUrl(_) => Failure::BadInput(err.to_string()),
        other => Failure::Other(
            anyhow::Error::from(other).context(format!("opening {}", redact(&db.database))),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
