//! The sorted sets that count the buckets Redis holds, for the bounds on new buckets:
//! [`BUCKETS_KEY`] every bucket, and `sluice:quota:owner:<proxy id>` those a proxy's syncs
//! created, each member scored by a time (Unix ms, Redis's clock) at or after which its
//! key has expired. Members whose score has passed are dropped before counting.
//!
//! **Refreshed once per slack, not per batch.** A member's score runs [`RECORD_SLACK_MS`]
//! past its key's expiry, and a replica rewrites it only when a write pushes the key's
//! expiry past the score it recorded ([`Records`]), so a bucket that stays busy costs its
//! sets one update per slack, not one per batch (and not one per proxy of the batch that
//! names it, as the owner sets once did). Scores only rise (`ZADD GT`), so a member's
//! score is the highest any writer recorded, at or after the key's expiry: the sets may
//! count a bucket up to the slack after its key expired (fewer new buckets), never miss
//! one whose key lives.

use std::collections::HashMap;

use redis::RedisResult;

use super::link::{Batch, Link, read};
use crate::guard::Bounds;

/// Every bucket held, scored by when its key expires (Unix ms, Redis's clock).
pub(crate) const BUCKETS_KEY: &str = "sluice:quota:buckets";

/// How far a member's score runs past its key's expiry: how long a bucket may be counted
/// after its key expired, and how often a busy bucket's members are rewritten.
pub const RECORD_SLACK_MS: u64 = 5_000;

/// Which bound a new bucket met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    Total,
    PerProxy,
}

/// The new buckets of one batch: which were kept and by whom, and which were not.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// Kept, with the proxy id that created it.
    pub kept: HashMap<u64, String>,
    pub refused: HashMap<u64, Bound>,
}

/// A bucket a batch wrote: when its key expires (Unix ms) and the proxy that created it.
#[derive(Debug)]
pub(crate) struct Written {
    pub until_ms: u64,
    pub creator: Option<String>,
}

/// A creator's members to write in one batch, each `(score, bucket)`: those it created
/// in the batch, and those it created before (written only while still there).
#[derive(Debug, Default)]
struct OwnerWrites {
    new: Vec<(u64, u64)>,
    again: Vec<(u64, u64)>,
}

/// The sorted set of the buckets `proxy` created.
fn owner_key(proxy: &str) -> String {
    format!("sluice:quota:owner:{proxy}")
}

/// A bucket as a member of the sorted sets.
pub(crate) fn member(bucket: u64) -> String {
    format!("{bucket:016x}")
}

impl Admission {
    pub fn decided(&self, id: u64) -> bool {
        self.kept.contains_key(&id) || self.refused.contains_key(&id)
    }

    /// Counts the buckets Redis holds, in all and per creator of `missing` (dropping those
    /// expired by `now_ms`), and decides, in order, which of `missing` are kept. Returns
    /// the commands sent.
    pub async fn decide(
        &mut self,
        con: &mut Link,
        missing: Vec<(u64, String)>,
        now_ms: u64,
        bounds: Bounds,
    ) -> RedisResult<u64> {
        let mut creators: Vec<String> = missing.iter().map(|(_, p)| p.clone()).collect();
        creators.sort_unstable();
        creators.dedup();
        let sets = std::iter::once(BUCKETS_KEY.to_string());
        let mut count = Batch::default();
        for set in sets.chain(creators.iter().map(|p| owner_key(p))) {
            count
                .on(&set, "ZREMRANGEBYSCORE")
                .arg(&set)
                .arg("-inf")
                .arg(now_ms);
            count.on(&set, "ZCARD").arg(&set);
        }
        // Each set's prune, then its count.
        let counts: Vec<u64> = con
            .send(&count, &[])
            .await?
            .into_iter()
            .skip(1)
            .step_by(2)
            .map(read)
            .collect::<RedisResult<_>>()?;
        let mut total = counts[0] as usize + self.kept.len();
        let mut per_proxy: HashMap<String, usize> = HashMap::new();
        for (p, n) in creators.iter().zip(&counts[1..]) {
            let ours = self.kept.values().filter(|c| *c == p).count();
            per_proxy.insert(p.clone(), *n as usize + ours);
        }
        for (id, proxy) in missing {
            let mine = per_proxy.entry(proxy.clone()).or_default();
            if total >= bounds.max_buckets {
                self.refused.insert(id, Bound::Total);
            } else if *mine >= bounds.max_buckets_per_proxy {
                self.refused.insert(id, Bound::PerProxy);
            } else {
                *mine += 1;
                total += 1;
                self.kept.insert(id, proxy);
            }
        }
        Ok(2 * (1 + creators.len() as u64))
    }

