//! The database behind the admin API: SQLite (a file, the default) or PostgreSQL.
//!
//! One set of portable SQL runs on both through sqlx's `Any` driver: `$N` placeholders
//! (SQLite accepts them too), `BIGINT` Unix-millisecond times, JSON kept as text, and
//! `INSERT ... ON CONFLICT` upserts. What differs between the two lives only in the
//! migration folders `migrations/sqlite` and `migrations/postgres`.
//!
//! Architecture invariant: every ruleset change happens in [`Store::edit`], in one
//! transaction that validates the whole resulting ruleset, bumps the version, writes the
//! rules, a snapshot and an audit entry — or writes nothing.

mod metrics;
mod proxies;
mod rules;
mod sessions;
mod tokens;

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::rule::ValidationErrors;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions as _};

pub use metrics::{
    ClientBucket, ClientTotal, Counts, MetricsBatch, ProxyBeat, ProxyBucket, Resolution,
    RuleBucket, Span, TOP_CLIENTS_PER_BUCKET,
};
pub use proxies::{ProxyRecord, ProxySeen};
pub use rules::{
    Action, AuditEntry, ChangeKind, Edited, IfMatch, RuleChange, RuleFilter, RulePage, RuleRecord,
    VersionDetail, VersionSummary, Working, canonical, rule_id,
};
pub use sessions::{NewSession, SESSION_TTL_MS, Session};
pub use tokens::{NewToken, Role, TokenInfo, hash_token};

/// The two supported databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// Which database a URL names: `sqlite:...` or `postgres://...`/`postgresql://...`.
    pub fn of_url(url: &str) -> Option<Backend> {
        if url.starts_with("sqlite:") {
            Some(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Backend::Postgres)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Who made a change, for versions and the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The token's id; `None` for the command line, which works on the database directly.
    pub id: Option<String>,
    pub name: String,
}

impl Actor {
    /// The command line acting on the database directly (`sluice token ...`).
    pub fn cli() -> Actor {
        let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
        Actor {
            id: None,
            name: format!("cli:{user}"),
        }
    }

    /// The server itself (the bootstrap token).
    pub fn system() -> Actor {
        Actor {
            id: None,
            name: "system".to_string(),
        }
    }
}

/// Why a store operation failed. Everything but `Database`, `Migrate` and `Corrupt` is
/// the caller's to fix, and says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL `{0}`: use sqlite://FILE or postgres://USER@HOST/DB")]
    UnsupportedUrl(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrating the database failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("rule `{0}` not found")]
    RuleNotFound(String),
    #[error("a rule with id `{0}` already exists")]
    RuleExists(String),
    #[error("rule `{id}` is at revision {current}, not the one given in If-Match")]
    StaleRevision { id: String, current: u64 },
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("ruleset version {0} not found")]
    VersionNotFound(u64),
    #[error("token `{0}` not found")]
    TokenNotFound(String),
}

/// A connection pool and the dialect behind it.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Store {
    /// Connects to `url`. A SQLite file is created when missing (unless the URL sets its
    /// own `mode`). Does not migrate: call [`Store::migrate`].
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url).ok_or_else(|| StoreError::UnsupportedUrl(url.into()))?;
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_string(),
        };
        // Statements are logged by our own tracing at the edges; sqlx's per-statement INFO
        // lines would drown them (the long-poll runs one per proxy per poll).
        let options = AnyConnectOptions::from_str(&url)?
            .log_statements(log::LevelFilter::Trace)
            .log_slow_statements(log::LevelFilter::Warn, Duration::from_secs(1));
        let pool = AnyPoolOptions::new()
            .max_connections(match backend {
                Backend::Sqlite => 4,
                Backend::Postgres => 8,
            })
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        if backend == Backend::Sqlite {
            // WAL lets the long-polls read while a change commits. The setting is stored
            // in the file, so once is enough.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        Ok(Store { pool, backend })
    }

    /// Runs the migrations of this store's dialect that have not run yet.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// Connects and migrates: what `sluice serve` and the token commands do first.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let store = Store::connect(url).await?;
        store.migrate().await?;
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A cheap round trip, for `/readyz`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Now, in Unix milliseconds: the unit of every stored time.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A stored time as RFC 3339 (`2026-11-21T09:30:00.123Z`), as the API shows times.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

/// Stored counters are `BIGINT`; versions and revisions are never negative.
fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Versions are far below `i64::MAX`; saturate rather than wrap if a caller passes more.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
