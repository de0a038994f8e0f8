//! Global buckets in Redis, shared by every `sluice serve` replica that uses the same
//! Redis.
//!
//! Each bucket is one key (`sluice:quota:{GG}:b:<hex id>`) holding its state in 41 bytes
//! ([`BucketState::encode`]) and its creator ([`value`]); the arithmetic stays in Rust (the core's `settle`), and
//! Redis only makes the update atomic: a batch reads its buckets, settles them, and writes
//! each back only if it still holds what was read (compare-and-set). A bucket another
//! replica changed in between is read and settled again.
//!
//! **Groups.** A bucket's key carries a hash tag, `{GG}`, one of [`GROUPS`] taken from its
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
//! them in batches, every sync that arrived while the previous batch was at Redis. A
//! bucket is read and written once per batch however many of the batch's proxies report
//! it, so Redis's work per second is bounded by the buckets (two commands each per batch),
//! not by proxies × buckets, and the replica's own syncs never race each other for a key.
//! A busier fleet makes batches larger rather than Redis slower.
//!
//! **Bounds.** The same bounds as in memory ([`Bounds`]): a bucket new to Redis is kept
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

mod link;
mod sets;
mod value;

use std::collections::HashMap;

use redis::{ErrorKind, RedisError, RedisResult, Script};
use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, Grant, Settings, Usage, settle};
use sluice_core::time::Nanos;
use tokio::sync::{mpsc, oneshot};

use crate::guard::Bounds;
use crate::memory::{NOT_KEPT, NotKept};
use link::{Batch, Link, read};
pub use link::{CLUSTER_SCHEME, RedisTarget};
pub use sets::RECORD_SLACK_MS;
use sets::{Admission, BUCKETS_KEY, Bound, Records, Written, member};
use value::Stored;

const FLEET_KEY: &str = "sluice:quota:fleet";
/// Named after the bucket keys' layout: a Redis holding only an older layout's buckets has
/// no epoch under this name, so the coordinator warms up as after a loss of state instead
/// of starting every bucket full while leases granted from the old keys are spent.
const EPOCH_KEY: &str = "sluice:quota:epoch:2";
/// Hash-tag groups of bucket keys: enough to spread over a Cluster's nodes, few enough
/// that a batch of thousands of buckets is a few hundred commands.
const GROUPS: u64 = 256;
/// Rounds of re-reading buckets that another replica changed during one batch.
const MAX_ROUNDS: usize = 5;
/// A proxy unseen for this long leaves the fleet's sorted set.
const FLEET_FORGET_MS: u64 = 600_000;
/// Bucket usages in one batch at most (each sync joins whole): bounds a batch's pipelines
/// and memory, and so how long the syncs behind it wait.
const MAX_BATCH_USAGES: usize = 200_000;
/// Syncs waiting for a batch at most; more wait in their handlers.
const QUEUE: usize = 1_024;

/// For each key `KEYS[i]` (all in one hash slot): writes `ARGV[3i-1]` (expiring in
/// `ARGV[3i]` ms) if the key still holds `ARGV[3i-2]` (`""`: missing). Returns, per key,
/// 1 when written and 0 when another writer changed it since it was read.
const COMPARE_AND_SET: &str = r"
local written = {}
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  local expected = ARGV[3 * i - 2]
  if (current == false and expected == '') or current == expected then
    redis.call('SET', key, ARGV[3 * i - 1], 'PX', ARGV[3 * i])
    written[i] = 1
  else
    written[i] = 0
  end
end
return written
";

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

/// What one sync got from Redis.
#[derive(Debug)]
pub struct Settled {
    pub grants: Vec<Grant>,
    pub fleet_size: u32,
    pub warming_up: bool,
    /// This sync's part of its batch's Redis commands, for the commands-per-second metric.
    pub commands: u64,
    /// Buckets given up on after [`MAX_ROUNDS`] lost races (granted nothing).
    pub contended: u64,
    /// New buckets of this sync not kept, by the bound they met (granted nothing).
    pub not_kept: NotKept,
    /// Buckets Redis held after the batch, when it was counted.
    pub held: Option<u64>,
}

