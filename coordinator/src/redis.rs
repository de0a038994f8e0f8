//! Global buckets in Redis, shared by every `sluice serve` replica that uses the same
//! Redis.
//!
//! Each bucket is one key (`sluice:quota:{GG}:b:<hex id>`) holding its state in 41 bytes
//! ([`BucketState::encode`]) and its creator ([`value`]); the arithmetic stays in Rust (the core's `settle`), and
//! Redis only makes the update atomic: a batch reads its buckets, settles them, and writes
//! each back only if it still holds what was read (compare-and-set). A bucket another
//! replica changed in between is settled again from what the script says it now holds.
//!
//! **Groups.** A bucket's key carries a hash tag, `{GG}`, one of [`GROUPS`](keys::GROUPS) taken from its
//! id, so the buckets of one group share a Redis Cluster hash slot. A batch reads each
//! group's buckets with one `MGET` and writes them with one call of a compare-and-set
//! script over that group's keys (all pipelined): every command stays within one hash
//! slot, so the same commands work on a Redis Cluster, where [`link`] sends them as one
//! pipeline per slot (`redis+cluster://` seed nodes, [`RedisTarget`]), and 10,000 buckets
//! cost a few hundred commands instead of 20,000. (One `GET` and one script call per bucket kept one
//! Redis core saturated at 20 proxies × 10,000 buckets: 192,000 commands a second and a
//! sync p99 of 267 ms.)
//!
//! **Group commit.** Syncs are not sent to Redis one by one: one task per replica settles
//! them in batches ([`batcher`], two round trips a batch), every sync that arrived while
//! the previous batch was at Redis. A
//! bucket is read and written once per batch however many of the batch's proxies report
//! it, so Redis's work per second is bounded by the buckets (two commands each per batch),
//! not by proxies × buckets, and the replica's own syncs never race each other for a key.
//! A busier fleet makes batches larger rather than Redis slower.
//!
//! **Bounds.** The same bounds as in memory ([`Bounds`](crate::guard::Bounds)): a bucket new to Redis is kept
//! only while Redis holds fewer than `max_buckets` buckets in all and fewer than
//! `max_buckets_per_proxy` created by the sync's proxy id; past either it is granted
//! nothing and not written. Sorted sets count them ([`sets`]): all of them, and those each
//! proxy created (kept while that proxy keeps settling them; a bucket's value names its
//! creator, [`value`]). Members whose key has expired (up to [`RECORD_SLACK_MS`] before)
//! are dropped before counting, so idle buckets free room as their keys expire. Replicas
//! count at once without a lock, so each may overshoot a bound by the new buckets of one
//! batch.
//!
//! **Work per sync follows change.** A batch's commands are its buckets' reads and
//! compare-and-sets (two per hash-tag group touched), the fleet's few, and sorted-set
//! updates only for buckets whose members no longer cover their keys (once per
//! [`RECORD_SLACK_MS`] for a busy bucket). A proxy reports only buckets it used, so an
//! idle bucket costs nothing. (Refreshing every bucket's members in every batch, in its
//! set and in each naming proxy's, was a third of Redis's command time at 100 proxies in
//! `cargo xtask bench --only fleet-scale --quick`, 105 to 154 µs per `ZADD`, and grew with
//! proxies × buckets per batch: 20 proxies × 10,000 buckets had a sync p99 of 450 ms.)
//!
//! The clock is Redis's (`TIME`), so replicas agree on time. The fleet is a sorted set of
//! proxies by last sync; the coordinator's *epoch* (when Redis's state began) is a key set
//! only if missing: if Redis lost its data, the epoch is new and the coordinator warms up.

mod batcher;
mod keys;
mod link;
mod sets;
mod value;

use std::collections::HashMap;

use batcher::{Batcher, COMPARE_AND_SET, Job, MAX_ROUNDS, Swap};
pub use batcher::{Settled, SyncJob};
use keys::{EPOCH_KEY, FLEET_KEY, by_group, key, mget};
use redis::{ErrorKind, RedisError, RedisResult, Script};
use sluice_core::global::coordinator::BucketState;
use sluice_core::time::Nanos;
use tokio::sync::{mpsc, oneshot};

