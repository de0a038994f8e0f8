//! The sync exchange between a proxy's control service and the coordinator:
//! `POST /api/v1/quota/sync`, once per sync interval per proxy, whatever the request rate.
//!
//! One request carries every active global bucket of the proxy; the answer carries one
//! grant per bucket, in the same order. Only lengths of time cross the wire, never
//! instants, so the proxies' and the coordinator's clocks need not agree.

use serde::{Deserialize, Serialize};

use super::coordinator::{Grant, Usage};
use crate::time::NANOS_PER_MILLI;

/// Where proxies send their syncs.
pub const SYNC_PATH: &str = "/api/v1/quota/sync";

/// A proxy's usage of its active global buckets since its last successful sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// The proxy's identity (its Envoy node id), as in its reports: 1 to 128 visible
    /// ASCII characters.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[!-~]{1,128}$"))]
    pub proxy: String,
    /// How often this proxy syncs, 50 ms to 10 s.
    #[cfg_attr(feature = "openapi", schema(minimum = 50, maximum = 10_000))]
    pub interval_ms: u64,
    /// How long the usage covers: the time since the proxy's last answered sync (at most
    /// 60 intervals of the longest kind, 10 minutes).
    #[cfg_attr(feature = "openapi", schema(maximum = 600_000))]
    pub covers_ms: u64,
    #[cfg_attr(feature = "openapi", schema(max_items = 50_000))]
    pub buckets: Vec<BucketUsage>,
    /// This sync's place in the proxy's sequence: its clock in Unix milliseconds when it
    /// sent the sync, or one more than its previous sync's if the clock stepped back. Each
    /// must be larger than the proxy id's previous one, so a sync sent again (replayed) is
    /// refused instead of debiting its buckets again. 0, or absent, is a proxy from before
    /// sequences, accepted only until its id sends a sequence; at most 5 minutes ahead of
    /// the coordinator's clock.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_007_199_254_740_991_u64))]
    pub seq: u64,
    /// When this proxy syncs next at the latest, in milliseconds, where that is later than
    /// one interval: a proxy whose ruleset has no global limit syncs only every 16
    /// intervals, and is not on its fallback shares meanwhile. 0, or absent: one interval.
    /// At most 10 minutes.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 600_000))]
    pub next_sync_ms: u64,
}

