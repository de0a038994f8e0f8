//! API tokens: random secrets, stored only as their SHA-256.
//!
//! Tokens are 32 random bytes from the operating system's CSPRNG, so a fast unsalted hash
//! is enough: there is no dictionary to try. Lookups go by hash (indexed), and the stored
//! hash is then compared in constant time as a second line of defence.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore as _;
use sha2::{Digest, Sha256};
use sluice_core::validation::{FieldError, ValidationErrors};
use sqlx::Row;
use sqlx::any::AnyRow;
use subtle::ConstantTimeEq as _;

use super::audit::{Action, NewAudit, insert_audit};
use super::{Actor, Store, StoreError};

/// Every token starts with this, so leaked tokens are easy to find with a secret scanner.
pub(crate) const TOKEN_PREFIX: &str = "slc_";
/// How often a token's `last_used_at` is written at most: a poll every few seconds must
/// not turn every read into a write.
const LAST_USED_RESOLUTION_MS: i64 = 60_000;

/// What a token may do: the wire type, which the store keeps as its name.
pub use sluice_api::Role;

/// A token as listed: never its secret or hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: i64,
    pub(crate) created_by: String,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// A token just created: the only time its secret exists outside its holder.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub info: TokenInfo,
    pub secret: String,
}

/// The stored form of a token: lowercase hex SHA-256.
pub fn hash_token(secret: &str) -> String {
    // One formatting pass into one string: every authenticated call (a proxy's sync, each
    // rate limit service call) hashes its token, and a `format!` per byte was a fifth
    // of a `ShouldRateLimit` call's own work.
    format!("{:x}", Sha256::digest(secret.as_bytes()))
}

pub(super) fn random_string(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // ThreadRng is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

/// A new secret: `slc_` and 32 random bytes, base64url.
pub(crate) fn generate_secret() -> String {
    format!("{TOKEN_PREFIX}{}", random_string(32))
}

fn check_name(name: &str) -> Result<(), StoreError> {
    if name.trim().is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
        return Err(StoreError::Invalid(ValidationErrors(vec![FieldError {
            field: "name".to_string(),
            message: "must be 1 to 128 characters, without control characters".to_string(),
        }])));
    }
    Ok(())
}

pub(super) fn token_info(row: &AnyRow) -> Result<TokenInfo, StoreError> {
    let role: String = row.try_get("role")?;
    Ok(TokenInfo {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: role.parse().map_err(StoreError::Corrupt)?,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
        last_used_at: row.try_get("last_used_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

const TOKEN_COLUMNS: &str = "id, name, role, created_at, created_by, last_used_at, revoked_at";

fn audit_json(info: &TokenInfo) -> String {
    serde_json::json!({ "id": info.id, "name": info.name, "role": info.role }).to_string()
}

impl Store {
    /// Creates a token with a fresh random secret, at `now` (Unix ms).
    pub async fn create_token(
        &self,
        by: &Actor,
        name: &str,
        role: Role,
        now: i64,
    ) -> Result<NewToken, StoreError> {
        let secret = generate_secret();
        let info = self.add_token(by, name, role, &secret, now).await?;
        Ok(NewToken { info, secret })
    }

    /// Stores a token whose secret the caller chose (the bootstrap token from
    /// `SLUICE_ADMIN_TOKEN`), at `now` (Unix ms).
    pub(crate) async fn add_token(
        &self,
        by: &Actor,
        name: &str,
        role: Role,
        secret: &str,
        now: i64,
    ) -> Result<TokenInfo, StoreError> {
        check_name(name)?;
        let info = TokenInfo {
            id: format!("tok_{}", random_string(9)),
            name: name.to_string(),
            role,
            created_at: now,
            created_by: by.name.clone(),
            last_used_at: None,
            revoked_at: None,
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO tokens (id, name, role, hash, created_at, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&info.id)
        .bind(&info.name)
        .bind(role.as_str())
        .bind(hash_token(secret))
        .bind(info.created_at)
        .bind(&info.created_by)
        .execute(&mut *tx)
        .await?;
        insert_audit(
            &mut *tx,
            NewAudit {
                actor: by,
                action: Action::TokenCreate,
                at: now,
                target: Some(&info.id),
                version: None,
                before: None,
                after: Some(audit_json(&info)),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(info)
    }

    /// All tokens, revoked ones included, oldest first.
    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(token_info).collect()
    }

    /// How many tokens exist, revoked ones included: a server with none mints the first.
    pub(crate) async fn token_count(&self) -> Result<u64, StoreError> {
        self.count("tokens").await
    }

    /// The token with this secret, revoked or not.
    pub(crate) async fn find_token(&self, secret: &str) -> Result<Option<TokenInfo>, StoreError> {
        let hash = hash_token(secret);
        let row = sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS}, hash FROM tokens WHERE hash = $1"
        ))
        .bind(&hash)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let stored: String = row.try_get("hash")?;
        if !bool::from(stored.as_bytes().ct_eq(hash.as_bytes())) {
            return Ok(None);
        }
        token_info(&row).map(Some)
    }

    /// The active (not revoked) token with this secret; notes that it was used at `now`
    /// (Unix ms).
    pub async fn authenticate(
        &self,
        secret: &str,
        now: i64,
    ) -> Result<Option<TokenInfo>, StoreError> {
        let Some(info) = self.find_token(secret).await? else {
            return Ok(None);
        };
        if info.revoked_at.is_some() {
            return Ok(None);
        }
        if info
            .last_used_at
            .is_none_or(|t| now - t >= LAST_USED_RESOLUTION_MS)
        {
            sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE id = $2")
                .bind(now)
                .bind(&info.id)
                .execute(&self.pool)
                .await?;
        }
        Ok(Some(info))
    }

    /// Revokes a token at `now` (Unix ms); revoking a revoked token changes nothing and
    /// succeeds.
    pub async fn revoke_token(
        &self,
        by: &Actor,
        id: &str,
        now: i64,
    ) -> Result<TokenInfo, StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated =
            sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        let row = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::TokenNotFound(id.to_string()))?;
        let info = token_info(&row)?;
        if updated > 0 {
            insert_audit(
                &mut *tx,
                NewAudit {
                    actor: by,
                    action: Action::TokenRevoke,
                    at: now,
                    target: Some(id),
                    version: None,
                    before: Some(audit_json(&info)),
                    after: None,
                },
            )
            .await?;
        }
        tx.commit().await?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_stored_as_the_lowercase_hex_of_its_sha256() {
        // FIPS 180-2's example: what every stored token hash was written as.
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn secrets_are_prefixed_random_and_url_safe() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with("slc_"));
        assert_eq!(a.len(), 4 + 43);
        assert!(
            a[4..]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
    }

    #[test]
    fn the_hash_is_sha256_hex() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn roles_parse_from_their_names() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!("root".parse::<Role>().is_err());
    }
}
