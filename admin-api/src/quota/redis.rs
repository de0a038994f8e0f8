//! Global buckets in Redis, shared by every `sluice serve` replica that uses the same
//! Redis.
//!
//! Each bucket is one key (`sluice:quota:b:<hex id>`) holding its state as JSON; the
//! arithmetic stays in Rust (the core's `settle`), and Redis only makes the update atomic:
//! a sync reads its buckets (one `GET` each, pipelined), settles them, and writes each back
//! with a compare-and-set script on that one key (pipelined). A bucket another replica
//! changed in between is read and settled again. Every command touches one key, so the
//! same commands work on a Redis Cluster (each bucket on its own hash slot).
//!
//! The clock is Redis's (`TIME`), so replicas agree on time. The fleet is a sorted set of
//! proxies by last sync; the coordinator's *epoch* (when Redis's state began) is a key set
//! only if missing: if Redis lost its data, the epoch is new and the coordinator warms up.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisResult, Script};
use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, Grant, Settings, Usage, settle};

const BUCKET_PREFIX: &str = "sluice:quota:b:";
const FLEET_KEY: &str = "sluice:quota:fleet";
const EPOCH_KEY: &str = "sluice:quota:epoch";
/// Rounds of re-reading buckets that another replica changed during one sync.
const MAX_ROUNDS: usize = 5;
/// A proxy unseen for this long leaves the fleet's sorted set.
const FLEET_FORGET_MS: u64 = 600_000;

/// Writes `ARGV[2]` (expiring in `ARGV[3]` ms) if the key still holds `ARGV[1]` (`""`:
/// missing). Returns 1 when written.
const COMPARE_AND_SET: &str = r"
local current = redis.call('GET', KEYS[1])
if (current == false and ARGV[1] == '') or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

#[derive(Clone)]
pub struct RedisBuckets {
    connection: ConnectionManager,
    compare_and_set: Script,
}

impl std::fmt::Debug for RedisBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuckets").finish_non_exhaustive()
    }
}

/// What one sync got from Redis.
#[derive(Debug)]
pub struct Settled {
    pub grants: Vec<Grant>,
    pub fleet_size: u32,
    pub warming_up: bool,
    /// Redis commands sent, for the commands-per-second metric.
    pub commands: u64,
    /// Buckets given up on after [`MAX_ROUNDS`] lost races (granted nothing).
    pub contended: u64,
}

impl RedisBuckets {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`). Fails when Redis does not answer, so
    /// `sluice serve --redis` stops at start-up rather than serving without it.
    pub async fn connect(url: &str) -> RedisResult<Self> {
        let client = Client::open(url)?;
        // Short timeouts: a sync that cannot reach Redis answers 503 at once, and the
        // proxies fall back to their shares instead of waiting.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1);
        let mut connection = client.get_connection_manager_with_config(config).await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await?;
        Ok(Self {
            connection,
            compare_and_set: Script::new(COMPARE_AND_SET),
        })
    }

    /// Every proxy in the fleet's sorted set and when its last sync was answered (Unix
    /// milliseconds, Redis's clock).
    pub async fn fleet(&self) -> RedisResult<Vec<(String, i64)>> {
        let mut con = self.connection.clone();
        redis::cmd("ZRANGE")
            .arg(FLEET_KEY)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await
    }

    /// Settles one proxy's sync.
    pub async fn settle_all(
        &self,
        proxy: &str,
        buckets: &[(u64, Gcra, Usage)],
        covers_ns: u64,
        settings: Settings,
        lease_ttl_ns: u64,
        fleet_memory_ns: u64,
    ) -> RedisResult<Settled> {
        let mut con = self.connection.clone();
        let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await?;
        let now = seconds * 1_000_000_000 + micros * 1_000;
        let now_ms = now / 1_000_000;

        let (epoch, _, _, fleet): (Option<u64>, (), (), u64) = redis::pipe()
            .cmd("SET")
            .arg(EPOCH_KEY)
            .arg(now)
            .arg("NX")
            .arg("GET")
            .cmd("ZADD")
            .arg(FLEET_KEY)
            .arg(now_ms)
            .arg(proxy)
            .cmd("ZREMRANGEBYSCORE")
            .arg(FLEET_KEY)
            .arg("-inf")
            .arg(now_ms.saturating_sub(FLEET_FORGET_MS))
            .cmd("ZCOUNT")
            .arg(FLEET_KEY)
            .arg(now_ms.saturating_sub(fleet_memory_ns / 1_000_000))
            .arg("+inf")
            .query_async(&mut con)
            .await?;
        let epoch = epoch.unwrap_or(now);
        let fleet_size = u32::try_from(fleet).unwrap_or(u32::MAX).max(1);
        let settings = Settings {
            warming_up: now < epoch.saturating_add(lease_ttl_ns),
            fleet_size,
            ..settings
        };
        let mut commands = 5;

        let mut grants = vec![Grant::default(); buckets.len()];
        let mut pending: Vec<usize> = (0..buckets.len()).collect();
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let mut read = redis::pipe();
            for &i in &pending {
                read.cmd("GET").arg(key(buckets[i].0));
            }
            let olds: Vec<Option<String>> = read.query_async(&mut con).await?;
            commands += pending.len() as u64;

            // Loading is idempotent and cheap; it keeps a Redis that restarted (and lost its
            // scripts) from refusing the EVALSHAs that follow.
            let mut write = redis::pipe();
            write.load_script(&self.compare_and_set).ignore();
            let mut planned = Vec::with_capacity(pending.len());
            for (&i, old) in pending.iter().zip(olds) {
                let (id, limit, usage) = &buckets[i];
                let mut state: BucketState = old
                    .as_deref()
                    .and_then(|text| serde_json::from_str(text).ok())
                    .unwrap_or_default();
                let grant = settle(&mut state, limit, usage, covers_ns, now, &settings);
                let new = serde_json::to_string(&state).unwrap_or_default();
                // Kept while the bucket refills and its demand is remembered; after that a
                // missing key is the same as a full, quiet bucket.
                let keep_ms = (grant.full_in_ns + 10 * settings.demand_tau_ns) / 1_000_000 + 1;
                write.invoke_script(
                    self.compare_and_set
                        .key(key(*id))
                        .arg(old.unwrap_or_default())
                        .arg(new)
                        .arg(keep_ms),
                );
                planned.push((i, grant));
            }
            let written: Vec<i64> = write.query_async(&mut con).await?;
            commands += planned.len() as u64 + 1;
            pending.clear();
            for ((i, grant), ok) in planned.into_iter().zip(written) {
                if ok == 1 {
                    grants[i] = grant;
                } else {
                    pending.push(i);
                }
            }
        }
        Ok(Settled {
            grants,
            fleet_size,
            warming_up: settings.warming_up,
            commands,
            contended: pending.len() as u64,
        })
    }
}

fn key(bucket: u64) -> String {
    format!("{BUCKET_PREFIX}{bucket:016x}")
}
