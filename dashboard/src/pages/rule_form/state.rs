//! The form's state: one typed signal per input, grouped as the model's [`Draft`] is.
//! What the inputs mean is decided by the plain [`Draft`] they are read into (tested on
//! the host, in `sluice-dashboard-model`).

use std::sync::atomic::{AtomicUsize, Ordering};

use leptos::prelude::*;
use sluice_core::rls::DescriptorSpec;
use sluice_core::spec::{
    FailureMode, GrpcStatus, KeyMissingSpec, Mode, Scope, TokensSpec, ValueMatchSpec,
};
use sluice_dashboard_model::draft::{
    CostDraft, CostKind, Draft, HeaderCondition, HeaderDraft, KeyDraft, KeyKind, LimitDraft,
    MatchDraft, Number, OverrideDraft, PeriodChoice, TokenCount,
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
    pub requests: RwSignal<Number<u64>>,
    pub period: RwSignal<PeriodChoice>,
    pub seconds: RwSignal<Number<u64>>,
    pub burst: RwSignal<Number<u64>>,
    pub scope: RwSignal<Scope>,
    /// A token limit as loaded (no input of its own yet).
    pub tokens: Option<TokenCount>,
    /// An in-flight limit as loaded (no input of its own yet).
    pub in_flight: bool,
}

impl LimitRow {
    pub fn new(d: LimitDraft) -> LimitRow {
        LimitRow {
            id: row_id(),
            requests: RwSignal::new(d.requests),
            period: RwSignal::new(d.period),
            seconds: RwSignal::new(d.seconds),
            burst: RwSignal::new(d.burst),
            scope: RwSignal::new(d.scope),
            tokens: d.tokens,
            in_flight: d.in_flight,
        }
    }

    pub fn read(&self) -> LimitDraft {
        LimitDraft {
            requests: self.requests.get(),
            period: self.period.get(),
            seconds: self.seconds.get(),
            burst: self.burst.get(),
            scope: self.scope.get(),
            tokens: self.tokens,
            in_flight: self.in_flight,
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
    /// No input shows them; kept so that saving the form does not drop them.
    pub values: RwSignal<Vec<ValueMatchSpec>>,
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
            values: RwSignal::new(d.values),
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
            values: self.values.get(),
        }
    }
}

/// Whose bucket: the client key's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyInputs {
    pub kind: RwSignal<KeyKind>,
    pub name: RwSignal<String>,
    pub hops: RwSignal<Number<u32>>,
}

impl KeyInputs {
    fn new(d: KeyDraft) -> KeyInputs {
        KeyInputs {
            kind: RwSignal::new(d.kind),
            name: RwSignal::new(d.name),
            hops: RwSignal::new(d.hops),
        }
    }

    fn read(&self) -> KeyDraft {
        KeyDraft {
            kind: self.kind.get(),
            name: self.name.get(),
            hops: self.hops.get(),
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
    /// No input shows it yet (a token budget's settings); kept like `grpc_status`.
    pub tokens: RwSignal<Option<TokensSpec>>,
    /// No input shows it yet; kept like `grpc_status`.
    pub key_missing: RwSignal<KeyMissingSpec>,
    /// No input shows it yet; kept like `grpc_status`.
    pub enforce_percent: RwSignal<u8>,
    /// Not an input yet: what an over-limit request gets, kept as loaded.
    pub on_limit: RwSignal<sluice_core::spec::OnLimit>,
    /// Not an input yet: the delay queue's settings, kept as loaded.
    pub delay: RwSignal<Option<sluice_core::spec::DelaySpec>>,
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
            limits: RwSignal::new(limit_rows(d.limits)),
            cost: CostInputs::new(d.cost),
            overrides: RwSignal::new(d.overrides.into_iter().map(OverrideRow::new).collect()),
            failure_mode: RwSignal::new(d.failure_mode),
            status: RwSignal::new(d.status),
            rate_limit_headers: RwSignal::new(d.rate_limit_headers),
            grpc_status: RwSignal::new(d.grpc_status),
            descriptor: RwSignal::new(d.descriptor),
            tokens: RwSignal::new(d.tokens),
            key_missing: RwSignal::new(d.key_missing),
            enforce_percent: RwSignal::new(d.enforce_percent),
            on_limit: RwSignal::new(d.on_limit),
            delay: RwSignal::new(d.delay),
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
            tokens: self.tokens.get(),
            key_missing: self.key_missing.get(),
            enforce_percent: self.enforce_percent.get(),
            on_limit: self.on_limit.get(),
            delay: self.delay.get(),
        }
    }
}
