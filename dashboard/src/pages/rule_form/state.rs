//! The form's state: one typed signal per input, grouped as the model's [`Draft`] is.
//! What the inputs mean is decided by the plain [`Draft`] they are read into (tested on
//! the host, in `sluice-dashboard-model`).

use std::sync::atomic::{AtomicUsize, Ordering};

use leptos::prelude::*;
use sluice_core::rls::DescriptorSpec;
use sluice_core::spec::{FailureMode, GrpcStatus, Mode, OnLimit, PeerCertificateField, Scope};
use sluice_dashboard_model::draft::{
    CostDraft, CostKind, DelayDraft, Draft, ElasticDraft, HeaderCondition, HeaderDraft, KeyDraft,
    KeyKind, KeyMissing, KeyMissingDraft, LimitCounts, LimitDraft, MatchDraft, Number,
    OverrideDraft, PeriodChoice, TokensDraft, UsageKind, ValueDraft,
};

static NEXT_ROW: AtomicUsize = AtomicUsize::new(1);

/// A key for a new row of a list (limits, headers, overrides), so that `<For>` keeps each
/// row's inputs while rows above it come and go.
fn row_id() -> usize {
    NEXT_ROW.fetch_add(1, Ordering::Relaxed)
}

/// One limit's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct LimitRow {
    pub id: usize,
    pub counts: RwSignal<LimitCounts>,
    pub requests: RwSignal<Number<u64>>,
    pub period: RwSignal<PeriodChoice>,
    pub seconds: RwSignal<Number<u64>>,
    pub burst: RwSignal<Number<u64>>,
    pub scope: RwSignal<Scope>,
    pub soft_percent: RwSignal<Number<u64>>,
}

impl LimitRow {
    pub fn new(d: LimitDraft) -> LimitRow {
        LimitRow {
            id: row_id(),
            counts: RwSignal::new(d.counts),
            requests: RwSignal::new(d.requests),
            period: RwSignal::new(d.period),
            seconds: RwSignal::new(d.seconds),
            burst: RwSignal::new(d.burst),
            scope: RwSignal::new(d.scope),
            soft_percent: RwSignal::new(d.soft_percent),
        }
    }

    pub fn read(&self) -> LimitDraft {
        LimitDraft {
            counts: self.counts.get(),
            requests: self.requests.get(),
            period: self.period.get(),
            seconds: self.seconds.get(),
            burst: self.burst.get(),
            scope: self.scope.get(),
            soft_percent: self.soft_percent.get(),
        }
    }
}

fn limit_rows(limits: Vec<LimitDraft>) -> Vec<LimitRow> {
    limits.into_iter().map(LimitRow::new).collect()
}

fn read_limits(rows: RwSignal<Vec<LimitRow>>) -> Vec<LimitDraft> {
    rows.with(|rs| rs.iter().map(LimitRow::read).collect())
}

/// One header condition's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeaderRow {
    pub id: usize,
    pub name: RwSignal<String>,
    pub condition: RwSignal<HeaderCondition>,
    pub value: RwSignal<String>,
}

impl HeaderRow {
    pub fn new(d: HeaderDraft) -> HeaderRow {
        HeaderRow {
            id: row_id(),
            name: RwSignal::new(d.name),
            condition: RwSignal::new(d.condition),
            value: RwSignal::new(d.value),
        }
    }

    fn read(&self) -> HeaderDraft {
        HeaderDraft {
            name: self.name.get(),
            condition: self.condition.get(),
            value: self.value.get(),
        }
    }
}

/// One `match.values` condition's inputs: where the value is read, and what is asked of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ValueRow {
    pub id: usize,
    pub source: KeyInputs,
    pub condition: RwSignal<HeaderCondition>,
    pub value: RwSignal<String>,
}

impl ValueRow {
    pub fn new(d: ValueDraft) -> ValueRow {
        ValueRow {
            id: row_id(),
            source: KeyInputs::new(d.source),
            condition: RwSignal::new(d.condition),
            value: RwSignal::new(d.value),
        }
    }

