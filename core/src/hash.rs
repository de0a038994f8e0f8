//! Stable hashes for bucket identities and slot placement.
//!
//! Every worker VM runs the same module, and a reloaded VM must find the buckets its
//! predecessor left in shared data, so these hashes use fixed seeds (xxh3), never a
//! per-process random state.

use xxhash_rust::xxh3::Xxh3;

/// Identifies a limit (tier) of a rule inside a slot.
pub fn limit_identity(rule_id: &str, requests: u64, period_seconds: u64, burst: u64) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"limit\0");
    h.update(rule_id.as_bytes());
    h.update(&[0]);
    h.update(&requests.to_le_bytes());
    h.update(&period_seconds.to_le_bytes());
    h.update(&burst.to_le_bytes());
    h.digest()
}

/// Identifies a token limit's bucket: like [`limit_identity`], with what it counts, so a
/// token limit never shares a bucket with a request limit of the same figures.
pub fn token_limit_identity(
    rule_id: &str,
    measure: crate::usage::UsageMeasure,
    tokens: u64,
    period_seconds: u64,
    burst: u64,
) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"tokens\0");
    h.update(rule_id.as_bytes());
    h.update(&[0, measure as u8]);
    h.update(&tokens.to_le_bytes());
    h.update(&period_seconds.to_le_bytes());
    h.update(&burst.to_le_bytes());
    h.digest()
}

/// Identifies a soft limit's margin bucket beside the limit's own (`limit`), in the same
/// slot: changing the percentage starts a fresh margin.
pub fn soft_margin_identity(limit: u64, percent: u8) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"soft\0");
    h.update(&limit.to_le_bytes());
    h.update(&[percent]);
    h.digest()
}

/// Identifies one client of one rule: who owns a slot. Never zero, which marks an
/// empty slot.
pub fn client_fingerprint(rule_id: &str, client: &str) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"client\0");
    h.update(rule_id.as_bytes());
    h.update(&[0]);
    h.update(client.as_bytes());
    h.digest().max(1)
}

/// Identifies an elastic rule's pool in the slot table (`crate::rule::ElasticPool`): a
/// slot key no client's [`client_fingerprint`] is derived like. Never zero.
pub fn elastic_pool_fingerprint(rule_id: &str) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"elastic\0");
    h.update(rule_id.as_bytes());
    h.digest().max(1)
}

/// Identifies a rule among the rules whose requests wait in a worker's delay queue (its
/// per-worker bound is counted under it).
pub fn rule_identity(rule_id: &str) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"rule\0");
    h.update(rule_id.as_bytes());
    h.digest()
}

/// Points of a rollout: a client's [`rollout_point`] is below `percent × 100` when a
/// rule rolled out to `percent` is enforced for it.
pub const ROLLOUT_POINTS: u32 = 10_000;

/// Where one client of one rule falls in a percentage rollout, in `0..ROLLOUT_POINTS`:
/// the same on every proxy and after every restart, so a client is consistently in or
/// out, and raising the percentage only adds clients. Keyed by the rule's id, so two
/// rules rolled out to 10% do not pick the same 10% of clients.
pub fn rollout_point(rule_id: &str, client: &str) -> u32 {
    let mut h = Xxh3::new();
    h.update(b"rollout\0");
    h.update(rule_id.as_bytes());
    h.update(&[0]);
    h.update(client.as_bytes());
    // The remainder's bias is below 2^-50: negligible.
    (h.digest() % u64::from(ROLLOUT_POINTS)) as u32
}

/// Identifies one client's bucket of one global limit across the fleet: the coordinator's
/// key, the same on every proxy.
pub fn global_bucket(limit_identity: u64, client_fingerprint: u64) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"global\0");
    h.update(&limit_identity.to_le_bytes());
    h.update(&client_fingerprint.to_le_bytes());
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_pinned_so_reloaded_vms_find_their_buckets() {
        // If these change, every deployed proxy loses its bucket state on upgrade:
        // change them only on purpose, together with the slot format version.
        assert_eq!(client_fingerprint("api", "alice"), 0xd364_dcae_9220_f5a5);
        assert_eq!(limit_identity("r", 5, 1, 10), 0xb33d_cddc_79d2_02bf);
        // The fleet's proxies (and the coordinator's stored buckets) must agree on this one.
        assert_eq!(global_bucket(1, 2), 0x122a_dd1a_5aac_5a9b);
        assert_ne!(global_bucket(1, 2), global_bucket(2, 1));
        // Every proxy must put a client on the same side of a rollout.
        assert_eq!(rollout_point("api", "alice"), rollout_point("api", "alice"));
        assert_eq!(rollout_point("api", "alice"), 2846);
        assert_ne!(
            client_fingerprint("api", "alice"),
            client_fingerprint("api", "bob")
        );
        assert_ne!(
            client_fingerprint("ap", "ialice"),
            client_fingerprint("api", "alice")
        );
    }
}
