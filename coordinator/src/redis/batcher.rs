//! The task that settles one replica's syncs in batches (see [`super`]'s *Group commit*).
//!
//! **Two round trips a batch.** The first pipeline carries Redis's clock (`TIME`), the
//! fleet's sorted set and the reads of every bucket of the batch (an `MGET` per hash-tag
//! group); the second the compare-and-set of every bucket settled, the sorted-set
//! records of those buckets and their count. The fleet's scores in the first pipeline are
//! stamped with the clock the previous batch read, run on by this machine's monotonic
//! clock ([`Clock`]): a few milliseconds' error in a score that is compared in seconds,
//! where waiting for `TIME` first would cost a round trip. A bucket another replica
//! changed between the read and the write comes back from the compare-and-set with its
//! current value, so it is settled again without another read (at most [`MAX_ROUNDS`]
//! writes in all). New buckets add one round trip, to count the buckets Redis holds
//! before they are kept.

use std::collections::HashMap;
use std::time::Instant;

use redis::{ErrorKind, RedisError, RedisResult, Script, Value};
use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{Grant, Settings, Usage, settle};
use sluice_core::time::Nanos;
use tokio::sync::{mpsc, oneshot};

use super::keys::{EPOCH_KEY, FLEET_KEY, by_group, key, mget};
use super::link::{Batch, Link, nanos, read};
use super::sets::{Admission, Bound, Records, Written};
use super::value::{self, Stored};
use crate::guard::Bounds;
use crate::memory::{NOT_KEPT, NotKept};

/// Rounds of writing buckets that another replica changed during one batch.
pub(super) const MAX_ROUNDS: usize = 5;
/// A proxy unseen for this long leaves the fleet's sorted set.
const FLEET_FORGET_MS: u64 = 600_000;
/// Bucket usages in one batch at most (each sync joins whole): bounds a batch's pipelines
/// and memory, and so how long the syncs behind it wait.
const MAX_BATCH_USAGES: usize = 200_000;
/// Keys of one compare-and-set call at most: bounds how long one script holds Redis (and
/// the stack its `MGET` unpacks onto) whatever the batch.
const MAX_KEYS_PER_CALL: usize = 256;

/// For each key `KEYS[i]` (all in one hash slot): writes `ARGV[3i-1]` (expiring in
/// `ARGV[3i]` ms) if the key still holds `ARGV[3i-2]` (`""`: missing). Returns, per key,
/// 1 when written, and otherwise what the key holds now (0: missing), so that a writer
/// that lost a race settles the bucket again without reading it. One `MGET` reads every
/// key; a `GET` per key cost about the same in `cargo xtask bench --only fleet-scale`
/// (Redis's time here goes to the per-key work, not the calls: docs/global-limits.md,
/// "Sizing").
pub(super) const COMPARE_AND_SET: &str = r"
local current = redis.call('MGET', unpack(KEYS))
local answer = {}
for i, key in ipairs(KEYS) do
  local now = current[i]
  local expected = ARGV[3 * i - 2]
  if (now == false and expected == '') or now == expected then
    redis.call('SET', key, ARGV[3 * i - 1], 'PX', ARGV[3 * i])
    answer[i] = 1
  elseif now == false then
    answer[i] = 0
  else
    answer[i] = now
  end
end
return answer
";

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
pub(super) struct Job {
    pub sync: SyncJob,
    pub answer: oneshot::Sender<RedisResult<Settled>>,
}

/// What [`COMPARE_AND_SET`] says of one key.
#[derive(Debug, PartialEq)]
pub(super) enum Swap {
    Written,
    /// Another writer changed it: what it holds now (`None`: missing).
    Lost(Option<Vec<u8>>),
}

