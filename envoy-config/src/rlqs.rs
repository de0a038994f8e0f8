//! Envoy's rate limit quota filter (`envoy.filters.http.rate_limit_quota`, RLQS,
//! experimental in Envoy) pointed at Sluice's quota service on the rate limit service's
//! listener (`sluice serve --rls-listen`): the filter with one bucket matcher, and the
//! same HTTP/2 cluster as the rate limit filter's.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::rls::{RlsAction, RlsCredentials, grpc_cluster};

/// The quota filter's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlqsService {
    /// Where `sluice serve --rls-listen` listens.
    pub addr: SocketAddr,
    /// The `domain` every report names (a rule's `descriptor.domain`).
    pub domain: String,
    /// The bucket id's entries: `header:NAME=KEY` (the header's value under `KEY`; a
    /// request without every header named is in no bucket and not limited) and
    /// `generic:KEY=VALUE` (a fixed value). At least one header.
    pub bucket: Vec<RlsAction>,
    /// How often Envoy reports usage (and so renews its assignments).
    pub reporting_interval_ms: u32,
    /// Deny a bucket's requests until its first assignment, and after its assignment
    /// expired for good; by default they are allowed.
    pub fail_closed: bool,
}

/// How long Envoy keeps enforcing an expired assignment (the service out of reach for
/// its TTL) before its no-assignment behaviour applies.
pub const REUSE_EXPIRED_ASSIGNMENT_S: u32 = 300;

impl RlqsService {
    /// Why these settings make no working filter.
    pub fn check(&self) -> Result<(), String> {
        if self.bucket.contains(&RlsAction::RemoteAddress) {
            return Err("--rlqs-bucket: remote_address cannot name a quota bucket; give header:NAME=KEY or generic:KEY=VALUE".into());
        }
        if !self
            .bucket
            .iter()
            .any(|a| matches!(a, RlsAction::Header { .. }))
        {
            return Err("--rlqs-bucket: give at least one header:NAME=KEY".into());
        }
        if self.reporting_interval_ms < 100 {
            return Err("--rlqs-reporting-interval-ms: at least 100".into());
        }
        Ok(())
    }

    /// The `http_filters` entry, before the router.
    pub(crate) fn filter(&self, credentials: &RlsCredentials) -> Value {
        let headers: Vec<&str> = self
            .bucket
            .iter()
            .filter_map(|a| match a {
                RlsAction::Header { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let present = |name: &str| {
            json!({ "single_predicate": {
                "input": {
                    "name": name,
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                        "header_name": name,
                    },
                },
                "value_match": { "safe_regex": { "google_re2": {}, "regex": ".+" } },
            } })
        };
        let predicate = match headers.as_slice() {
            [one] => present(one),
            many => json!({ "and_matcher": {
                "predicate": many.iter().map(|h| present(h)).collect::<Vec<_>>(),
            } }),
        };
        let entries: serde_json::Map<String, Value> = self
            .bucket
            .iter()
            .filter_map(|a| match a {
                RlsAction::Header { name, key } => Some((
                    key.clone(),
                    json!({ "custom_value": {
                        "name": name,
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                            "header_name": name,
                        },
                    } }),
                )),
                RlsAction::Generic { key, value } => {
                    Some((key.clone(), json!({ "string_value": value })))
                }
                RlsAction::RemoteAddress => None,
            })
            .collect();
        let fallback = if self.fail_closed {
            "DENY_ALL"
        } else {
            "ALLOW_ALL"
        };
        let settings = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
            "bucket_id_builder": { "bucket_id_builder": entries },
            "reporting_interval": format!("{}s", f64::from(self.reporting_interval_ms) / 1000.0),
            "no_assignment_behavior": { "fallback_rate_limit": { "blanket_rule": fallback } },
            "expired_assignment_behavior": {
                "expired_assignment_behavior_timeout": format!("{REUSE_EXPIRED_ASSIGNMENT_S}s"),
                "reuse_last_assignment": {},
            },
        });
        json!({
            "name": "envoy.filters.http.rate_limit_quota",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
                "rlqs_server": credentials.grpc_service(),
                "domain": self.domain,
                "bucket_matchers": { "matcher_list": { "matchers": [{
                    "predicate": predicate,
                    "on_match": { "action": { "name": "sluice_bucket", "typed_config": settings } },
                }] } },
            },
        })
    }

    /// The service's cluster: the rate limit service's.
    pub(crate) fn cluster(&self, credentials: &RlsCredentials) -> Value {
        grpc_cluster(self.addr, credentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(bucket: &str) -> RlqsService {
        RlqsService {
            addr: "127.0.0.1:8081".parse().unwrap(),
            domain: "edge".into(),
            bucket: RlsAction::parse_list(bucket).unwrap(),
            reporting_interval_ms: 1_000,
            fail_closed: false,
        }
    }

    #[test]
    fn buckets_need_a_header_and_no_address() {
        service("header:x-api-key=api_key").check().unwrap();
        service("header:x-api-key=api_key,generic:tier=free")
            .check()
            .unwrap();
        assert!(service("generic:tier=free").check().is_err());
        assert!(
            service("header:x-api-key=api_key,remote_address")
                .check()
                .is_err()
        );
    }

    #[test]
    fn the_filter_builds_bucket_ids_from_headers_and_fails_open() {
        let filter = service("header:x-api-key=api_key,generic:tier=free")
            .filter(&RlsCredentials::default());
        let config = &filter["typed_config"];
        assert_eq!(config["domain"], "edge");
        let settings = &config["bucket_matchers"]["matcher_list"]["matchers"][0]["on_match"]["action"]
            ["typed_config"];
        let ids = &settings["bucket_id_builder"]["bucket_id_builder"];
        assert_eq!(
            ids["api_key"]["custom_value"]["typed_config"]["header_name"],
            "x-api-key"
        );
        assert_eq!(ids["tier"]["string_value"], "free");
        assert_eq!(
            settings["no_assignment_behavior"]["fallback_rate_limit"]["blanket_rule"],
            "ALLOW_ALL"
        );
        let closed = RlqsService {
            fail_closed: true,
            ..service("header:x-api-key=api_key")
        };
        let filter = closed.filter(&RlsCredentials::default());
        let settings = &filter["typed_config"]["bucket_matchers"]["matcher_list"]["matchers"][0]["on_match"]
            ["action"]["typed_config"];
        assert_eq!(
            settings["no_assignment_behavior"]["fallback_rate_limit"]["blanket_rule"],
            "DENY_ALL"
        );
    }
}
