//! Cross-replica wake-up on PostgreSQL: every committed ruleset change notifies the
//! channel [`VERSION_CHANNEL`] with its version (`pg_notify` inside the change's own
//! transaction, so the notice goes out exactly when the change commits, and never for a
//! change rolled back), and every `sluice serve` sharing the database listens on it, so a
//! proxy's long-poll held by any replica answers within milliseconds of a change made
//! through another.
//!
//! A notice can be missed (the listening connection drops and reconnects), so the
//! replicas also re-read the version once a second ([`crate::http::AppState::follow_versions`]):
//! notices make the wake-up prompt, the poll makes it certain. SQLite has no notices and
//! serves one process: it relies on the poll alone.

use sqlx::postgres::PgListener;

use super::{Backend, Store, StoreError};

/// The channel committed versions are announced on.
pub(crate) const VERSION_CHANNEL: &str = "sluice_ruleset_version";

/// A subscription to committed versions (PostgreSQL only).
#[derive(Debug)]
pub struct VersionNotices {
    listener: PgListener,
}

impl VersionNotices {
    /// The next version announced by any replica. After an error (the connection was
    /// lost), the next call reconnects and listens again.
    pub(crate) async fn next(&mut self) -> Result<u64, StoreError> {
        loop {
            let notice = self.listener.recv().await?;
            // Anything else on the channel is not ours to act on.
            if let Ok(version) = notice.payload().parse() {
                return Ok(version);
            }
        }
    }
}

impl Store {
    /// Listens for committed versions; `None` on SQLite.
    pub async fn version_notices(&self) -> Result<Option<VersionNotices>, StoreError> {
        if self.backend() != Backend::Postgres {
            return Ok(None);
        }
        let mut listener = PgListener::connect(&self.url).await?;
        listener.listen(VERSION_CHANNEL).await?;
        Ok(Some(VersionNotices { listener }))
    }

    /// Announces `version` when `tx` commits (PostgreSQL; nothing on SQLite).
    pub(super) async fn announce_version(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        version: u64,
    ) -> Result<(), StoreError> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(VERSION_CHANNEL)
                .bind(version.to_string())
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }
}