impl Swap {
    /// One script reply: a [`Swap`] per key, in order.
    pub fn read_all(reply: Value) -> RedisResult<Vec<Swap>> {
        let items: Vec<Value> = read(reply)?;
        items
            .into_iter()
            .map(|item| match item {
                Value::Int(1) => Ok(Swap::Written),
                Value::Int(0) | Value::Nil => Ok(Swap::Lost(None)),
                other => read::<Vec<u8>>(other).map(|now| Swap::Lost(Some(now))),
            })
            .collect()
    }
}

/// Redis's clock as this replica last read it, run on by the monotonic clock.
#[derive(Debug, Default)]
struct Clock {
    read: Option<(u64, Instant)>,
}

impl Clock {
    /// Redis's time now, as far as this replica can tell without asking (`None` before
    /// the first reading).
    fn estimate(&self) -> Option<u64> {
        let (redis_ns, at) = self.read?;
        Some(redis_ns.saturating_add(u64::try_from(at.elapsed().as_nanos()).unwrap_or(0)))
    }

    fn set(&mut self, redis_ns: u64) {
        self.read = Some((redis_ns, Instant::now()));
    }
}

/// The task that settles this replica's syncs in batches.
pub(super) struct Batcher {
    connection: Link,
    compare_and_set: Script,
    /// What this replica last wrote of each bucket's sorted-set members.
    records: Records,
    clock: Clock,
}

/// One bucket of a batch's write: where its usages go, and what it becomes.
struct Planned {
    id: u64,
    settled: Vec<(usize, usize, Grant)>,
    written: Written,
}

impl Batcher {
    pub fn new(connection: Link) -> Batcher {
        Batcher {
            connection,
            compare_and_set: Script::new(COMPARE_AND_SET),
            records: Records::default(),
            clock: Clock::default(),
        }
    }

