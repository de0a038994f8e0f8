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
//!
//! The store never reads the clock: every time it stores (a change's, a token's creation
//! or use, a poll's) is the caller's `now`, so its behaviour can be tested at a fixed time.
//! [`now_ms`] is the callers' clock.

mod audit;
mod edit;
mod metrics;
mod notify;
mod proxies;
mod rules;
mod sessions;
mod tokens;

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::validation::ValidationErrors;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions as _};

pub use audit::{Action, AuditEntry};
pub use edit::{Edited, Working};
pub use metrics::{
    ClientBucket, ClientTotal, Counts, METRIC_TABLES, MetricsBatch, ProxyBucket, RequesterBucket,
    Resolution, RuleBucket, Span, TOP_CLIENTS_PER_BUCKET,
};
pub(crate) use metrics::{ProxyBeat, REQUEST_COUNTS};
pub use notify::VersionNotices;
pub use proxies::{ProxyRecord, ProxySeen};
pub(crate) use rules::canonical;
pub use rules::{
    ChangeKind, IfMatch, RuleChange, RuleFilter, RulePage, RuleRecord, VersionDetail,
    VersionSummary, rule_id,
};
pub use tokens::{NewToken, Role, TokenInfo, hash_token};

/// The two supported databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// Which database a URL names: `sqlite:...` or `postgres://...`/`postgresql://...`.
    pub(crate) fn of_url(url: &str) -> Option<Backend> {
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
    #[error("the name `{name}` is used by rule `{holder}`")]
    NameTaken { name: String, holder: String },
    #[error("rule `{id}` is at revision {current}, not the one given in If-Match")]
    StaleRevision { id: String, current: u64 },
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("ruleset version {0} not found")]
    VersionNotFound(u64),
    #[error("token `{0}` not found")]
    TokenNotFound(String),
}

impl StoreError {
    /// Whether the database could not be reached or could not serve, rather than refusing
    /// this operation: no free connection within [`ACQUIRE_TIMEOUT`] (the server is down,
    /// so connecting is refused and retried until then, or every connection is busy), the
    /// pool closing at shutdown, a connection lost mid-operation (PostgreSQL stopped or
    /// restarted), or PostgreSQL saying it is shutting down, starting up or out of
    /// connections. The operation wrote nothing (a transaction whose connection is lost
    /// is rolled back by the server), so the caller may try again later: the API answers
    /// 503, not 500.
    pub(crate) fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(err) => connection_lost(err),
            _ => false,
        }
    }
}

/// See [`StoreError::is_unavailable`].
fn connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        // SQLSTATE class 08 is "connection exception"; 57P01-57P03 are admin shutdown,
        // crash shutdown and "cannot connect now" (starting up or shutting down); 53300 is
        // too many connections. SQLite's codes are numbers, so none of these match them.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