    fn read(&self) -> ValueDraft {
        ValueDraft {
            source: self.source.read(),
            condition: self.condition.get(),
            value: self.value.get(),
        }
    }
}

/// One part of a composite key: a key's inputs of its own.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyPartRow {
    pub id: usize,
    pub key: KeyInputs,
}

impl KeyPartRow {
    pub fn new(d: KeyDraft) -> KeyPartRow {
        KeyPartRow {
            id: row_id(),
            key: KeyInputs::new(d),
        }
    }
}

/// One per-client override's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct OverrideRow {
    pub id: usize,
    pub client: RwSignal<String>,
    pub limits: RwSignal<Vec<LimitRow>>,
}

impl OverrideRow {
    pub fn new(d: OverrideDraft) -> OverrideRow {
        OverrideRow {
            id: row_id(),
            client: RwSignal::new(d.client),
            limits: RwSignal::new(limit_rows(d.limits)),
        }
    }

    fn read(&self) -> OverrideDraft {
        OverrideDraft {
            client: self.client.get(),
            limits: read_limits(self.limits),
        }
    }
}

/// Which requests: the match's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct MatchInputs {
    pub host: RwSignal<String>,
    pub path_prefix: RwSignal<String>,
    pub path_exact: RwSignal<String>,
    pub path_regex: RwSignal<String>,
    pub methods: RwSignal<String>,
    pub headers: RwSignal<Vec<HeaderRow>>,
    pub values: RwSignal<Vec<ValueRow>>,
}

impl MatchInputs {
    fn new(d: MatchDraft) -> MatchInputs {
        MatchInputs {
            host: RwSignal::new(d.host),
            path_prefix: RwSignal::new(d.path_prefix),
            path_exact: RwSignal::new(d.path_exact),
            path_regex: RwSignal::new(d.path_regex),
            methods: RwSignal::new(d.methods),
            headers: RwSignal::new(d.headers.into_iter().map(HeaderRow::new).collect()),
            values: RwSignal::new(d.values.into_iter().map(ValueRow::new).collect()),
        }
    }

    fn read(&self) -> MatchDraft {
        MatchDraft {
            host: self.host.get(),
            path_prefix: self.path_prefix.get(),
            path_exact: self.path_exact.get(),
            path_regex: self.path_regex.get(),
            methods: self.methods.get(),
            headers: self
                .headers
                .with(|hs| hs.iter().map(HeaderRow::read).collect()),
            values: self
                .values
                .with(|vs| vs.iter().map(ValueRow::read).collect()),
        }
    }
}

/// Whose bucket: the client key's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyInputs {
    pub kind: RwSignal<KeyKind>,
    pub name: RwSignal<String>,
    pub hops: RwSignal<Number<u32>>,
    pub metadata_filter: RwSignal<String>,
    pub metadata_path: RwSignal<String>,
    pub certificate: RwSignal<PeerCertificateField>,
    /// A composite key's parts (unused by a part itself).
    pub parts: RwSignal<Vec<KeyPartRow>>,
}

impl KeyInputs {
    fn new(d: KeyDraft) -> KeyInputs {
        KeyInputs {
            kind: RwSignal::new(d.kind),
            name: RwSignal::new(d.name),
            hops: RwSignal::new(d.hops),
            metadata_filter: RwSignal::new(d.metadata_filter),
            metadata_path: RwSignal::new(d.metadata_path),
            certificate: RwSignal::new(d.certificate),
            parts: RwSignal::new(d.parts.into_iter().map(KeyPartRow::new).collect()),
        }
    }

    fn read(&self) -> KeyDraft {
        KeyDraft {
            kind: self.kind.get(),
            name: self.name.get(),
            hops: self.hops.get(),
            metadata_filter: self.metadata_filter.get(),
            metadata_path: self.metadata_path.get(),
            certificate: self.certificate.get(),
            parts: self
                .parts
                .with(|ps| ps.iter().map(|p| p.key.read()).collect()),
        }
    }
}

/// What a request without a key gets: `key_missing`'s inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyMissingInputs {
    pub choice: RwSignal<KeyMissing>,
    pub fallback: RwSignal<String>,
}