use link::{Batch, Link, nanos, read};
pub use link::{CLUSTER_SCHEME, RedisTarget};
pub use sets::RECORD_SLACK_MS;
use sets::{BUCKETS_KEY, member};
use value::Stored;

/// Syncs waiting for a batch at most; more wait in their handlers.
const QUEUE: usize = 1_024;

#[derive(Clone)]
pub struct RedisBuckets {
    connection: Link,
    batches: mpsc::Sender<Job>,
    compare_and_set: Script,
    /// Charges of this replica that share a bucket take turns (a lock per stripe of
    /// bucket ids), so only other replicas' writes can make a compare-and-set fail.
    stripes: std::sync::Arc<Vec<tokio::sync::Mutex<()>>>,
}

/// Lock stripes of [`RedisBuckets::charge`].
const STRIPES: u64 = 256;

impl std::fmt::Debug for RedisBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuckets").finish_non_exhaustive()
    }
}

/// What one charge of the rate limit service got from Redis.
#[derive(Debug, PartialEq, Eq)]
pub enum Charged<T> {
    /// Decided, and every bucket written.
    Done(T),
    /// Other replicas kept changing the buckets; nothing was taken.
    Contended,
    /// The request needs buckets new to Redis and Redis holds its most buckets
    /// (`--quota-max-buckets`); nothing was taken.
    Full,
}