/// One proxy's sync, as the batcher settles it.
#[derive(Debug)]
pub struct SyncJob {
    pub proxy: String,
    pub buckets: Vec<(u64, Gcra, Usage)>,
    pub covers_ns: u64,
    /// The settings for its interval; fleet size and warm-up come from Redis.
    pub settings: Settings,
    pub lease_ttl_ns: u64,
    pub fleet_memory_ns: u64,
    /// How many buckets Redis may hold, in all and created by one proxy id.
    pub bounds: Bounds,
}

#[derive(Debug)]
struct Job {
    sync: SyncJob,
    answer: oneshot::Sender<RedisResult<Settled>>,
}

impl RedisBuckets {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`, or a Redis Cluster's seed nodes as
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`, see [`RedisTarget`]) and starts this
    /// replica's batcher. Fails when Redis does not answer, so `sluice serve --redis`
    /// stops at start-up rather than serving without it.
    pub async fn connect(url: &str) -> RedisResult<Self> {
        let connection = Link::connect(&RedisTarget::parse(url)?).await?;
        let (batches, queue) = mpsc::channel(QUEUE);
        tokio::spawn(
            Batcher {
                connection: connection.clone(),
                compare_and_set: Script::new(COMPARE_AND_SET),
                records: Records::default(),
            }
            .run(queue),
        );
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
            let reply: Vec<i64> = read(reply)?;
            for (id, ok) in members.iter().zip(reply) {
                written.insert(*id, ok == 1);
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

/// The task that settles this replica's syncs in batches.
struct Batcher {
    connection: Link,
    compare_and_set: Script,
    /// What this replica last wrote of each bucket's sorted-set members.
    records: Records,
}

impl Batcher {
    async fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        while let Some(first) = queue.recv().await {
            let mut usages = first.sync.buckets.len();
            let mut batch = vec![first];
            while usages < MAX_BATCH_USAGES {
                let Ok(job) = queue.try_recv() else { break };
                usages += job.sync.buckets.len();
                batch.push(job);
            }
            let (syncs, answers): (Vec<SyncJob>, Vec<_>) =
                batch.into_iter().map(|job| (job.sync, job.answer)).unzip();
            match self.settle_batch(&syncs).await {
                Ok(settled) => {
                    for (answer, settled) in answers.into_iter().zip(settled) {
                        // The handler may have gone (its client hung up): nothing to do.
                        let _ = answer.send(Ok(settled));
                    }
                }
                Err(e) => {
                    // Which of the batch's writes happened is unknown.
                    self.records.clear();
                    for answer in answers {
                        let _ = answer.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Settles a batch of syncs: each bucket read and written once, its usages settled in
    /// the order the syncs arrived.
    async fn settle_batch(&mut self, syncs: &[SyncJob]) -> RedisResult<Vec<Settled>> {
        let mut con = self.connection.clone();
        // On a cluster, the epoch key's master answers: one clock for every replica.
        let mut clock = Batch::default();
        clock.on(EPOCH_KEY, "TIME");
        let now = nanos(con.send(&clock, &[]).await?.remove(0))?;
        let now_ms = now / 1_000_000;

        let mut fleet = Batch::default();
        fleet
            .on(EPOCH_KEY, "SET")
            .arg(EPOCH_KEY)
            .arg(now)
            .arg("NX")
            .arg("GET");
        let zadd = fleet.on(FLEET_KEY, "ZADD").arg(FLEET_KEY);
        for sync in syncs {
            zadd.arg(now_ms).arg(&sync.proxy);
        }
        fleet
            .on(FLEET_KEY, "ZREMRANGEBYSCORE")
            .arg(FLEET_KEY)
            .arg("-inf")
            .arg(now_ms.saturating_sub(FLEET_FORGET_MS));
        for sync in syncs {
            fleet
                .on(FLEET_KEY, "ZCOUNT")
                .arg(FLEET_KEY)
                .arg(now_ms.saturating_sub(sync.fleet_memory_ns / 1_000_000))
                .arg("+inf");
        }
        let (epoch, fleet_sizes): (Option<u64>, Vec<u64>) = {
            let mut replies = con.send(&fleet, &[]).await?;
            // The sizes follow the epoch, the fleet's ZADD and its prune.
            let sizes = replies
                .split_off(3)
                .into_iter()
                .map(read)
                .collect::<RedisResult<Vec<u64>>>()?;
            (read(replies.remove(0))?, sizes)
        };
        let epoch = epoch.unwrap_or(now);
        self.records.begin(epoch, now_ms);
        let mut commands = 4 + syncs.len() as u64;
        let settings: Vec<Settings> = syncs
            .iter()
            .zip(&fleet_sizes)
            .map(|(sync, &fleet)| Settings {
                warming_up: now < epoch.saturating_add(sync.lease_ttl_ns),
                fleet_size: u32::try_from(fleet).unwrap_or(u32::MAX).max(1),
                ..sync.settings
            })
            .collect();

        // Every bucket of the batch, once, with its usages in arrival order.
        let mut order: Vec<u64> = Vec::new();
        let mut usages: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
        for (s, sync) in syncs.iter().enumerate() {
            for (b, (id, _, _)) in sync.buckets.iter().enumerate() {
                usages
                    .entry(*id)
                    .or_insert_with(|| {
                        order.push(*id);
                        Vec::new()
                    })
                    .push((s, b));
            }
        }

        let mut grants: Vec<Vec<Grant>> = syncs
            .iter()
            .map(|sync| vec![Grant::default(); sync.buckets.len()])
            .collect();
        let mut pending = order;
        let mut admission = Admission::default();
        let mut not_kept = vec![NotKept::default(); syncs.len()];
        let mut written: HashMap<u64, Written> = HashMap::new();
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let groups = by_group(&pending);
            let mut reads = Batch::default();
            for ids in groups.values() {
                mget(&mut reads, ids);
            }
            let replies: Vec<Vec<Option<Vec<u8>>>> = con
                .send(&reads, &[])
                .await?
                .into_iter()
                .map(read)
                .collect::<RedisResult<_>>()?;
            commands += groups.len() as u64;

            // Buckets Redis does not hold: kept only within the bounds.
            let missing: Vec<u64> = groups
                .values()
                .zip(&replies)
                .flat_map(|(ids, olds)| ids.iter().zip(olds))
                .filter(|(id, old)| old.is_none() && !admission.decided(**id))
                .map(|(id, _)| *id)
                .collect();
            if !missing.is_empty() {
                // Created by the first sync of the batch that names it.
                let created: Vec<(u64, String)> = missing
                    .iter()
                    .map(|id| (*id, syncs[usages[id][0].0].proxy.clone()))
                    .collect();
                commands += admission
                    .decide(&mut con, created, now_ms, syncs[0].bounds)
                    .await?;
                for id in &missing {
                    let Some(bound) = admission.refused.get(id) else {
                        continue;
                    };
                    for &(s, b) in &usages[id] {
                        grants[s][b] = NOT_KEPT;
                        match bound {
                            Bound::Total => not_kept[s].max_buckets += 1,
                            Bound::PerProxy => not_kept[s].max_buckets_per_proxy += 1,
                        }
                    }
                }
            }

            // A node that lost its scripts (restarted, or a replica just promoted) answers
            // NOSCRIPT, and those groups are sent again behind a SCRIPT LOAD.
            let mut write = Batch::default();
            let mut planned = Vec::with_capacity(groups.len());
            for (ids, olds) in groups.values().zip(replies) {
                let mut keys = Vec::with_capacity(ids.len());
                let mut argv: Vec<(Vec<u8>, Vec<u8>, u64)> = Vec::with_capacity(ids.len());
                let mut settled_group = Vec::with_capacity(ids.len());
                for (id, old) in ids.iter().zip(olds) {
                    if admission.refused.contains_key(id) {
                        continue;
                    }
                    // Missing, or written in another layout: a full, quiet bucket.
                    let stored = old.as_deref().map(Stored::decode);
                    let mut state = stored.as_ref().and_then(|s| s.state).unwrap_or_default();
                    let creator = match stored {
                        Some(stored) => stored.creator,
                        None => admission.kept.get(id).cloned(),
                    };
                    let mut settled = Vec::new();
                    let mut keep_ns = 0;
                    for &(s, b) in &usages[id] {
                        let sync = &syncs[s];
                        let (_, limit, usage) = &sync.buckets[b];
                        let grant = settle(
                            &mut state,
                            limit,
                            usage,
                            Nanos::new(sync.covers_ns),
                            Nanos::new(now),
                            &settings[s],
                        );
                        // Kept while the bucket refills and its demand is remembered; after
                        // that a missing key is the same as a full, quiet bucket.
                        keep_ns = grant.full_in_ns + 10 * settings[s].demand_tau_ns;
                        settled.push((s, b, grant));
                    }
                    let keep_ms = keep_ns / 1_000_000 + 1;
                    keys.push(key(*id));
                    argv.push((
                        old.unwrap_or_default(),
                        value::encode(&state, creator.as_deref()),
                        keep_ms,
                    ));
                    let until_ms = now_ms + keep_ms;
                    settled_group.push((*id, settled, Written { until_ms, creator }));
                }
                if keys.is_empty() {
                    continue;
                }
                let invocation = write.script(&self.compare_and_set, &keys);
                for (old, new, keep_ms) in argv {
                    invocation.arg(old).arg(new).arg(keep_ms);
                }
                planned.push(settled_group);
            }
            let written_groups: Vec<Vec<i64>> = con
                .send(&write, &[&self.compare_and_set])
                .await?
                .into_iter()
                .map(read)
                .collect::<RedisResult<_>>()?;
            commands += planned.len() as u64;
            pending = Vec::new();
            for (group, replies) in planned.into_iter().zip(written_groups) {
                for ((id, settled, write), ok) in group.into_iter().zip(replies) {
                    if ok == 1 {
                        for (s, b, grant) in settled {
                            grants[s][b] = grant;
                        }
                        written.insert(id, write);
                    } else {
                        pending.push(id);
                    }
                }
            }
        }
        let held = if written.is_empty() {
            None
        } else {
            let named: Vec<(&str, u64)> = syncs
                .iter()
                .flat_map(|sync| {
                    sync.buckets
                        .iter()
                        .map(|(id, _, _)| (sync.proxy.as_str(), *id))
                })
                .collect();
            let (held, sent) = admission
                .record(&mut con, &mut self.records, &named, &written)
                .await?;
            commands += sent;
            Some(held)
        };
        // Buckets still contended are granted nothing; count them per sync.
        let mut contended = vec![0; syncs.len()];
        for id in &pending {
            for &(s, _) in &usages[id] {
                contended[s] += 1;
            }
        }
        let n = syncs.len() as u64;
        Ok(grants
            .into_iter()
            .zip(settings)
            .zip(contended)
            .zip(not_kept)
            .enumerate()
            .map(|(i, (((grants, settings), contended), not_kept))| Settled {
                grants,
                fleet_size: settings.fleet_size,
                warming_up: settings.warming_up,
                // The batch's commands shared out so that they add up.
                commands: commands / n + u64::from((i as u64) < commands % n),
                contended,
                not_kept,
                held,
            })
            .collect())
    }
}

/// An `MGET` of `ids`' keys (all of one group).
fn mget(batch: &mut Batch, ids: &[u64]) {
    let keys: Vec<String> = ids.iter().map(|id| key(*id)).collect();
    if let Some(first) = keys.first() {
        batch.on(first, "MGET").arg(&keys);
    }
}

/// Redis's `TIME` reply in nanoseconds.
fn nanos(reply: redis::Value) -> RedisResult<u64> {
    let (seconds, micros): (u64, u64) = read(reply)?;
    Ok(seconds * 1_000_000_000 + micros * 1_000)
}

/// A bucket's key: its group's hash tag, then its id.
fn key(bucket: u64) -> String {
    format!("sluice:quota:{{{:02x}}}:b:{bucket:016x}", bucket % GROUPS)
}

/// Buckets by group, each group's in the order given (so the batch's order is kept within
/// a group); groups in ascending order, so a batch's commands do not depend on hashing.
fn by_group(buckets: &[u64]) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut groups = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for &id in buckets {
        groups.entry(id % GROUPS).or_default().push(id);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_key_carries_its_groups_hash_tag() {
        assert_eq!(key(0x1234), "sluice:quota:{34}:b:0000000000001234");
        assert_eq!(key(u64::MAX), "sluice:quota:{ff}:b:ffffffffffffffff");
    }

    #[test]
    fn buckets_are_grouped_by_hash_tag_in_the_order_given() {
        let groups = by_group(&[0x201, 0x101, 0x2, 0x301]);
        let listed: Vec<(u64, Vec<u64>)> = groups.into_iter().collect();
        assert_eq!(listed, [(1, vec![0x201, 0x101, 0x301]), (2, vec![0x2])]);
    }
}
