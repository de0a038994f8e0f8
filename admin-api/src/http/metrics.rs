//! The admin API's own Prometheus metrics (OpenMetrics text, served at `/metrics` by
//! [`super::operations`]).
//!
//! Each [`super::AppState`] has its own registry rather than a process-global recorder, so tests
//! that run many apps in one process each see only their own counts.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sluice_core::rule::Rule;
use sluice_core::spec::{Mode, RuleSpec};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// From a fixed set: see `operations::method_label`.
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// A limit of a rule: both come from the ruleset (names are validated identifiers, at most
/// one label set per limit of a stored rule), never from a request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    rule: String,
    /// As `RateLimit-Policy` and `x-sluice-limit` name it: the rule's name, with `/N` for
    /// its Nth limit when it has several.
    limit: String,
    /// `requests` or `tokens`.
    unit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

/// The configured limits of the enabled rules, as gauges rebuilt at every scrape from the
/// current ruleset (so a deleted rule's series disappear).
#[derive(Debug, Default)]
struct ConfiguredLimits {
    amount: Family<LimitLabels, Gauge>,
    period: Family<LimitLabels, Gauge>,
    burst: Family<LimitLabels, Gauge>,
    enforce_percent: Family<RuleLabel, Gauge>,
}

impl ConfiguredLimits {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_rule_limit",
            "Configured requests (or tokens) per period of each limit of each enabled rule",
            self.amount.clone(),
        );
        registry.register(
            "sluice_rule_limit_period_seconds",
            "Configured period of each limit of each enabled rule",
            self.period.clone(),
        );
        registry.register(
            "sluice_rule_limit_burst",
            "Configured capacity (burst) of each limit of each enabled rule, as enforced",
            self.burst.clone(),
        );
        registry.register(
            "sluice_rule_enforce_percent",
            "Share of clients each enabled enforce-mode rule is enforced for (the rest: shadow mode)",
            self.enforce_percent.clone(),
        );
    }

    fn set(&self, rules: &[RuleSpec]) {
        self.amount.clear();
        self.period.clear();
        self.burst.clear();
        self.enforce_percent.clear();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for spec in rules.iter().filter(|r| r.enabled) {
            // Stored rules were validated when written; one that no longer is shows nothing.
            let Ok(rule) = Rule::try_from(spec.clone()) else {
                continue;
            };
            if rule.mode == Mode::Enforce {
                self.enforce_percent
                    .get_or_create(&RuleLabel {
                        rule: rule.name.clone(),
                    })
                    .set(i64::from(rule.enforce_percent));
            }
            for (i, limit) in rule.limits.iter().enumerate() {
                let labels = LimitLabels {
                    rule: rule.name.clone(),
                    limit: if rule.limits.len() > 1 {
                        format!("{}/{}", rule.name, i + 1)
                    } else {
                        rule.name.clone()
                    },
                    unit: if limit.counts.is_tokens() {
                        "tokens"
                    } else {
                        "requests"
                    },
                };
                self.amount
                    .get_or_create(&labels)
                    .set(gauge(limit.requests));
                self.period
                    .get_or_create(&labels)
                    .set(gauge(limit.period_seconds));
                self.burst.get_or_create(&labels).set(gauge(limit.burst));
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: HistogramFamily,
    rules: Gauge,
    connected_proxies: Gauge,
    ruleset_version: Gauge,
    pub(super) long_polls: Gauge,
    configured: ConfiguredLimits,
    /// Open connections and connections refused over the cap, by [`crate::conn`].
    pub(super) connections: ConnectionMetrics,
    /// Envoy's rate limit service (`--rls-listen`, [`crate::rls`]).
    pub(super) rls: RlsMetrics,
}

/// What Envoy's rate limit service counts (see [`crate::rls`]). Every label comes from a
/// fixed set, never from a request.
#[derive(Debug, Clone, Default)]
pub struct RlsMetrics {
    /// `ShouldRateLimit` calls answered, by `overall_code` (`ok`, `over_limit`) or refused
    /// (`invalid`).
    pub(crate) requests: Family<CodeLabel, Counter>,
    /// Descriptors decided, by outcome (`allowed`, `denied`, `shadow_denied`,
    /// `not_charged`, `unlimited`, `failed_open`, `failed_closed`).
    pub(crate) descriptors: Family<OutcomeLabel, Counter>,
    /// Requests whose buckets could not be charged, by reason.
    pub(crate) failures: Family<ReasonLabel, Counter>,
    /// gRPC connections open now, and refused over the cap.
    pub(crate) connections: ConnectionMetrics,
    /// RLS rules in force.
    pub(crate) rules: Gauge,
    /// Quota service (RLQS) streams open now.
    pub(crate) quota_streams: Gauge,
    /// Usage reports answered on quota streams.
    pub(crate) quota_reports: Counter,
    /// What quota streams were refused, by reason (`max_streams`, `max_stream_buckets`,
    /// `invalid`, `idle`).
    pub(crate) quota_refused: Family<ReasonLabel, Counter>,
    /// Calls of either service refused before anything was read or charged, by reason
    /// (`missing_token`, `bad_token`, `wrong_role`, `throttled`, `unavailable`).
    pub(crate) unauthenticated: Family<ReasonLabel, Counter>,
    /// The decisions of both services per rule, under the names the filter's per-rule
    /// counters have in Envoy, so one query covers both.
    pub(crate) per_rule: PerRuleCounters,
}

/// A rule's id, as the filter's per-rule counters are labelled once Envoy's tag
/// extraction has run. Ids come from the ruleset, never from a request: at most one
/// series per rule the service decided for.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SluiceRuleLabel {
    pub(crate) sluice_rule: String,
}

/// Per-rule decision counters of the rate limit and quota services, added from each
/// report's batch as the filter's workers add theirs to Envoy's counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct PerRuleCounters {
    allowed: Family<SluiceRuleLabel, Counter>,
    denied: Family<SluiceRuleLabel, Counter>,
    shadow_denied: Family<SluiceRuleLabel, Counter>,
    near_limit: Family<SluiceRuleLabel, Counter>,
    fail_open: Family<SluiceRuleLabel, Counter>,
}

