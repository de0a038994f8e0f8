//! Structured inputs for the fuzz targets that need more than bytes: rules, rulesets and
//! requests built with `arbitrary`, from a small vocabulary of hosts, paths, header names
//! and values that rules and requests share, so that generated rules actually match
//! generated requests, find their keys and read their costs. Now and then a field takes an
//! arbitrary value instead, so validation and unusual input are reached too.
//!
//! A target builds its input from bytes with [`from_bytes`], as libfuzzer-sys would.

use std::num::NonZeroU32;

use arbitrary::{Arbitrary, Result, Unstructured};
use sluice_core::gcra::MAX_CAPACITY_NS;
use sluice_core::global::lease::FleetView;
use sluice_core::identity::MetadataValue;
use sluice_core::request::{HttpRequest, Identity};
use sluice_core::spec::{
    ClientIpSpec, CostSpec, ElasticSpec, FailureMode, GrpcStatus, HeaderCostSpec, HeaderMatchSpec,
    KeyMissingSpec, KeySpec, LimitSpec, MatchSpec, MetadataKeySpec, Mode, NamedPeriod,
    OverrideSpec, PeerCertificateField, PeriodSpec, ResponseSpec, RuleSpec, Scope, TokensSpec,
    UsageMeasure, UsageSpec, ValueMatchSpec,
};

const RULE_NAMES: &[&str] = &["api", "per-key", "login", "tenant", "everyone"];
const HOST_PATTERNS: &[&str] = &[
    "api.example.com",
    "*.example.com",
    "example.com",
    "localhost",
];
const AUTHORITIES: &[&str] = &[
    "api.example.com",
    "API.Example.com:8443",
    "example.com",
    "www.example.com",
    "localhost",
    "[::1]:8080",
    "",
];
const PATHS: &[&str] = &[
    "/",
    "/api/",
    "/api/items",
    "/api/items?key=alice",
    "/api/items?key=bob&tenant=acme",
    "/v1/users/42",
    "/health",
    "/login?key=%00",
];
const PATH_PREFIXES: &[&str] = &["/", "/api/", "/v1/", "/login"];
const PATH_REGEXES: &[&str] = &[
    "/api/.*",
    "/v[0-9]+/users/[0-9]+",
    "/(health|login)",
    ".*",
    "(",
];
const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "get", ""];
const HEADER_NAMES: &[&str] = &[
    "x-api-key",
    "x-tenant",
    "x-cost",
    "x-forwarded-for",
    "content-type",
    "X-Api-Key",
];
const QUERY_KEYS: &[&str] = &["key", "tenant", "x"];
const VALUES: &[&str] = &[
    "alice",
    "bob",
    "acme",
    "acme|alice",
    "3",
    "0",
    "1000001",
    "18446744073709551616",
    "1.2.3.4, 10.0.0.1",
    "::1",
    "application/grpc",
    "",
];
const REQUESTS: &[u64] = &[1, 2, 3, 5, 10, 100, 1_000_000_000, 0];
const SECONDS: &[u64] = &[1, 2, 10, 60, 0, 366 * 86_400 + 1];
const COSTS: &[u64] = &[1, 0, 2, 5, 1_000_001];

/// The input of a target that takes `T`, read from `bytes` as libfuzzer-sys's
/// `fuzz_target!(|input: T| ...)` reads it: inputs shorter than `T`'s smallest size are
/// skipped, the rest is `T::arbitrary_take_rest` over all the bytes. `None` where
/// libFuzzer would not call the target.
pub fn from_bytes<'a, T: Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    if bytes.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(bytes)).ok()
}

/// The latest host clock for which the limiter promises `burst + rate × elapsed`: a TAT
/// must hold `now` plus a whole capacity (`gcra.rs`).
pub const LATEST_CLOCK_NS: u64 = u64::MAX - MAX_CAPACITY_NS;

/// One of `choices`, or now and then any string. Rarely: a rule has a dozen such fields,
/// and one invalid field refuses the whole ruleset.
fn word(u: &mut Unstructured<'_>, choices: &[&str]) -> Result<String> {
    if u.ratio(1, 32)? {
        return u.arbitrary();
    }
    Ok((*u.choose(choices)?).to_string())
}