    pub async fn run(mut self, mut queue: mpsc::Receiver<Job>) {
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

    /// Settles a batch of syncs: each bucket read once and written once (again only
    /// when another replica changed it in between), its usages settled in the order the
    /// syncs arrived.
    async fn settle_batch(&mut self, syncs: &[SyncJob]) -> RedisResult<Vec<Settled>> {
        let mut con = self.connection.clone();
        let mut commands = 0;
        let stamp_ns = match self.clock.estimate() {
            Some(estimate) => estimate,
            None => {
                // The first batch: on a cluster, the epoch key's master answers, one clock
                // for every replica.
                let mut clock = Batch::default();
                clock.on(EPOCH_KEY, "TIME");
                commands += 1;
                nanos(con.send(&clock, &[]).await?.remove(0))?
            }
        };
        let stamp_ms = stamp_ns / 1_000_000;

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

        // The first round trip: the clock, the fleet, and every bucket's bytes.
        let mut first = Batch::default();
        first.on(EPOCH_KEY, "TIME");
        first
            .on(EPOCH_KEY, "SET")
            .arg(EPOCH_KEY)
            .arg(stamp_ns)
            .arg("NX")
            .arg("GET");
        let zadd = first.on(FLEET_KEY, "ZADD").arg(FLEET_KEY);
        for sync in syncs {
            zadd.arg(stamp_ms).arg(&sync.proxy);
        }
        first
            .on(FLEET_KEY, "ZREMRANGEBYSCORE")
            .arg(FLEET_KEY)
            .arg("-inf")
            .arg(stamp_ms.saturating_sub(FLEET_FORGET_MS));
        for sync in syncs {
            first
                .on(FLEET_KEY, "ZCOUNT")
                .arg(FLEET_KEY)
                .arg(stamp_ms.saturating_sub(sync.fleet_memory_ns / 1_000_000))
                .arg("+inf");
        }
        let groups = by_group(&order);
        for ids in groups.values() {
            mget(&mut first, ids);
        }
        commands += 4 + syncs.len() as u64 + groups.len() as u64;
        let mut replies = con.send(&first, &[]).await?.into_iter();
        let mut next = || {
            replies
                .next()
                .ok_or_else(|| RedisError::from((ErrorKind::Client, "a reply went missing")))
        };
        let now = nanos(next()?)?;
        self.clock.set(now);
        let now_ms = now / 1_000_000;
        let epoch: Option<u64> = read(next()?)?;
        next()?; // the fleet's ZADD
        next()?; // and its prune
        let fleet_sizes = syncs
            .iter()
            .map(|_| read::<u64>(next()?))
            .collect::<RedisResult<Vec<u64>>>()?;
        // What each bucket holds, as far as this batch knows (`None`: missing).
        let mut current: HashMap<u64, Option<Vec<u8>>> = HashMap::with_capacity(order.len());
        for ids in groups.values() {
            let values: Vec<Option<Vec<u8>>> = read(next()?)?;
            current.extend(ids.iter().copied().zip(values));
        }

        let epoch = epoch.unwrap_or(stamp_ns);
        self.records.begin(epoch, now_ms);
        let settings: Vec<Settings> = syncs
            .iter()
            .zip(&fleet_sizes)
            .map(|(sync, &fleet)| Settings {
                warming_up: now < epoch.saturating_add(sync.lease_ttl_ns),
                fleet_size: u32::try_from(fleet).unwrap_or(u32::MAX).max(1),
                ..sync.settings
            })
            .collect();

        let mut grants: Vec<Vec<Grant>> = syncs
            .iter()
            .map(|sync| vec![Grant::default(); sync.buckets.len()])
            .collect();
        let mut not_kept = vec![NotKept::default(); syncs.len()];
        let mut admission = Admission::default();
        // Which proxy of the batch named which bucket, for the creators' sets.
        let named: Vec<(&str, u64)> = syncs
            .iter()
            .flat_map(|sync| {
                sync.buckets
                    .iter()
                    .map(|(id, _, _)| (sync.proxy.as_str(), *id))
            })
            .collect();
        let mut held = None;
        let mut pending = order;
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            // Buckets Redis does not hold: kept only within the bounds.
            let missing: Vec<u64> = pending
                .iter()
                .filter(|id| current[*id].is_none() && !admission.decided(**id))
                .copied()
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

            pending.retain(|id| !admission.refused.contains_key(id));
            if pending.is_empty() {
                break;
            }

            // Settle every pending bucket from what it holds, and write it if it still
            // holds that. A node that lost its scripts (restarted, or a replica just
            // promoted) answers NOSCRIPT, and those calls are sent again behind a
            // SCRIPT LOAD.
            let mut write = Batch::default();
            let mut calls: Vec<Vec<Planned>> = Vec::new();
            for ids in by_group(&pending).values() {
                for chunk in ids.chunks(MAX_KEYS_PER_CALL) {
                    let keys: Vec<String> = chunk.iter().map(|id| key(*id)).collect();
                    let invocation = write.script(&self.compare_and_set, &keys);
                    let mut planned = Vec::with_capacity(chunk.len());
                    for id in chunk {
                        let old = current[id].as_deref();
                        // Missing, or written in another layout: a full, quiet bucket.
                        let stored = old.map(Stored::decode);
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
                            // Kept while the bucket refills and its demand is remembered;
                            // after that a missing key is the same as a full, quiet bucket.
                            keep_ns = grant.full_in_ns + 10 * settings[s].demand_tau_ns;
                            settled.push((s, b, grant));
                        }
                        let keep_ms = keep_ns / 1_000_000 + 1;
                        invocation
                            .arg(old.unwrap_or_default())
                            .arg(value::encode(&state, creator.as_deref()))
                            .arg(keep_ms);
                        planned.push(Planned {
                            id: *id,
                            settled,
                            written: Written {
                                until_ms: now_ms + keep_ms,
                                creator,
                            },
                        });
                    }
                    calls.push(planned);
                }
            }
            // Recorded in the sorted sets with the writes: a bucket whose write is lost is
            // counted until its score passes, an overcount that errs toward fewer new
            // buckets, never an undercount.
            let writes: HashMap<u64, &Written> =
                calls.iter().flatten().map(|p| (p.id, &p.written)).collect();
            commands += calls.len() as u64
                + admission.record(&mut write, &mut self.records, &named, &writes);
            let mut replies = con.send(&write, &[&self.compare_and_set]).await?;
            // The buckets' count is the last reply; the scripts' come first.
            held = Some(read::<u64>(replies.pop().unwrap_or(Value::Nil))?);
            pending = Vec::new();
            for (planned, reply) in calls.into_iter().zip(replies) {
                for (bucket, swap) in planned.into_iter().zip(Swap::read_all(reply)?) {
                    match swap {
                        Swap::Written => {
                            for (s, b, grant) in bucket.settled {
                                grants[s][b] = grant;
                            }
                        }
                        Swap::Lost(now_holds) => {
                            current.insert(bucket.id, now_holds);
                            pending.push(bucket.id);
                        }
                    }
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compare_and_set_reply_says_written_or_what_the_key_holds() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::BulkString(b"other".to_vec()),
        ]);
        assert_eq!(
            Swap::read_all(reply).unwrap(),
            [
                Swap::Written,
                Swap::Lost(None),
                Swap::Lost(Some(b"other".to_vec()))
            ]
        );
    }