impl RedisBuckets {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`, or a Redis Cluster's seed nodes as
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`, see [`RedisTarget`]) and starts this
    /// replica's batcher. Fails when Redis does not answer, so `sluice serve --redis`
    /// stops at start-up rather than serving without it.
    pub async fn connect(url: &str) -> RedisResult<Self> {
        let connection = Link::connect(&RedisTarget::parse(url)?).await?;
        let (batches, queue) = mpsc::channel(QUEUE);
        tokio::spawn(Batcher::new(connection.clone()).run(queue));
        Ok(Self {
            connection,
            batches,
            compare_and_set: Script::new(COMPARE_AND_SET),
            stripes: std::sync::Arc::new(
                (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            ),
        })
    }

    /// One request of Envoy's rate limit service: reads the buckets `ids` (one pipeline:
    /// `TIME`, then an `MGET` per hash-tag group), lets `decide` choose their new
    /// theoretical arrival times at Redis's `now`, and writes those with the
    /// compare-and-set script per group (one pipeline). Charges of this replica that share
    /// a bucket take turns; when another replica changed a group in between, the groups
    /// written are given back (their tokens refunded, as the GCRA does when it undoes a
    /// charge) and the whole request is decided again, at most [`RLS_ROUNDS`] times;
    /// `Ok(None)` then. No bucket is written unless every
    /// bucket of the request was, so a denied or abandoned request consumes nothing.
    pub async fn charge<T>(
        &self,
        ids: &[u64],
        max_buckets: usize,
        decide: impl Fn(Nanos, &[Nanos]) -> (T, Vec<(u64, Nanos)>),
    ) -> RedisResult<Charged<T>> {
        let mut con = self.connection.clone();
        // In ascending order, so two charges never wait for each other's stripes.
        let mut stripes: Vec<usize> = ids.iter().map(|id| (id % STRIPES) as usize).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut turns = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            turns.push(self.stripes[stripe].lock().await);
        }
        for _ in 0..RLS_ROUNDS {
            let (now, olds, held) = read_buckets_held(&mut con, ids).await?;
            let stored: Vec<Stored> = olds
                .iter()
                .map(|old| old.as_deref().map(Stored::decode).unwrap_or_default())
                .collect();
            let states: Vec<BucketState> =
                stored.iter().map(|s| s.state.unwrap_or_default()).collect();
            let tats: Vec<Nanos> = states.iter().map(|s| Nanos::new(s.tat)).collect();
            let (answer, writes) = decide(Nanos::new(now), &tats);
            if writes.is_empty() {
                return Ok(Charged::Done(answer));
            }
            // New buckets count against the same bound as the fleet's syncs' buckets.
            let new = writes
                .iter()
                .filter(|(id, _)| {
                    ids.iter()
                        .position(|x| x == id)
                        .is_some_and(|i| olds[i].is_none())
                })
                .count();
            if new > 0 && held as usize + new > max_buckets {
                return Ok(Charged::Full);
            }
            let mut planned: Vec<Planned> = Vec::new();
            for (id, tat) in &writes {
                let Some(i) = ids.iter().position(|x| x == id) else {
                    continue;
                };
                let mut state = states[i];
                state.tat = tat.get();
                planned.push(Planned {
                    id: *id,
                    old: olds[i].clone(),
                    state,
                    // A sync's bucket stays its creator's.
                    creator: stored[i].creator.clone(),
                    keep_ms: tat.get().saturating_sub(now) / 1_000_000 + RLS_KEEP_MS,
                });
            }
            let written = self
                .compare_and_set_all(&mut con, &planned, Some(now / 1_000_000))
                .await?;
            if written.iter().all(|ok| *ok) {
                return Ok(Charged::Done(answer));
            }
            // Give back what this round wrote, then decide again.
            for (write, ok) in planned.iter().zip(written) {
                if ok {
                    let before = write
                        .old
                        .as_deref()
                        .and_then(|old| Stored::decode(old).state)
                        .map_or(0, |s| s.tat);
                    let backlog_ns = write.state.tat.saturating_sub(before.max(now));
                    self.refund(&mut con, write.id, backlog_ns).await?;
                }
            }
        }
        Ok(Charged::Contended)
    }

    /// Writes each planned bucket if it still holds what was read; says which were
    /// written. With `counted_at_ms` (Redis's clock), also records them in [`BUCKETS_KEY`]
    /// until their keys expire (never lowering a score: `GT`), dropping the members
    /// expired by then, in the same pipeline (a bucket not written is recorded anyway and
    /// dropped when its time comes: an overcount, never an undercount).
    async fn compare_and_set_all(
        &self,
        con: &mut Link,
        planned: &[Planned],
        counted_at_ms: Option<u64>,
    ) -> RedisResult<Vec<bool>> {
        let ids: Vec<u64> = planned.iter().map(|p| p.id).collect();
        let groups = by_group(&ids);
        let mut write = Batch::default();
        for members in groups.values() {
            let writes: Vec<&Planned> = members
                .iter()
                .filter_map(|id| planned.iter().find(|p| p.id == *id))
                .collect();
            let keys: Vec<String> = writes.iter().map(|w| key(w.id)).collect();
            let invocation = write.script(&self.compare_and_set, &keys);
            for w in writes {
                invocation
                    .arg(w.old.clone().unwrap_or_default())
                    .arg(value::encode(&w.state, w.creator.as_deref()))
                    .arg(w.keep_ms);
            }
        }
        if let Some(now_ms) = counted_at_ms {
            write
                .on(BUCKETS_KEY, "ZREMRANGEBYSCORE")
                .arg(BUCKETS_KEY)
                .arg("-inf")
                .arg(now_ms);
            let record = write.on(BUCKETS_KEY, "ZADD").arg(BUCKETS_KEY).arg("GT");
            for p in planned {
                record.arg(now_ms + p.keep_ms).arg(member(p.id));
            }
        }
        let replies = con.send(&write, &[&self.compare_and_set]).await?;
        let mut written: HashMap<u64, bool> = HashMap::new();
        for (members, reply) in groups.values().zip(replies) {
            for (id, swap) in members.iter().zip(Swap::read_all(reply)?) {
                written.insert(*id, swap == Swap::Written);
            }
        }
        Ok(ids
            .iter()
            .map(|id| written.get(id).copied().unwrap_or(false))
            .collect())
    }

    /// Gives `backlog_ns` of a bucket's backlog back (never beyond full), retrying on
    /// another writer's change at most [`MAX_ROUNDS`] times: a refund that cannot be
    /// written leaves the bucket charged, which errs toward admitting less.
    async fn refund(&self, con: &mut Link, id: u64, backlog_ns: u64) -> RedisResult<()> {
        for _ in 0..MAX_ROUNDS {
            let (now, olds) = read_buckets(con, &[id]).await?;
            let Some(old) = olds.into_iter().next().flatten() else {
                return Ok(());
            };
            let Stored {
                state: Some(mut state),
                creator,
            } = Stored::decode(&old)
            else {
                return Ok(());
            };
            state.tat = state.tat.saturating_sub(backlog_ns).max(now.min(state.tat));
            let write = Planned {
                id,
                old: Some(old),
                keep_ms: state.tat.saturating_sub(now) / 1_000_000 + RLS_KEEP_MS,
                state,
                creator,
            };
            let written = self.compare_and_set_all(con, &[write], None).await?;
            if written.first().copied().unwrap_or(false) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Every proxy in the fleet's sorted set and when its last sync was answered (Unix
    /// milliseconds, Redis's clock).
    pub async fn fleet(&self) -> RedisResult<Vec<(String, i64)>> {
        let mut con = self.connection.clone();
        let mut range = Batch::default();
        range
            .on(FLEET_KEY, "ZRANGE")
            .arg(FLEET_KEY)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        let mut replies = con.send(&range, &[]).await?;
        read(replies.pop().unwrap_or(redis::Value::Nil))
    }

    /// Settles one proxy's sync in the next batch.
    pub async fn settle(&self, sync: SyncJob) -> RedisResult<Settled> {
        let (answer, settled) = oneshot::channel();
        let stopped = || RedisError::from((ErrorKind::Client, "the Redis batcher stopped"));
        self.batches
            .send(Job { sync, answer })
            .await
            .map_err(|_| stopped())?;
        settled.await.map_err(|_| stopped())?
    }
}

/// A bucket a charge writes if it still holds what was read.
#[derive(Debug)]
struct Planned {
    id: u64,
    /// What was read (`None`: missing).
    old: Option<Vec<u8>>,
    state: BucketState,
    creator: Option<String>,
    keep_ms: u64,
}

/// Rounds of one rate limit service charge that other replicas' writes can cost.
const RLS_ROUNDS: usize = 10;

/// How long a bucket of Envoy's rate limit service is kept after it is full again: after
/// that, a missing key is the same full bucket.
const RLS_KEEP_MS: u64 = 1_000;

/// Redis's clock (ns) and the bytes of each of `ids` (`None`: missing), in one pipeline.
async fn read_buckets(con: &mut Link, ids: &[u64]) -> RedisResult<(u64, Vec<Option<Vec<u8>>>)> {
    read_buckets_held(con, ids)
        .await
        .map(|(now, olds, _)| (now, olds))
}

/// [`read_buckets`], and how many buckets [`BUCKETS_KEY`] counts (in the same pipeline:
/// members whose keys expired since the last prune still count, which errs toward fewer
/// new buckets).
async fn read_buckets_held(
    con: &mut Link,
    ids: &[u64],
) -> RedisResult<(u64, Vec<Option<Vec<u8>>>, u64)> {
    let groups = by_group(ids);
    let mut batch = Batch::default();
    batch.on(EPOCH_KEY, "TIME");
    for members in groups.values() {
        mget(&mut batch, members);
    }
    batch.on(BUCKETS_KEY, "ZCARD").arg(BUCKETS_KEY);
    let mut replies = con.send(&batch, &[]).await?;
    let held: u64 = match replies.pop() {
        Some(reply) => read(reply)?,
        None => 0,
    };
    let rest = replies.split_off(1);
    let now = nanos(replies.remove(0))?;
    let mut found: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
    for (members, reply) in groups.values().zip(rest) {
        let values: Vec<Option<Vec<u8>>> = read(reply)?;
        for (id, value) in members.iter().zip(values) {
            found.insert(*id, value);
        }
    }
    Ok((
        now,
        ids.iter().map(|id| found.remove(id).flatten()).collect(),
        held,
    ))
}
