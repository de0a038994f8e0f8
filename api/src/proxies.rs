//! `/api/v1/proxies`: the Envoys that poll for rules.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProxyView {
    /// As the proxy names itself in `x-sluice-proxy-id`.
    pub id: String,
    /// The address its last poll came from.
    pub address: String,
    /// The token it polls with.
    pub token_id: Option<String>,
    pub first_seen: String,
    pub last_seen: String,
    /// The ruleset version it runs, as it reports.
    pub ruleset_version: u64,
    /// The last error it reported (e.g. a ruleset it refused); absent when none.
    pub last_error: Option<String>,
    /// Polling now, or polled within the last 60 seconds.
    pub connected: bool,
    /// Its syncs of global (fleet-wide) buckets; `null` when it never synced with this
    /// admin API (or its replicas sharing one Redis).
    pub global_sync: Option<GlobalSyncView>,
}

/// How a proxy's syncs of global buckets stand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GlobalSyncView {
    /// When its last sync was answered; `null` when none was.
    pub last_answered: Option<String>,
    /// The sync interval it declares.
    pub interval_ms: u64,
    /// When it said it would sync next at the latest, in milliseconds, where that is later
    /// than one interval: its ruleset has no global limit, and it syncs only to stay
    /// counted in the fleet (every 16 intervals). `null` while it syncs every interval.
    pub next_sync_ms: Option<u64>,
    /// Its last sync could not be answered, or none was answered for more than two
    /// intervals (one interval past its announced next sync): it enforces global limits
    /// with its fallback shares (and counts them in `sluice_global_fallback_total`).
    pub on_fallback: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProxyList {
    /// Most recently seen first.
    pub proxies: Vec<ProxyView>,
}