    /// Adds to `record` the writes that record `written` (the buckets a batch writes) in
    /// the sorted sets where `records` says their members no longer cover their keys: in
    /// [`BUCKETS_KEY`], and in their creator's set while that proxy names them (`named`:
    /// each proxy of the batch and a bucket it named); then a count of the buckets held,
    /// the last of `record`'s commands. Returns the commands added.
    pub fn record(
        &self,
        record: &mut Batch,
        records: &mut Records,
        named: &[(&str, u64)],
        written: &HashMap<u64, &Written>,
    ) -> u64 {
        let mut commands = 1;
        let all: Vec<(u64, u64)> = written
            .iter()
            .filter_map(|(id, w)| Some((records.all(*id, w.until_ms)?, *id)))
            .collect();
        if !all.is_empty() {
            let add = record.on(BUCKETS_KEY, "ZADD").arg(BUCKETS_KEY).arg("GT");
            for (score, id) in all {
                add.arg(score).arg(member(id));
            }
            commands += 1;
        }
        // Per creator: its members to add (new) and to refresh (XX: only while there).
        let mut owners: HashMap<&str, OwnerWrites> = HashMap::new();
        for &(proxy, id) in named {
            let Some(w) = written.get(&id) else { continue };
            if w.creator.as_deref() != Some(proxy) {
                continue;
            }
            let Some(score) = records.owner(id, w.until_ms) else {
                continue;
            };
            let writes = owners.entry(proxy).or_default();
            if self.kept.get(&id).is_some_and(|c| c == proxy) {
                writes.new.push((score, id));
            } else {
                writes.again.push((score, id));
            }
        }
        for (proxy, OwnerWrites { new, again }) in owners {
            let set = owner_key(proxy);
            for (members, only_there) in [(&new, false), (&again, true)] {
                if members.is_empty() {
                    continue;
                }
                let add = record.on(&set, "ZADD").arg(&set);
                if only_there {
                    add.arg("XX");
                }
                add.arg("GT");
                for (score, id) in members {
                    add.arg(*score).arg(member(*id));
                }
                commands += 1;
            }
            if let Some(last) = new.iter().chain(&again).map(|(score, _)| *score).max() {
                // The set goes when its last bucket would: a proxy that never comes back
                // leaves nothing behind. GT: never sooner than a bucket it holds.
                record.on(&set, "PEXPIREAT").arg(&set).arg(last).arg("GT");
                record.on(&set, "PEXPIREAT").arg(&set).arg(last).arg("NX");
                commands += 2;
            }
        }
        record.on(BUCKETS_KEY, "ZCARD").arg(BUCKETS_KEY);
        commands
    }
}

/// What one replica last wrote of each bucket's members ([`RECORD_SLACK_MS`]), so that
/// it writes them again only when a key outlives them. Bounded by the buckets whose
/// members have not yet passed (pruned at most once a second), so by the buckets Redis
/// holds; forgotten whole when Redis's epoch changes (Redis lost its data, sets included)
/// or a batch fails (its writes may not have happened).
#[derive(Debug, Default)]
pub(crate) struct Records {
    members: HashMap<u64, Recorded>,
    epoch: Option<u64>,
    pruned_at_ms: u64,
}

/// The scores a replica wrote for one bucket (0: none).
#[derive(Debug, Default, Clone, Copy)]
struct Recorded {
    all_ms: u64,
    owner_ms: u64,
}

/// How often [`Records`] drops members whose scores have passed.
const PRUNE_EVERY_MS: u64 = 1_000;

impl Records {
    /// Starts a batch at `now_ms` in Redis's `epoch`.
    pub fn begin(&mut self, epoch: u64, now_ms: u64) {
        if self.epoch != Some(epoch) {
            self.clear();
            self.epoch = Some(epoch);
        }
        if now_ms >= self.pruned_at_ms.saturating_add(PRUNE_EVERY_MS) {
            self.members
                .retain(|_, r| r.all_ms > now_ms || r.owner_ms > now_ms);
            self.pruned_at_ms = now_ms;
        }
    }

    pub fn clear(&mut self) {
        self.members.clear();
        self.epoch = None;
    }

    /// The score to write for `id` in the set of all buckets now that its key lives
    /// until `until_ms`, or `None` when the score recorded still covers that.
    pub fn all(&mut self, id: u64, until_ms: u64) -> Option<u64> {
        let recorded = &mut self.members.entry(id).or_default().all_ms;
        refresh(recorded, until_ms)
    }

    /// [`Records::all`] for `id` in its creator's set.
    pub fn owner(&mut self, id: u64, until_ms: u64) -> Option<u64> {
        let recorded = &mut self.members.entry(id).or_default().owner_ms;
        refresh(recorded, until_ms)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.members.len()
    }
}

fn refresh(recorded: &mut u64, until_ms: u64) -> Option<u64> {
    if until_ms <= *recorded {
        return None;
    }
    *recorded = until_ms.saturating_add(RECORD_SLACK_MS);
    Some(*recorded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_rewritten_only_when_its_key_outlives_it() {
        let mut records = Records::default();
        records.begin(1, 0);
        assert_eq!(records.all(7, 1_000), Some(1_000 + RECORD_SLACK_MS));
        let covered = 1_000 + RECORD_SLACK_MS;
        assert_eq!(records.all(7, covered), None, "at the score: still covered");
        assert_eq!(
            records.all(7, covered + 1),
            Some(covered + 1 + RECORD_SLACK_MS),
            "one ms past it"
        );
        assert_eq!(records.owner(7, 1_000), Some(1_000 + RECORD_SLACK_MS));
        assert_eq!(records.owner(7, 1_000), None, "each set on its own");
    }

    #[test]
    fn records_are_forgotten_with_redis_data_and_pruned_when_passed() {
        let mut records = Records::default();
        records.begin(1, 0);
        records.all(7, 1_000);
        records.begin(1, 10);
        assert_eq!(records.all(7, 1_000), None, "same epoch: kept");
        records.begin(2, 20);
        assert_eq!(
            records.all(7, 1_000),
            Some(1_000 + RECORD_SLACK_MS),
            "new epoch"
        );

        records.clear();
        records.begin(2, 0);
        records.all(8, 1_000);
        let passed = 1_000 + RECORD_SLACK_MS;
        records.begin(2, passed - 1);
        assert_eq!(records.len(), 1, "not yet passed");
        records.begin(2, passed - 1 + PRUNE_EVERY_MS);
        assert_eq!(records.len(), 0, "passed, and a prune was due");
    }
}
