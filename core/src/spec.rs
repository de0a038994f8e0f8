//! The rule model as users write it: JSON or YAML, in the filter's static configuration,
//! in `sluice rules apply` files and in the admin API's request bodies alike.
//!
//! These types only describe shape. Whether a rule makes sense is decided once, at the
//! edge, by [`crate::rule::Rule::try_from`]; everything after that works with values that
//! are already valid.

use serde::{Deserialize, Serialize};

use crate::usage::PointerSet;
pub use crate::usage::UsageMeasure;

/// One rate-limiting rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Stable identity of the rule's buckets. Defaults to `name`; keep it when renaming a
    /// rule so its clients keep their buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Higher runs first; the first denying rule in this order is the one reported.
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default, rename = "match")]
    pub matcher: MatchSpec,
    pub key: KeySpec,
    /// What happens when a matching request carries no client key: the rule is skipped
    /// (the default), or the request draws from one named fallback bucket.
    #[serde(default, skip_serializing_if = "KeyMissingSpec::is_skip")]
    pub key_missing: KeyMissingSpec,
    /// The share of clients (0 to 100) an enforce-mode rule is enforced for, chosen by a
    /// stable hash of the client key; the others are in shadow mode (a gradual rollout).
    #[serde(default = "hundred", skip_serializing_if = "is_hundred")]
    pub enforce_percent: u8,
    pub limits: Vec<LimitSpec>,
    #[serde(default)]
    pub cost: CostSpec,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<OverrideSpec>,
    /// Defaults to the proxy's `failure_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
    #[serde(default)]
    pub response: ResponseSpec,
    /// Set: the rule decides Envoy's rate limit service (RLS) requests with these
    /// descriptors, and no HTTP request in the filter (see [`crate::rls`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor: Option<crate::rls::spec::DescriptorSpec>,
    /// How a rule with token limits reads usage and reserves it (LLM token budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensSpec>,
    /// What an over-limit request gets: `refuse` (the default) answers it at once;
    /// `delay` holds it until its tokens are due, within the rule's `delay` section.
    #[serde(default, skip_serializing_if = "OnLimit::is_refuse")]
    pub on_limit: OnLimit,
    /// With `on_limit: delay`: how long a request may be held and how many may wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelaySpec>,
    /// An elastic rule: a client over its own limit is still admitted while the rule's
    /// requests admitted in this Envoy, all clients together, stay under this ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticSpec>,
}

/// What an enforce-mode rule does with a request over its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    /// Answer at once with the rule's response (429).
    #[default]
    Refuse,
    /// Hold the request until its tokens are due, if that is within `delay.max_delay_ms`
    /// and the queues have room; refuse it otherwise (see `docs/shaping.md`).
    Delay,
}

impl OnLimit {
    pub fn is_refuse(&self) -> bool {
        *self == OnLimit::Refuse
    }
}

/// How long a delayed request may wait and how many may wait at once (`on_limit: delay`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelaySpec {
    /// The longest a request is held, in milliseconds: one due later is refused.
    pub max_delay_ms: u64,
    /// The most requests of one client waiting at once on one worker (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_per_key: Option<u32>,
    /// The most requests of this rule waiting at once on one worker (default 1,024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_per_worker: Option<u32>,
}

/// An elastic rule's ceiling (`elastic`): the rate, over all the rule's clients together in
/// one Envoy, under which clients may pass their own limits (see `docs/shaping.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticSpec {
    /// Requests (each costing the rule's `cost`) per `period`, all clients together.
    pub requests: u64,
    pub period: PeriodSpec,
    /// The ceiling's capacity; defaults to `requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

fn yes() -> bool {
    true
}

fn hundred() -> u8 {
    100
}

fn is_hundred(percent: &u8) -> bool {
    *percent == 100
}

/// What a matching request without a client key gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyMissingSpec {
    /// The rule does not apply to the request (counted).
    #[default]
    Skip,
    /// The request draws from the bucket of this client key (counted), e.g. `anonymous`.
    Fallback(String),
}

impl KeyMissingSpec {
    pub fn is_skip(&self) -> bool {
        *self == KeyMissingSpec::Skip
    }
}

/// `enforce` denies over-limit requests; `shadow` only counts what it would deny;
/// `warn` never denies either, but tells the client it is over the limit (the
/// `x-sluice-warning` response field) and counts it `warned`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
    Warn,
}