impl SyncRequest {
    /// The request body.
    pub fn to_json(&self) -> Vec<u8> {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl SyncResponse {
    /// Reads an answer body.
    pub fn from_json(bytes: &[u8]) -> Result<SyncResponse, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// One bucket's usage ([`Usage`], spelled out so that unknown fields are refused), and the
/// limit the proxy enforces for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BucketUsage {
    /// The bucket's fleet-wide identity, as 1 to 16 hex digits (sent as 16 lower-case ones;
    /// JSON numbers lose precision above 2^53).
    #[serde(with = "hex_u64")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9a-fA-F]{1,16}$"))]
    pub bucket: u64,
    /// The limit: one token per `interval_ns`, at most `burst` tokens (and `burst ×
    /// interval_ns` at most 2^62). The pair must be one a global limit of the current (or
    /// the previous) ruleset version produces: any other is refused by field.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 4_611_686_018_427_387_904_u64)
    )]
    pub interval_ns: u64,
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 4_611_686_018_427_387_904_u64)
    )]
    pub burst: u64,
    /// Tokens requested, admitted or not. This and the three counts after it are left out
    /// of the body when 0 (most buckets of a sync have nothing unleased or returned), and
    /// read as 0 when absent.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000_000_000_u64))]
    pub attempts: u64,
    /// Tokens admitted without a lease. This and `returned` are at most twice what the
    /// bucket holds and refills over `covers_ms` and a lease's life (three intervals).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000_000_000_u64))]
    pub unleased: u64,
    /// Lease tokens given back.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000_000_000_u64))]
    pub returned: u64,
    /// Tokens the proxy would like to hold after this sync.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000_000_000_u64))]
    pub want: u64,
    /// How far into `covers_ms` the proxy first used the bucket, when it is new to it (sent
    /// only then): the bucket's refill is counted from that first use. A value beyond
    /// `covers_ms` is read as its end.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 600_000))]
    pub first_use_ms: u64,
    /// How long until the fleet's bucket is full, as the proxy last heard it and counted
    /// down to this sync, rounded up (sent only while the proxy is on fallback shares, and
    /// only when not 0): a coordinator that lost its state (warming up) rebuilds the
    /// bucket's level from the emptiest one reported instead of starting it full. At most
    /// twice the bucket's capacity (`burst × interval_ns`, the deepest debt), in ms.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_855_u64))]
    pub full_in_ms: u64,
    /// The sync interval the proxy's configuration asks for, in ms, sent only while its
    /// interval in force (`interval_ms`) is stretched (the coordinator's answers were
    /// slow): the coordinator reads every proxy's demand against the configured interval,
    /// so a stretched proxy's share is not inflated. 0, or absent: `interval_ms`.
    /// Otherwise 50 to `interval_ms`, and the same in every bucket of a sync. (Per bucket,
    /// not per sync, so that code building syncs field by field stays as it is.)
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "openapi", schema(maximum = 10_000))]
    pub demand_interval_ms: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl BucketUsage {
    pub fn new(bucket: u64, interval_ns: u64, burst: u64, usage: &Usage) -> Self {
        Self {
            bucket,
            interval_ns,
            burst,
            attempts: usage.attempts,
            unleased: usage.unleased,
            returned: usage.returned,
            want: usage.want,
            // Rounded up: the coordinator reads `covers_ms` rounded down, so the first use
            // it sees is never earlier than the real one, and no refill is counted twice.
            first_use_ms: usage.first_use_ns.div_ceil(NANOS_PER_MILLI),
            // Rounded up too: the bucket is rebuilt at most a millisecond emptier.
            full_in_ms: usage.known_full_in_ns.div_ceil(NANOS_PER_MILLI),
            demand_interval_ms: 0,
        }
    }

    /// The same, from a proxy whose interval in force is stretched from `configured`
    /// (ms): says so ([`Self::demand_interval_ms`]); a proxy at its configured interval
    /// sends nothing more.
    pub fn stretched_from(self, configured_ms: u64, in_force_ms: u64) -> Self {
        Self {
            demand_interval_ms: if configured_ms < in_force_ms {
                configured_ms
            } else {
                0
            },
            ..self
        }
    }

    pub fn usage(&self) -> Usage {
        Usage {
            attempts: self.attempts,
            unleased: self.unleased,
            returned: self.returned,
            want: self.want,
            first_use_ns: self.first_use_ms.saturating_mul(NANOS_PER_MILLI),
            known_full_in_ns: self.full_in_ms.saturating_mul(NANOS_PER_MILLI),
        }
    }
}

/// The coordinator's answer: one grant per bucket of the request, in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SyncResponse {
    /// Proxies that synced recently, this one included.
    pub fleet_size: u32,
    /// True while the coordinator grants nothing after losing its state (leases granted
    /// before may still be spent): proxies keep to their fallback shares meanwhile.
    pub warming_up: bool,
    pub grants: Vec<Grant>,
}