impl KeyMissingInputs {
    fn new(d: KeyMissingDraft) -> KeyMissingInputs {
        KeyMissingInputs {
            choice: RwSignal::new(d.choice),
            fallback: RwSignal::new(d.fallback),
        }
    }

    fn read(&self) -> KeyMissingDraft {
        KeyMissingDraft {
            choice: self.choice.get(),
            fallback: self.fallback.get(),
        }
    }
}

/// The token budget's inputs (the rule's `tokens` section).
#[derive(Debug, Clone, Copy)]
pub(super) struct TokensInputs {
    pub usage: RwSignal<Option<UsageKind>>,
    pub input_pointer: RwSignal<String>,
    pub output_pointer: RwSignal<String>,
    pub total_pointer: RwSignal<String>,
    pub default_estimate: RwSignal<Number<u64>>,
    pub estimate_input_from_body: RwSignal<bool>,
    pub include_usage: RwSignal<bool>,
}

impl TokensInputs {
    fn new(d: TokensDraft) -> TokensInputs {
        TokensInputs {
            usage: RwSignal::new(d.usage),
            input_pointer: RwSignal::new(d.input_pointer),
            output_pointer: RwSignal::new(d.output_pointer),
            total_pointer: RwSignal::new(d.total_pointer),
            default_estimate: RwSignal::new(d.default_estimate),
            estimate_input_from_body: RwSignal::new(d.estimate_input_from_body),
            include_usage: RwSignal::new(d.include_usage),
        }
    }

    fn read(&self) -> TokensDraft {
        TokensDraft {
            usage: self.usage.get(),
            input_pointer: self.input_pointer.get(),
            output_pointer: self.output_pointer.get(),
            total_pointer: self.total_pointer.get(),
            default_estimate: self.default_estimate.get(),
            estimate_input_from_body: self.estimate_input_from_body.get(),
            include_usage: self.include_usage.get(),
        }
    }
}

/// What an over-limit request gets, and the delay queue's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct DelayInputs {
    pub on_limit: RwSignal<OnLimit>,
    pub max_delay_ms: RwSignal<Number<u64>>,
    pub queue_per_key: RwSignal<Number<u32>>,
    pub queue_per_worker: RwSignal<Number<u32>>,
}

impl DelayInputs {
    fn new(d: DelayDraft) -> DelayInputs {
        DelayInputs {
            on_limit: RwSignal::new(d.on_limit),
            max_delay_ms: RwSignal::new(d.max_delay_ms),
            queue_per_key: RwSignal::new(d.queue_per_key),
            queue_per_worker: RwSignal::new(d.queue_per_worker),
        }
    }

    fn read(&self) -> DelayDraft {
        DelayDraft {
            on_limit: self.on_limit.get(),
            max_delay_ms: self.max_delay_ms.get(),
            queue_per_key: self.queue_per_key.get(),
            queue_per_worker: self.queue_per_worker.get(),
        }
    }
}

/// The elastic switch and the ceiling's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct ElasticInputs {
    pub on: RwSignal<bool>,
    pub requests: RwSignal<Number<u64>>,
    pub period: RwSignal<PeriodChoice>,
    pub seconds: RwSignal<Number<u64>>,
    pub burst: RwSignal<Number<u64>>,
}

impl ElasticInputs {
    fn new(d: ElasticDraft) -> ElasticInputs {
        ElasticInputs {
            on: RwSignal::new(d.on),
            requests: RwSignal::new(d.requests),
            period: RwSignal::new(d.period),
            seconds: RwSignal::new(d.seconds),
            burst: RwSignal::new(d.burst),
        }
    }

    fn read(&self) -> ElasticDraft {
        ElasticDraft {
            on: self.on.get(),
            requests: self.requests.get(),
            period: self.period.get(),
            seconds: self.seconds.get(),
            burst: self.burst.get(),
        }
    }
}

/// The cost's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct CostInputs {
    pub kind: RwSignal<CostKind>,
    pub fixed: RwSignal<Number<u64>>,
    pub header: RwSignal<String>,
    pub max: RwSignal<Number<u64>>,
    pub default: RwSignal<Number<u64>>,
}