    /// The script against a real Redis: a key that still holds what was read is written
    /// (with its expiry), a missing key expected missing is created, and the others are
    /// left alone and come back as they are now.
    #[tokio::test]
    async fn the_compare_and_set_writes_only_unchanged_keys_and_returns_the_others() {
        if !sluice_harness::redis_available() {
            return;
        }
        let redis = sluice_harness::RedisServer::start();
        let target = super::super::link::RedisTarget::parse(&redis.url()).unwrap();
        let mut con = Link::connect(&target).await.unwrap();
        // One group: one hash slot, as the batcher sends them.
        let keys: Vec<String> = (0..4)
            .map(|i| key(7 + i * super::super::keys::GROUPS))
            .collect();
        let mut setup = Batch::default();
        setup.on(&keys[0], "SET").arg(&keys[0]).arg("a");
        setup.on(&keys[1], "SET").arg(&keys[1]).arg("b");
        con.send(&setup, &[]).await.unwrap();

        let script = Script::new(COMPARE_AND_SET);
        let mut write = Batch::default();
        write
            .script(&script, &keys)
            .arg("a") // still holds it: written
            .arg("a2")
            .arg(60_000)
            .arg("stale") // changed since: left as it is
            .arg("b2")
            .arg(60_000)
            .arg("") // expected missing and is: created
            .arg("c")
            .arg(60_000)
            .arg("gone") // expected to hold something and is missing: left missing
            .arg("d")
            .arg(60_000);
        let reply = con.send(&write, &[&script]).await.unwrap().remove(0);
        assert_eq!(
            Swap::read_all(reply).unwrap(),
            [
                Swap::Written,
                Swap::Lost(Some(b"b".to_vec())),
                Swap::Written,
                Swap::Lost(None)
            ]
        );
        let mut check = Batch::default();
        check.on(&keys[0], "MGET").arg(&keys);
        check.on(&keys[0], "PTTL").arg(&keys[0]);
        let mut replies = con.send(&check, &[]).await.unwrap().into_iter();
        let values: Vec<Option<String>> = read(replies.next().unwrap()).unwrap();
        assert_eq!(
            values,
            [Some("a2".into()), Some("b".into()), Some("c".into()), None]
        );
        let ttl_ms: i64 = read(replies.next().unwrap()).unwrap();
        assert!((1..=60_000).contains(&ttl_ms), "expires: {ttl_ms} ms");
    }

    #[test]
    fn the_clock_runs_on_from_redis_last_reading() {
        let mut clock = Clock::default();
        assert_eq!(clock.estimate(), None, "nothing read yet");
        clock.set(1_000);
        let estimate = clock.estimate().unwrap();
        assert!(estimate >= 1_000, "{estimate}");
    }
}
