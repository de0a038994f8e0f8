//! Proxies, as seen by the ruleset long-poll: one upsert per poll, cheap enough to run on
//! every one.

use sqlx::Row;

use super::{Store, StoreError, to_i64, to_u64};

/// What one poll says about its proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySeen {
    pub id: String,
    /// The peer address the poll came from.
    pub address: String,
    pub token_id: Option<String>,
    /// The ruleset version the proxy runs.
    pub ruleset_version: u64,
    /// The proxy's last error; absent means it has none now.
    pub error: Option<String>,
}

/// A proxy as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRecord {
    pub(crate) id: String,
    pub address: String,
    pub(crate) token_id: Option<String>,
    pub first_seen: i64,
    pub last_seen: i64,
    pub ruleset_version: u64,
    pub last_error: Option<String>,
}

impl Store {
    pub async fn record_proxy(&self, seen: &ProxySeen, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO proxies (id, address, token_id, first_seen, last_seen, ruleset_version, last_error) \
             VALUES ($1, $2, $3, $4, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, token_id = excluded.token_id, \
             last_seen = excluded.last_seen, ruleset_version = excluded.ruleset_version, \
             last_error = excluded.last_error",
        )
        .bind(&seen.id)
        .bind(&seen.address)
        .bind(seen.token_id.clone())
        .bind(now)
        .bind(to_i64(seen.ruleset_version))
        .bind(seen.error.clone())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every proxy ever seen, most recently seen first.
    pub async fn list_proxies(&self) -> Result<Vec<ProxyRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, address, token_id, first_seen, last_seen, ruleset_version, last_error \
             FROM proxies ORDER BY last_seen DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ProxyRecord {
                    id: row.try_get("id")?,
                    address: row.try_get("address")?,
                    token_id: row.try_get("token_id")?,
                    first_seen: row.try_get("first_seen")?,
                    last_seen: row.try_get("last_seen")?,
                    ruleset_version: to_u64(row.try_get("ruleset_version")?),
                    last_error: row.try_get("last_error")?,
                })
            })
            .collect()
    }

    /// Proxies seen at or after `since` (Unix ms).
    pub async fn proxies_seen_since(&self, since: i64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM proxies WHERE last_seen >= $1")
            .bind(since)
            .fetch_one(&self.pool)
            .await?;
        Ok(to_u64(n))
    }
}