/// What to do when the rule cannot be evaluated (shared-data errors, contention).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Let the request through and count it.
    #[default]
    Open,
    /// Deny the request with the rule's response.
    Closed,
}

/// Which requests a rule applies to. Every given condition must hold; an empty match
/// applies to every request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// `api.example.com`, or `*.example.com` for any subdomain. Compared without the port,
    /// case-insensitively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// A regular expression that must match the whole path (query string excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatchSpec>,
    /// Conditions on values read as keys are (a JWT claim, a cookie, a certificate
    /// field...), e.g. `{value: {metadata: {...}}, equals: pro}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<ValueMatchSpec>,
}

/// A condition on one value read as a client key is. For a list in a decoded namespace
/// (see `identity::MetadataValue`), `equals` holds when any of its values equals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueMatchSpec {
    pub value: KeySpec,
    /// `true`: the value must be present; `false`: it must be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// The value must equal this exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
}

/// A condition on one request header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatchSpec {
    pub name: String,
    /// `true`: the header must be present; `false`: it must be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// The header's value must equal this exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
}

/// Whose bucket a request draws from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeySpec {
    /// The value of a request header, e.g. `x-api-key`.
    Header(String),
    /// The client's IP address.
    ClientIp(ClientIpSpec),
    /// The value of a query parameter.
    Query(String),
    /// The request path (query string excluded).
    Path,
    /// One bucket for everyone.
    Global,
    /// Several keys joined with `|`; missing when any part is missing.
    Composite(Vec<KeySpec>),
    /// A value another filter verified and left in the request's dynamic metadata, e.g.
    /// a JWT claim from `jwt_authn`'s `payload_in_metadata`, or what ext_authz or Lua set.
    Metadata(MetadataKeySpec),
    /// A field of the TLS peer's certificate, as Envoy verified it (mTLS).
    PeerCertificate(PeerCertificateField),
    /// The value of a cookie, by name.
    Cookie(String),
}

/// Where in the request's dynamic metadata a key is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataKeySpec {
    /// The metadata namespace, usually the name of the filter that wrote it, e.g.
    /// `envoy.filters.http.jwt_authn`.
    pub filter: String,
    /// The field's path inside the namespace, e.g. `[payload, sub]` (`payload` being
    /// `jwt_authn`'s `payload_in_metadata`). The filter reads each such value from Envoy
    /// (one property read per request); key on string values, since Envoy 1.40 hands
    /// numbers, booleans and lists over in a binary encoding.
    pub path: Vec<String>,
}

/// A field of the verified TLS peer certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerCertificateField {
    /// The first URI subject alternative name, e.g. a SPIFFE id.
    UriSan,
    /// The first DNS subject alternative name.
    DnsSan,
    /// The subject, e.g. `CN=client,O=Example`.
    Subject,
}

/// How to find the client's IP address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIpSpec {
    /// How many proxies in front of Envoy append to `X-Forwarded-For`. 0 uses the TCP
    /// peer; N uses the Nth address from the right of `X-Forwarded-For`.
    #[serde(default)]
    pub trusted_hops: u32,
}

/// One token bucket: `requests` per `period` (or, for a token limit, `tokens` of LLM usage
/// per `period`), holding at most `burst`; or an in-flight limit, `concurrent` alone.
/// Exactly one of `requests`, `tokens` and `concurrent` is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Required with `requests` or `tokens`; an in-flight limit (`concurrent`) has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<PeriodSpec>,
    /// The bucket's capacity; defaults to `requests` (or `tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// LLM tokens per period instead of requests: a token limit (the rule's `tokens`
    /// section says where usage is read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Which usage a token limit counts: `input`, `output` or `total` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<UsageMeasure>,
    /// `proxy` (default): each Envoy keeps its own bucket per client. `global`: one bucket
    /// per client for the whole fleet of Envoys that follow one admin API, still decided
    /// inside each Envoy from leases (see `docs/global-limits.md`).
    #[serde(default, skip_serializing_if = "Scope::is_proxy")]
    pub scope: Scope,
    /// An in-flight limit instead of a token bucket: at most this many of the client's
    /// requests in flight in this Envoy at once (all workers together), each holding its
    /// place until its stream ends. Given alone: no `requests`, `tokens`, `period`,
    /// `burst` or `count`, and `scope: proxy` (see `docs/shaping.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u64>,
    /// A soft limit: once the limit is spent, requests are still admitted (with the
    /// `x-sluice-warning` response field, counted `warned`) while the client stays within
    /// this percentage (1 to 100) over its rate and burst; beyond that, denied as usual.
    /// Only on a `requests` limit with `scope: proxy` (see `docs/shaping.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_percent: Option<u64>,
}