impl PerRuleCounters {
    fn register(&self, registry: &mut Registry) {
        let families = [
            (
                "sluice_rule_allowed",
                "Requests each rule allowed",
                &self.allowed,
            ),
            (
                "sluice_rule_denied",
                "Requests each rule denied",
                &self.denied,
            ),
            (
                "sluice_rule_shadow_denied",
                "Requests each shadow-mode rule would have denied",
                &self.shadow_denied,
            ),
            (
                "sluice_rule_near_limit",
                "Allowed requests that left a limit of their rule at least 80% used",
                &self.near_limit,
            ),
            (
                "sluice_rule_fail_open",
                "Requests let through because their rule could not be evaluated",
                &self.fail_open,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family.clone());
        }
    }

    /// Adds a batch's per-rule counts.
    pub(crate) fn add(&self, batch: &sluice_core::report::RuleBatch) {
        for rule in &batch.rules {
            let label = SluiceRuleLabel {
                sluice_rule: rule.rule.clone(),
            };
            let c = &rule.counts;
            for (family, n) in [
                (&self.allowed, c.allowed),
                (&self.denied, c.denied),
                (&self.shadow_denied, c.shadow_denied),
                (&self.near_limit, c.near_limit),
                (&self.fail_open, c.fail_open),
            ] {
                if n > 0 {
                    family.get_or_create(&label).inc_by(n);
                }
            }
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabel {
    pub(crate) code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabel {
    pub(crate) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

impl RlsMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_rls_requests",
            "Rate limit service (RLS) calls answered, by overall code (ok, over_limit), or refused (invalid)",
            self.requests.clone(),
        );
        registry.register(
            "sluice_rls_descriptors",
            "RLS descriptors decided, by outcome (allowed, denied, shadow_denied, not_charged, unlimited, failed_open, failed_closed)",
            self.descriptors.clone(),
        );
        registry.register(
            "sluice_rls_failures",
            "RLS calls whose buckets could not be charged (decided by the rules' failure modes), by reason",
            self.failures.clone(),
        );
        registry.register(
            "sluice_rls_open_connections",
            "gRPC connections open now on the RLS listener",
            self.connections.open.clone(),
        );
        registry.register(
            "sluice_rls_refused_connections",
            "RLS connections closed at once because --rls-max-connections were open",
            self.connections.refused.clone(),
        );
        registry.register(
            "sluice_rls_handshake_failures",
            "RLS connections closed before any call, by reason (client_certificate: none presented, or one --rls-client-ca did not sign; tls: any other handshake failure; timeout: no handshake, or without TLS no first bytes, within --tls-handshake-timeout)",
            self.connections.handshake_failures.clone(),
        );
        registry.register(
            "sluice_rls_rules",
            "Rules with a descriptor section in force (RLS rules)",
            self.rules.clone(),
        );
        registry.register(
            "sluice_rlqs_streams",
            "Quota service (RLQS) streams open now",
            self.quota_streams.clone(),
        );
        registry.register(
            "sluice_rlqs_reports",
            "Usage reports answered on quota service (RLQS) streams",
            self.quota_reports.clone(),
        );
        registry.register(
            "sluice_rlqs_refused",
            "What the quota service (RLQS) refused, by reason (max_streams, max_stream_buckets: a bucket given no assignment, invalid, idle: a stream ended)",
            self.quota_refused.clone(),
        );
        registry.register(
            "sluice_rls_unauthenticated",
            "Rate limit and quota service calls refused for their token, by reason (missing_token, bad_token: unknown, revoked or malformed, wrong_role, throttled: too many failures from the address, unavailable: the token store did not answer)",
            self.unauthenticated.clone(),
        );
        self.per_rule.register(registry);
    }
}

/// What the accept loop counts (see [`crate::conn`]).
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    pub(crate) open: Gauge,
    pub(crate) refused: Counter,
    /// Connections that ended before they were served, by [`ConnectionMetrics::handshake_failed`]'s
    /// reason.
    pub(crate) handshake_failures: Family<ReasonLabel, Counter>,
}

impl ConnectionMetrics {
    /// Counts a connection that ended before it was served: its TLS handshake failed with
    /// `error`, or (`None`) it did not finish, or without TLS did not start, within
    /// `--tls-handshake-timeout`.
    pub(crate) fn handshake_failed(&self, error: Option<&std::io::Error>) {
        // tokio-rustls hands rustls' own error back inside the I/O error.
        let tls_error = error.map(|e| {
            e.get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        let reason = match tls_error {
            None => "timeout",
            Some(Some(
                rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_),
            )) => "client_certificate",
            Some(_) => "tls",
        };
        self.handshake_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

fn duration_histogram() -> Histogram {
    // 1 ms to about 65 s: the long-poll's holds land in the top buckets.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Metrics {
    pub(super) fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let durations: HistogramFamily = Family::new_with_constructor(duration_histogram);
        let rules = Gauge::default();
        let connected_proxies = Gauge::default();
        let ruleset_version = Gauge::default();
        let long_polls = Gauge::default();
        let connections = ConnectionMetrics::default();
        let rls = RlsMetrics::default();
        rls.register(&mut registry);
        let configured = ConfiguredLimits::default();
        configured.register(&mut registry);
        registry.register(
            "sluice_admin_open_connections",
            "HTTP connections open now, on every listener (handshaking, idle or busy)",
            connections.open.clone(),
        );
        registry.register(
            "sluice_admin_refused_connections",
            "Connections closed at once because --max-connections were open",
            connections.refused.clone(),
        );
        registry.register(
            "sluice_admin_handshake_failures",
            "TLS connections closed before any request, by reason (client_certificate: none presented, or one the client CA did not sign; tls: any other handshake failure, such as plain HTTP; timeout: no handshake within --tls-handshake-timeout)",
            connections.handshake_failures.clone(),
        );
        registry.register(
            "sluice_admin_http_requests",
            "HTTP requests answered, by method, route pattern and status",
            requests.clone(),
        );
        registry.register(
            "sluice_admin_http_request_duration_seconds",
            "Time to answer, by method and route pattern (ruleset long-polls include their hold)",
            durations.clone(),
        );
        registry.register("sluice_admin_rules", "Rules stored", rules.clone());
        registry.register(
            "sluice_admin_connected_proxies",
            "Proxies that polled for rules within the last 60 seconds",
            connected_proxies.clone(),
        );
        registry.register(
            "sluice_admin_ruleset_version",
            "The current ruleset version",
            ruleset_version.clone(),
        );
        registry.register(
            "sluice_admin_long_polls",
            "Ruleset long-polls held open now",
            long_polls.clone(),
        );
        Metrics {
            registry,
            requests,
            durations,
            rules,
            connected_proxies,
            ruleset_version,
            long_polls,
            configured,
            connections,
            rls,
        }
    }

    /// For the metrics pipeline's own instruments.
    pub(super) fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Counts one answered request. `method` and `route` must come from fixed sets (a
    /// label value taken from a request is a memory leak).
    pub(super) fn observe_request(
        &self,
        method: &'static str,
        route: &str,
        status: u16,
        took: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route: route.to_string(),
                status,
            })
            .inc();
        self.durations
            .get_or_create(&RouteLabels {
                method,
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// The registry as OpenMetrics text, with the gauges read from the database at scrape
    /// time (so they are exact when read and cost nothing between scrapes).
    pub(super) fn encode(
        &self,
        rules: &[RuleSpec],
        connected_proxies: u64,
        ruleset_version: u64,
    ) -> Result<String, std::fmt::Error> {
        let to_gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.rules
            .set(i64::try_from(rules.len()).unwrap_or(i64::MAX));
        self.configured.set(rules);
        self.connected_proxies.set(to_gauge(connected_proxies));
        self.ruleset_version.set(to_gauge(ruleset_version));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
