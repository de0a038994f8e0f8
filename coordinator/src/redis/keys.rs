//! Where the coordinator's state lives in Redis: the bucket keys, grouped by hash tag,
//! and the keys of the fleet and the epoch.

use super::link::Batch;

pub(crate) const FLEET_KEY: &str = "sluice:quota:fleet";
/// Named after the bucket keys' layout: a Redis holding only an older layout's buckets has
/// no epoch under this name, so the coordinator warms up as after a loss of state instead
/// of starting every bucket full while leases granted from the old keys are spent.
pub(crate) const EPOCH_KEY: &str = "sluice:quota:epoch:2";
/// Hash-tag groups of bucket keys: enough to spread over a Cluster's nodes, few enough
/// that a batch of thousands of buckets is a few hundred commands.
pub(crate) const GROUPS: u64 = 256;
/// A bucket's key: its group's hash tag, then its id.
pub(crate) fn key(bucket: u64) -> String {
    format!("sluice:quota:{{{:02x}}}:b:{bucket:016x}", bucket % GROUPS)
}

/// Adds to `batch` an `MGET` of `ids`' keys (all of one group).
pub(crate) fn mget(batch: &mut Batch, ids: &[u64]) {
    let keys: Vec<String> = ids.iter().map(|id| key(*id)).collect();
    if let Some(first) = keys.first() {
        batch.on(first, "MGET").arg(&keys);
    }
}

/// Buckets by group, each group's in the order given (so the batch's order is kept within
/// a group); groups in ascending order, so a batch's commands do not depend on hashing.
pub(crate) fn by_group(buckets: &[u64]) -> std::collections::BTreeMap<u64, Vec<u64>> {
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