/// How long an operation waits for a database connection before it fails as unavailable
/// (a 503). While the server is unreachable sqlx keeps retrying the connection (with
/// backoff) until then, so a database that is back within this window serves the request;
/// the bound keeps a request from hanging through a longer outage. Generous, because a
/// saturated pool on a busy machine waits here too.
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `/readyz` waits for the database's answer: a readiness probe needs a prompt
/// "no", not one after [`ACQUIRE_TIMEOUT`].
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection pool and the dialect behind it.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// What it connected to: PostgreSQL's notice listener opens its own connection.
    url: String,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Store {
    /// Connects to `url`. A SQLite file is created when missing (unless the URL sets its
    /// own `mode`). Does not migrate: call [`Store::migrate`].
    pub(crate) async fn connect(url: &str) -> Result<Store, StoreError> {
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
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        if backend == Backend::Sqlite {
            // WAL lets the long-polls read while a change commits. The setting is stored
            // in the file, so once is enough.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        Ok(Store { pool, backend, url })
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

    /// A cheap round trip, for `/readyz`; a database that has not answered within
    /// [`PING_TIMEOUT`] is unavailable.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let query = sqlx::query("SELECT 1").execute(&self.pool);
        match tokio::time::timeout(PING_TIMEOUT, query).await {
            Ok(answer) => answer.map(drop).map_err(StoreError::from),
            Err(_elapsed) => Err(StoreError::Database(sqlx::Error::PoolTimedOut)),
        }
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

impl Store {
    /// The rows of `table` (with a condition, if it holds one that binds nothing).
    async fn count(&self, table: &str) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&self.pool)
            .await?;
        Ok(to_u64(n))
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

/// A query being built, with the parameters bound so far.
type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Stored counters are `BIGINT`; versions and revisions are never negative.
fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Versions are far below `i64::MAX`; saturate rather than wrap if a caller passes more.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use sqlx::Connection as _;

    use super::*;

    /// A loopback port nobody listens on: bound, then released.
    fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address").port()
    }

    #[tokio::test]
    async fn a_refused_connection_and_a_starved_pool_are_unavailable() {
        sqlx::any::install_default_drivers();
        let url = format!("postgres://postgres@127.0.0.1:{}/x", closed_port());
        let refused = sqlx::AnyConnection::connect(&url)
            .await
            .expect_err("nothing listens there");
        assert!(matches!(refused, sqlx::Error::Io(_)), "{refused:?}");
        assert!(StoreError::from(refused).is_unavailable());
        assert!(StoreError::from(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(StoreError::from(sqlx::Error::PoolClosed).is_unavailable());
    }

    #[tokio::test]
    async fn refusals_of_the_operation_itself_are_not_unavailable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store = Store::open(&url).await.expect("a SQLite file");
        let insert = "INSERT INTO ruleset_versions (version, created_at, actor_name, action, summary, rule_count, rules) \
                      VALUES (1, 0, 'a', 'b', 'c', 0, '[]')";
        sqlx::query(insert)
            .execute(store.pool())
            .await
            .expect("first insert");
        let duplicate = sqlx::query(insert)
            .execute(store.pool())
            .await
            .expect_err("version 1 exists");
        assert!(!StoreError::from(duplicate).is_unavailable());
        let syntax = sqlx::query("SELEC 1")
            .execute(store.pool())
            .await
            .expect_err("not SQL");
        assert!(!StoreError::from(syntax).is_unavailable());
        assert!(!StoreError::from(sqlx::Error::RowNotFound).is_unavailable());
        assert!(!StoreError::RuleNotFound("r".into()).is_unavailable());
        assert!(!StoreError::Corrupt("x".into()).is_unavailable());
    }

    /// PostgreSQL ending a session (as `pg_ctl stop -m fast` ends every session) is
    /// unavailability: first the server's 57P01, then a lost connection. Needs the suite's
    /// server (`SLUICE_TEST_POSTGRES_URL`); skipped without it unless it is required.
    #[tokio::test]
    async fn a_session_postgresql_ends_is_unavailable() {
        let Ok(url) = std::env::var("SLUICE_TEST_POSTGRES_URL") else {
            assert!(
                std::env::var_os("SLUICE_REQUIRE_POSTGRES").is_none(),
                "SLUICE_REQUIRE_POSTGRES is set but SLUICE_TEST_POSTGRES_URL is not"
            );
            eprintln!("skipped: SLUICE_TEST_POSTGRES_URL is not set");
            return;
        };
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(&url)
            .await
            .expect("connect to the test PostgreSQL");
        let ended = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(&mut conn)
            .await
            .expect_err("the session ends itself");
        let code = match &ended {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("57P01"), "{ended:?}");
        assert!(StoreError::from(ended).is_unavailable());
        let after = sqlx::query("SELECT 1")
            .execute(&mut conn)
            .await
            .expect_err("the connection is gone");
        let shown = format!("{after:?}");
        assert!(StoreError::from(after).is_unavailable(), "{shown}");
    }

    #[tokio::test]
    async fn ping_answers_within_its_bound_when_the_server_is_down() {
        sqlx::any::install_default_drivers();
        let url = format!("postgres://postgres@127.0.0.1:{}/x", closed_port());
        let pool = AnyPoolOptions::new()
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy(&url)
            .expect("a lazy pool");
        let store = Store {
            pool,
            backend: Backend::Postgres,
            url,
        };
        let start = Instant::now();
        let err = store.ping().await.expect_err("nothing listens there");
        assert!(err.is_unavailable(), "{err:?}");
        // sqlx alone would retry the refused connection until ACQUIRE_TIMEOUT.
        assert!(
            start.elapsed() < ACQUIRE_TIMEOUT,
            "ping took {:?}",
            start.elapsed()
        );
    }
}