/// One of `choices`, or now and then any number.
fn number(u: &mut Unstructured<'_>, choices: &[u64]) -> Result<u64> {
    if u.ratio(1, 32)? {
        return u.arbitrary();
    }
    Ok(*u.choose(choices)?)
}

fn sometimes<T>(
    u: &mut Unstructured<'_>,
    value: impl FnOnce(&mut Unstructured<'_>) -> Result<T>,
) -> Result<Option<T>> {
    if u.ratio(1, 3)? {
        Ok(Some(value(u)?))
    } else {
        Ok(None)
    }
}

fn list<T>(
    u: &mut Unstructured<'_>,
    max: u32,
    mut item: impl FnMut(&mut Unstructured<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let len = u.int_in_range(0..=max)?;
    (0..len).map(|_| item(u)).collect()
}

/// A rule as a user could write it: mostly valid, sometimes not.
pub fn rule(u: &mut Unstructured<'_>) -> Result<RuleSpec> {
    let name = word(u, RULE_NAMES)?;
    Ok(RuleSpec {
        id: sometimes(u, |u| word(u, RULE_NAMES))?,
        name,
        description: String::new(),
        enabled: !u.ratio(1, 8)?,
        priority: if u.ratio(1, 8)? {
            u.arbitrary()?
        } else {
            u.int_in_range(-2..=2)?
        },
        mode: if u.ratio(1, 4)? {
            Mode::Shadow
        } else {
            Mode::Enforce
        },
        matcher: matcher(u)?,
        key: key(u, true)?,
        key_missing: if u.ratio(1, 4)? {
            KeyMissingSpec::Fallback(word(u, VALUES)?)
        } else {
            KeyMissingSpec::Skip
        },
        // Mostly whole rollouts; sometimes a share, now and then out of range (refused).
        enforce_percent: if u.ratio(1, 4)? {
            u.int_in_range(0..=110)?
        } else {
            100
        },
        limits: limits(u)?,
        cost: if u.ratio(1, 3)? {
            CostSpec::Header(HeaderCostSpec {
                name: word(u, HEADER_NAMES)?,
                max: number(u, COSTS)?,
                default: number(u, COSTS)?,
            })
        } else {
            CostSpec::Fixed(number(u, COSTS)?)
        },
        overrides: list(u, 2, |u| {
            Ok(OverrideSpec {
                client: word(u, VALUES)?,
                limits: limits(u)?,
            })
        })?,
        failure_mode: sometimes(u, failure_mode)?,
        response: if u.ratio(1, 4)? {
            ResponseSpec {
                status: if u.ratio(1, 8)? {
                    u.arbitrary()?
                } else {
                    *u.choose(&[429, 503, 400, 418])?
                },
                rate_limit_headers: u.arbitrary()?,
                grpc_status: if u.arbitrary()? {
                    GrpcStatus::Unavailable
                } else {
                    GrpcStatus::ResourceExhausted
                },
            }
        } else {
            ResponseSpec::default()
        },
        // Rules for Envoy's rate limit service are decided outside the filter.
        descriptor: None,
        tokens: if u.ratio(1, 3).unwrap_or(false) {
            Some(tokens(u)?)
        } else {
            None
        },
        on_limit: Default::default(),
        delay: None,
        elastic: if u.ratio(1, 6)? {
            Some(ElasticSpec {
                requests: number(u, REQUESTS)?,
                period: period(u)?,
                burst: sometimes(u, |u| number(u, REQUESTS))?,
            })
        } else {
            None
        },
    })
}

pub fn failure_mode(u: &mut Unstructured<'_>) -> Result<FailureMode> {
    Ok(if u.arbitrary()? {
        FailureMode::Closed
    } else {
        FailureMode::Open
    })
}

fn matcher(u: &mut Unstructured<'_>) -> Result<MatchSpec> {
    Ok(MatchSpec {
        host: sometimes(u, |u| word(u, HOST_PATTERNS))?,
        path_exact: sometimes(u, |u| word(u, PATHS))?,
        path_prefix: sometimes(u, |u| word(u, PATH_PREFIXES))?,
        path_regex: if u.ratio(1, 6)? {
            Some(word(u, PATH_REGEXES)?)
        } else {
            None
        },
        methods: list(u, 2, |u| word(u, METHODS))?,
        headers: list(u, 2, |u| {
            // A condition needs `present` or `equals`; now and then it has both, or
            // neither (refused).
            let (present, equals) = match u.int_in_range(0..=7)? {
                0 => (None, None),
                1 => (Some(u.arbitrary()?), Some(word(u, VALUES)?)),
                2..=4 => (Some(u.arbitrary()?), None),
                _ => (None, Some(word(u, VALUES)?)),
            };
            Ok(HeaderMatchSpec {
                name: word(u, HEADER_NAMES)?,
                present,
                equals,
            })
        })?,
        values: list(u, 1, |u| {
            Ok(ValueMatchSpec {
                value: key(u, false)?,
                present: None,
                equals: Some(word(u, VALUES)?),
            })
        })?,
    })
}

fn key(u: &mut Unstructured<'_>, composite_allowed: bool) -> Result<KeySpec> {
    let kinds = if composite_allowed { 9 } else { 8 };
    Ok(match u.int_in_range(0..=kinds - 1)? {
        0 => KeySpec::Header(word(u, HEADER_NAMES)?),
        1 => KeySpec::ClientIp(ClientIpSpec {
            trusted_hops: u.int_in_range(0..=3)?,
        }),
        2 => KeySpec::Query(word(u, QUERY_KEYS)?),
        3 => KeySpec::Path,
        4 => KeySpec::Global,
        5 => KeySpec::Cookie(word(u, QUERY_KEYS)?),
        6 => KeySpec::PeerCertificate(PeerCertificateField::UriSan),
        7 => KeySpec::Metadata(MetadataKeySpec {
            filter: "envoy.filters.http.jwt_authn".into(),
            path: list(u, 3, |u| word(u, QUERY_KEYS))?,
        }),
        _ => KeySpec::Composite(list(u, 3, |u| key(u, false))?),
    })
}

fn limits(u: &mut Unstructured<'_>) -> Result<Vec<LimitSpec>> {
    // Mostly one to three; sometimes none or more than a rule may have.
    let len = if u.ratio(1, 10)? {
        u.int_in_range(0..=9)?
    } else {
        u.int_in_range(1..=3)?
    };
    (0..len).map(|_| limit(u)).collect()
}

fn period(u: &mut Unstructured<'_>) -> Result<PeriodSpec> {
    Ok(match u.int_in_range(0..=4)? {
        0 => PeriodSpec::Named(NamedPeriod::Second),
        1 => PeriodSpec::Named(NamedPeriod::Minute),
        2 => PeriodSpec::Named(NamedPeriod::Hour),
        3 => PeriodSpec::Named(NamedPeriod::Day),
        _ => PeriodSpec::Seconds(number(u, SECONDS)?),
    })
}

fn limit(u: &mut Unstructured<'_>) -> Result<LimitSpec> {
    let mut limit = LimitSpec {
        requests: Some(number(u, REQUESTS)?),
        period: Some(period(u)?),
        burst: sometimes(u, |u| number(u, REQUESTS))?,
        scope: if u.ratio(1, 4)? {
            Scope::Global
        } else {
            Scope::Proxy
        },
        tokens: None,
        count: None,
        concurrent: None,
        soft_percent: None,
    };
    // Sometimes a token limit instead (decided last, so older corpus inputs keep
    // meaning what they meant).
    if u.ratio(1, 4).unwrap_or(false) {
        limit.tokens = limit.requests.take();
        limit.count = sometimes(u, |u| {
            Ok(*u.choose(&[
                UsageMeasure::Input,
                UsageMeasure::Output,
                UsageMeasure::Total,
            ])?)
        })?;
    }
    Ok(limit)
}

fn tokens(u: &mut Unstructured<'_>) -> Result<TokensSpec> {
    Ok(TokensSpec {
        usage: if u.arbitrary()? {
            UsageSpec::OpenAi
        } else {
            UsageSpec::Anthropic
        },
        default_estimate: number(u, COSTS)?,
        estimate_input_from_body: u.arbitrary()?,
        include_usage: u.arbitrary()?,
    })
}

/// A request over the same vocabulary as the rules.
pub fn request(u: &mut Unstructured<'_>) -> Result<HttpRequest> {
    Ok(HttpRequest {
        method: word(u, METHODS)?,
        authority: word(u, AUTHORITIES)?,
        path: word(u, PATHS)?,
        // Envoy hands header names over in lower case; the rules lower-case theirs.
        headers: list(u, 4, |u| {
            Ok((
                word(u, HEADER_NAMES)?.to_ascii_lowercase(),
                word(u, VALUES)?,
            ))
        })?,
        peer_ip: u.arbitrary()?,
        identity: identity(u)?,
    })
}

/// Verified claims (as `jwt_authn` leaves them) and a peer certificate, sometimes.
fn identity(u: &mut Unstructured<'_>) -> Result<Identity> {
    let claims = list(u, 3, |u| {
        let value = if u.ratio(1, 4)? {
            MetadataValue::List(list(u, 3, |u| Ok(MetadataValue::Text(word(u, VALUES)?)))?)
        } else {
            MetadataValue::Text(word(u, VALUES)?)
        };
        Ok((word(u, QUERY_KEYS)?, value))
    })?;
    let metadata = if claims.is_empty() {
        Vec::new()
    } else {
        vec![(
            "envoy.filters.http.jwt_authn".to_string(),
            MetadataValue::Object(claims.into_iter().collect()),
        )]
    };
    let peer_certificate = if u.ratio(1, 4)? {
        vec![(PeerCertificateField::UriSan, word(u, VALUES)?)]
    } else {
        Vec::new()
    };
    Ok(Identity {
        metadata,
        peer_certificate,
    })
}

/// How far the clock moves before a request: mostly not at all or a little, sometimes a
/// lot, rarely anything (past the end of the clocks the limiter promises anything for).
pub fn elapsed_ns(u: &mut Unstructured<'_>) -> Result<u64> {
    Ok(match u.int_in_range(0..=31)? {
        0..=11 => 0,
        12..=21 => u.int_in_range(0..=10_000_000)?,
        22..=27 => u.int_in_range(0..=2_000_000_000)?,
        28..=30 => u.int_in_range(0..=86_400_000_000_000)?,
        _ => u.arbitrary()?,
    })
}

/// A run of requests against one ruleset, with the tables and the fleet view they use.
#[derive(Debug)]
pub struct Scenario {
    pub rules: Vec<RuleSpec>,
    pub failure_mode: FailureMode,
    /// Small tables, so that clients share slots and lease keys are contended.
    pub slots: NonZeroU32,
    pub lease_slots: NonZeroU32,
    pub view: FleetView,
    pub start_ns: u64,
    pub steps: Vec<(u64, HttpRequest)>,
}

impl<'a> Arbitrary<'a> for Scenario {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let rules = list(u, 4, rule)?;
        let failure_mode = failure_mode(u)?;
        let slots = NonZeroU32::new(u.int_in_range(1..=64)?).unwrap_or(NonZeroU32::MIN);
        let lease_slots = NonZeroU32::new(u.int_in_range(1..=16)?).unwrap_or(NonZeroU32::MIN);
        let view = FleetView {
            fleet_size: u.int_in_range(0..=5)?,
            fallback: u.arbitrary()?,
            sync_interval_ns: u.int_in_range(1..=10_000_000_000)?,
        };
        let start_ns = match u.int_in_range(0..=7)? {
            0 => 0,
            1..=4 => 1_700_000_000_000_000_000,
            5 => LATEST_CLOCK_NS - 10_000_000_000,
            6 => u.int_in_range(0..=LATEST_CLOCK_NS)?,
            _ => u.arbitrary()?,
        };
        let steps = list(u, 64, |u| Ok((elapsed_ns(u)?, request(u)?)))?;
        Ok(Scenario {
            rules,
            failure_mode,
            slots,
            lease_slots,
            view,
            start_ns,
            steps,
        })
    }
}
