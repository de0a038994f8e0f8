//! Dashboard sessions: a random id held by the browser in an HttpOnly cookie, stored only
//! as its SHA-256 (like tokens), acting as the token that opened it.
//!
//! Expiry slides: each use moves `expires_at` to `SESSION_TTL_MS` from now, written at
//! most once a minute so a dashboard polling every few seconds does not turn reads into
//! writes. A revoked token's sessions stop working at once (the lookup joins the token).

use sqlx::Row;

use super::tokens::{hash_token, random_string, token_info};
use super::{Store, StoreError, TokenInfo};

/// How long a session lasts without use: 12 hours.
pub(crate) const SESSION_TTL_MS: i64 = 12 * 60 * 60 * 1000;
/// How often the sliding expiry is written at most.
const SLIDE_RESOLUTION_MS: i64 = 60_000;

/// A session just opened: the only time its id exists outside the browser.
#[derive(Debug, Clone)]
pub(crate) struct NewSession {
    pub(crate) secret: String,
    pub(crate) expires_at: i64,
}

/// A live session and the token it acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) token: TokenInfo,
    pub(crate) expires_at: i64,
}

impl Store {
    /// Opens a session for `token` (already authenticated by the caller). Also clears
    /// sessions that have expired, so the table holds only live ones and recent leftovers.
    pub(crate) async fn create_session(
        &self,
        token: &TokenInfo,
        now: i64,
    ) -> Result<NewSession, StoreError> {
        sqlx::query("DELETE FROM sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        let secret = random_string(32);
        let expires_at = now + SESSION_TTL_MS;
        sqlx::query(
            "INSERT INTO sessions (id_hash, token_id, created_at, last_seen, expires_at) \
             VALUES ($1, $2, $3, $3, $4)",
        )
        .bind(hash_token(&secret))
        .bind(&token.id)
        .bind(now)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(NewSession { secret, expires_at })
    }

    /// The live session with this id and its (not revoked) token, sliding its expiry.
    pub(crate) async fn session(
        &self,
        secret: &str,
        now: i64,
    ) -> Result<Option<Session>, StoreError> {
        let hash = hash_token(secret);
        let row = sqlx::query(
            "SELECT t.id, t.name, t.role, t.created_at, t.created_by, t.last_used_at, \
             t.revoked_at, s.last_seen AS session_last_seen, s.expires_at AS session_expires_at \
             FROM sessions s JOIN tokens t ON t.id = s.token_id \
             WHERE s.id_hash = $1 AND s.expires_at > $2 AND t.revoked_at IS NULL",
        )
        .bind(&hash)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let token = token_info(&row)?;
        let last_seen: i64 = row.try_get("session_last_seen")?;
        let mut expires_at: i64 = row.try_get("session_expires_at")?;
        if now - last_seen >= SLIDE_RESOLUTION_MS {
            expires_at = now + SESSION_TTL_MS;
            sqlx::query("UPDATE sessions SET last_seen = $1, expires_at = $2 WHERE id_hash = $3")
                .bind(now)
                .bind(expires_at)
                .bind(&hash)
                .execute(&self.pool)
                .await?;
        }
        Ok(Some(Session { token, expires_at }))
    }

    /// Ends a session; ending one that does not exist succeeds.
    pub(crate) async fn delete_session(&self, secret: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sessions WHERE id_hash = $1")
            .bind(hash_token(secret))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