/// Whose bucket a limit is: one per Envoy, or one for the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    Proxy,
    Global,
}

impl Scope {
    pub fn is_proxy(&self) -> bool {
        *self == Scope::Proxy
    }
}

/// A period: `second`, `minute`, `hour`, `day`, or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PeriodSpec {
    Named(NamedPeriod),
    Seconds(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NamedPeriod {
    Second,
    Minute,
    Hour,
    Day,
}

impl PeriodSpec {
    /// The period in seconds (zero for an invalid `0`, which validation rejects).
    pub fn seconds(self) -> u64 {
        match self {
            PeriodSpec::Named(NamedPeriod::Second) => 1,
            PeriodSpec::Named(NamedPeriod::Minute) => 60,
            PeriodSpec::Named(NamedPeriod::Hour) => 3_600,
            PeriodSpec::Named(NamedPeriod::Day) => 86_400,
            PeriodSpec::Seconds(s) => s,
        }
    }
}

/// How many tokens one request takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CostSpec {
    /// The same cost for every request.
    Fixed(u64),
    /// The cost read from a request header, capped at `max`.
    Header(HeaderCostSpec),
}

impl Default for CostSpec {
    fn default() -> Self {
        CostSpec::Fixed(1)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderCostSpec {
    pub name: String,
    /// The highest cost a client can claim.
    pub max: u64,
    /// The cost when the header is missing or not a whole number.
    #[serde(default = "one")]
    pub default: u64,
}

fn one() -> u64 {
    1
}

/// Different limits for one client key, e.g. `acme` gets 500/s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideSpec {
    /// The client key exactly as the rule's `key` extracts it.
    pub client: String,
    pub limits: Vec<LimitSpec>,
}

/// What a denied client receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseSpec {
    #[serde(default = "too_many_requests")]
    pub status: u16,
    /// Whether to send `RateLimit-Policy`, `RateLimit` and `X-RateLimit-*` headers.
    #[serde(default = "yes")]
    pub rate_limit_headers: bool,
    /// The status a denied gRPC call gets (`status` is for plain HTTP). RESOURCE_EXHAUSTED
    /// by default, as Envoy's own rate-limit filters answer: gRPC clients and meshes treat
    /// UNAVAILABLE as retryable at once, the opposite of what a rate limiter wants.
    #[serde(default, skip_serializing_if = "GrpcStatus::is_default")]
    pub grpc_status: GrpcStatus,
}

/// A gRPC status code other than OK, by its name in the gRPC specification (snake case).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcStatus {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    #[default]
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcStatus {
    /// The number sent in `grpc-status`.
    pub fn code(self) -> u32 {
        self as u32
    }

    fn is_default(&self) -> bool {
        *self == GrpcStatus::default()
    }
}

fn too_many_requests() -> u16 {
    429
}

impl Default for ResponseSpec {
    fn default() -> Self {
        Self {
            status: too_many_requests(),
            rate_limit_headers: true,
            grpc_status: GrpcStatus::default(),
        }
    }
}

/// How a rule with token limits works: where the response reports usage, and what is
/// reserved when a request arrives (see the README's "LLM token budgets").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensSpec {
    /// Where the response reports its usage.
    pub usage: UsageSpec,
    /// Output tokens reserved when the request body names no `max_tokens`,
    /// `max_completion_tokens` or `max_output_tokens`.
    pub default_estimate: u64,
    /// Opt-in: also reserve input tokens, estimated as the request body's bytes / 4.
    #[serde(default, skip_serializing_if = "is_false")]
    pub estimate_input_from_body: bool,
    /// Opt-in: add `stream_options: {include_usage: true}` to streamed OpenAI chat
    /// requests (`"stream": true`), so the stream's last chunk carries the usage.
    #[serde(default, skip_serializing_if = "is_false")]
    pub include_usage: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Where a response reports its token usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSpec {
    /// OpenAI Chat Completions, or the Responses API for a path ending in `/responses`.
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Any other JSON: RFC 6901 pointers to `input`, `output` and/or `total`.
    JsonPointer(PointerSet),
}