impl CostInputs {
    fn new(d: CostDraft) -> CostInputs {
        CostInputs {
            kind: RwSignal::new(d.kind),
            fixed: RwSignal::new(d.fixed),
            header: RwSignal::new(d.header),
            max: RwSignal::new(d.max),
            default: RwSignal::new(d.default),
        }
    }

    fn read(&self) -> CostDraft {
        CostDraft {
            kind: self.kind.get(),
            fixed: self.fixed.get(),
            header: self.header.get(),
            max: self.max.get(),
            default: self.default.get(),
        }
    }
}

/// Every input of the form.
#[derive(Debug, Clone, Copy)]
pub(super) struct FormState {
    pub id: RwSignal<String>,
    pub name: RwSignal<String>,
    pub description: RwSignal<String>,
    pub priority: RwSignal<Number<i32>>,
    pub enabled: RwSignal<bool>,
    pub mode: RwSignal<Mode>,
    pub matcher: MatchInputs,
    pub key: KeyInputs,
    pub key_missing: KeyMissingInputs,
    pub enforce_percent: RwSignal<Number<u8>>,
    pub limits: RwSignal<Vec<LimitRow>>,
    pub cost: CostInputs,
    pub overrides: RwSignal<Vec<OverrideRow>>,
    pub failure_mode: RwSignal<Option<FailureMode>>,
    pub status: RwSignal<Number<u16>>,
    pub rate_limit_headers: RwSignal<bool>,
    /// No input shows it; kept so that saving the form does not reset it.
    pub grpc_status: RwSignal<GrpcStatus>,
    /// A rate limit service rule's descriptor: no input shows it either, kept the same way.
    pub descriptor: RwSignal<Option<DescriptorSpec>>,
    pub tokens: TokensInputs,
    pub delay: DelayInputs,
    pub elastic: ElasticInputs,
}

impl FormState {
    /// Fresh inputs showing `d`.
    pub fn new(d: Draft) -> FormState {
        FormState {
            id: RwSignal::new(d.id),
            name: RwSignal::new(d.name),
            description: RwSignal::new(d.description),
            priority: RwSignal::new(d.priority),
            enabled: RwSignal::new(d.enabled),
            mode: RwSignal::new(d.mode),
            matcher: MatchInputs::new(d.matcher),
            key: KeyInputs::new(d.key),
            key_missing: KeyMissingInputs::new(d.key_missing),
            enforce_percent: RwSignal::new(d.enforce_percent),
            limits: RwSignal::new(limit_rows(d.limits)),
            cost: CostInputs::new(d.cost),
            overrides: RwSignal::new(d.overrides.into_iter().map(OverrideRow::new).collect()),
            failure_mode: RwSignal::new(d.failure_mode),
            status: RwSignal::new(d.status),
            rate_limit_headers: RwSignal::new(d.rate_limit_headers),
            grpc_status: RwSignal::new(d.grpc_status),
            descriptor: RwSignal::new(d.descriptor),
            tokens: TokensInputs::new(d.tokens),
            delay: DelayInputs::new(d.delay),
            elastic: ElasticInputs::new(d.elastic),
        }
    }

    /// The inputs' current values (tracked, so a memo over this re-runs as they change).
    pub fn read(&self) -> Draft {
        Draft {
            id: self.id.get(),
            name: self.name.get(),
            description: self.description.get(),
            priority: self.priority.get(),
            enabled: self.enabled.get(),
            mode: self.mode.get(),
            matcher: self.matcher.read(),
            key: self.key.read(),
            key_missing: self.key_missing.read(),
            enforce_percent: self.enforce_percent.get(),
            limits: read_limits(self.limits),
            cost: self.cost.read(),
            overrides: self
                .overrides
                .with(|os| os.iter().map(OverrideRow::read).collect()),
            failure_mode: self.failure_mode.get(),
            status: self.status.get(),
            rate_limit_headers: self.rate_limit_headers.get(),
            grpc_status: self.grpc_status.get(),
            descriptor: self.descriptor.get(),
            tokens: self.tokens.read(),
            delay: self.delay.read(),
            elastic: self.elastic.read(),
        }
    }
}