/// `u64` as 16 lower-case hex digits.
pub mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        if text.is_empty() || text.len() > 16 {
            return Err(D::Error::custom("a bucket is 1 to 16 hex digits"));
        }
        u64::from_str_radix(&text, 16).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_pinned() {
        let request = SyncRequest {
            proxy: "edge-1".into(),
            interval_ms: 500,
            covers_ms: 480,
            seq: 1_700_000_000_123,
            buckets: vec![BucketUsage::new(
                0x00ab_cdef_0123_4567,
                10_000_000,
                100,
                &Usage {
                    attempts: 12,
                    unleased: 3,
                    returned: 0,
                    want: 18,
                    first_use_ns: 30_500_000,
                    known_full_in_ns: 0,
                },
            )],
            next_sync_ms: 0,
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "proxy": "edge-1",
                "interval_ms": 500,
                "covers_ms": 480,
                "buckets": [{
                    "bucket": "00abcdef01234567",
                    "interval_ns": 10_000_000,
                    "burst": 100,
                    "attempts": 12,
                    "unleased": 3,
                    "want": 18,
                    "first_use_ms": 31
                }],
                "seq": 1_700_000_000_123_u64
            })
        );
        assert_eq!(
            serde_json::from_value::<SyncRequest>(json).unwrap(),
            request
        );
    }

    /// A proxy from before sequences sends no `seq`: it reads as 0.
    #[test]
    fn a_sync_without_a_sequence_is_read_as_zero() {
        let json = serde_json::json!({
            "proxy": "p", "interval_ms": 500, "covers_ms": 500, "buckets": []
        });
        let request = serde_json::from_value::<SyncRequest>(json).unwrap();
        assert_eq!((request.seq, request.next_sync_ms), (0, 0));
    }

    /// Only a proxy that syncs less often than its interval says when it syncs next.
    #[test]
    fn the_next_sync_is_sent_only_when_later_than_one_interval() {
        let idle = SyncRequest {
            next_sync_ms: 4_000,
            ..SyncRequest::default()
        };
        let json = serde_json::to_value(&idle).unwrap();
        assert_eq!(json["next_sync_ms"], 4_000);
        let json = serde_json::to_value(SyncRequest::default()).unwrap();
        assert!(json.get("next_sync_ms").is_none(), "{json}");
    }

    #[test]
    fn a_bucket_used_from_the_windows_start_sends_no_first_use() {
        let known = BucketUsage::new(1, 10_000_000, 100, &Usage::default());
        let json = serde_json::to_value(known).unwrap();
        assert!(json.get("first_use_ms").is_none(), "{json}");
        assert_eq!(known.usage().first_use_ns, 0);
    }

    /// Zero counts are left out of the body, and an absent count reads as 0 (so coordinators
    /// from before read these bodies, and these coordinators read theirs).
    #[test]
    fn zero_counts_are_left_out_and_read_back_as_zero() {
        let usage = Usage {
            attempts: 40,
            want: 60,
            ..Usage::default()
        };
        let bucket = BucketUsage::new(0x00ab_cdef_0123_4567, 10_000_000, 100, &usage);
        let json = serde_json::to_value(bucket).unwrap();
        for absent in ["unleased", "returned", "first_use_ms"] {
            assert!(json.get(absent).is_none(), "{json}");
        }
        assert_eq!(json["attempts"], 40);
        assert_eq!(serde_json::from_value::<BucketUsage>(json).unwrap(), bucket);
        let idle = BucketUsage::new(1, 10_000_000, 100, &Usage::default());
        let json = serde_json::to_value(idle).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"bucket": "0000000000000001", "interval_ns": 10_000_000, "burst": 100})
        );
        assert_eq!(serde_json::from_value::<BucketUsage>(json).unwrap(), idle);
    }

    /// The fleet's level a proxy knew goes only where it is not 0 (on fallback shares),
    /// rounded up to a whole millisecond, and reads back as nanoseconds.
    #[test]
    fn a_known_level_is_sent_in_whole_milliseconds_rounded_up() {
        let usage = Usage {
            attempts: 4,
            known_full_in_ns: 1_200_000_001,
            ..Usage::default()
        };
        let bucket = BucketUsage::new(7, 10_000_000, 100, &usage);
        let json = serde_json::to_value(bucket).unwrap();
        assert_eq!(json["full_in_ms"], 1_201);
        let read = serde_json::from_value::<BucketUsage>(json).unwrap();
        assert_eq!(read.usage().known_full_in_ns, 1_201_000_000);
        let coordinated = BucketUsage::new(7, 10_000_000, 100, &Usage::default());
        let json = serde_json::to_value(coordinated).unwrap();
        assert!(json.get("full_in_ms").is_none(), "{json}");
    }

    /// A stretched proxy names its configured interval in each bucket; one at its
    /// configured interval sends nothing more, and a body without it reads as 0 (as from
    /// proxies before it).
    #[test]
    fn a_stretched_proxy_names_its_configured_interval() {
        let bucket = BucketUsage::new(7, 10_000_000, 100, &Usage::default());
        let stretched = bucket.stretched_from(250, 1_000);
        let json = serde_json::to_value(stretched).unwrap();
        assert_eq!(json["demand_interval_ms"], 250);
        assert_eq!(
            serde_json::from_value::<BucketUsage>(json).unwrap(),
            stretched
        );
        let at_pace = bucket.stretched_from(250, 250);
        let json = serde_json::to_value(at_pace).unwrap();
        assert!(json.get("demand_interval_ms").is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<BucketUsage>(json)
                .unwrap()
                .demand_interval_ms,
            0
        );
    }

    #[test]
    fn bad_bucket_ids_are_refused() {
        for bad in ["", "xyz", "00000000000000000"] {
            let json = serde_json::json!({
                "proxy": "p", "interval_ms": 500, "covers_ms": 500,
                "buckets": [{"bucket": bad, "interval_ns": 1, "burst": 1,
                             "attempts": 0, "unleased": 0, "returned": 0, "want": 0}]
            });
            assert!(
                serde_json::from_value::<SyncRequest>(json).is_err(),
                "{bad:?}"
            );
        }
    }
}
