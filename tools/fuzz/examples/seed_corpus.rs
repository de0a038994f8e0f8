//! Writes the committed seed corpus, `tools/fuzz/corpus/<target>/`, from the crates' own
//! encoders and the example rules file, so that every seed is a real, valid input and can
//! be regenerated when an encoding changes:
//!
//! ```sh
//! cargo run --manifest-path tools/fuzz/Cargo.toml --example seed_corpus
//! ```
//!
//! Both drivers of the targets (`sluice-fuzz-targets`) start from these seeds: libFuzzer
//! (`cargo xtask fuzz`) and the suite's corpus test, which replays them and mutates them.
//!
//! Targets that read structured input (`decide`, and what follows the bytes of a lease
//! entry or a bucket state) take any bytes; their seeds carry fixed pseudo-random bytes
//! so the first runs already reach past the first branches.

use std::fs;
use std::path::{Path, PathBuf};

use sluice_core::config::{ControlConfigSpec, FilterConfigSpec};
use sluice_core::control::election::{Lease, Role};
use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, Grant, Usage};
use sluice_core::global::lease::{FleetView, LeaseEntry};
use sluice_core::identity::encode_struct;
use sluice_core::global::sync::{BucketUsage, SyncRequest, SyncResponse};
use sluice_core::report::{ClientCount, ClientRequests, Report, RuleBatch, RuleCounts, RuleReport};
use sluice_core::slot::SlotValue;
use sluice_core::spec::{FailureMode, RuleSpec};
use sluice_core::time::Nanos;
use sluice_core::wire::RulesetDocument;

const SECOND: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SECOND;

fn main() {
    let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = Corpus(fuzz_dir.join("corpus"));
    let rules_yaml = fs::read_to_string(fuzz_dir.join("../../examples/rules.yaml"))
        .expect("the example rules file is readable");
    let rules: Vec<RuleSpec> = sluice_rules_file::parse_rules(
        &rules_yaml,
        sluice_rules_file::RulesFormat::Yaml,
        Path::new("examples/rules.yaml"),
    )
    .expect("the example rules file parses");
    let rules_json = serde_json::to_string_pretty(&rules).expect("rules serialise");

    // Slots: empty, a client with two limits, and a full slot.
    let mut slot = SlotValue::owned_by(0x5eed);
    corpus.write("slot_value", "empty", &encoded_slot(&slot));
    slot.set(11, T0 + SECOND, T0);
    slot.set(12, T0 + 60 * SECOND, T0);
    corpus.write("slot_value", "two-buckets", &encoded_slot(&slot));
    for identity in 13..=20 {
        slot.set(identity, T0 + identity * SECOND, T0);
    }
    corpus.write("slot_value", "full", &encoded_slot(&slot));

    // Lease entries: new, spent from its even share, and leased after an answer.
    let limit = Gcra::per_second(10, 20).expect("a valid limit");
    let view = FleetView {
        fleet_size: 3,
        fallback: false,
        sync_interval_ns: SECOND / 4,
    };
    let mut entry = LeaseEntry::new(0xb0c4e7, &limit, Nanos::new(T0));
    corpus.write("lease_entry", "new", &with_noise(&entry.encode(), 1));
    entry.spend(1, Nanos::new(T0), &view);
    corpus.write("lease_entry", "spent", &with_noise(&entry.encode(), 2));
    entry.collect(Nanos::new(T0 + SECOND / 4), Nanos::new(SECOND / 4), &view);
    let grant = Grant {
        granted: 5,
        share_ppm: 400_000,
        full_in_ns: SECOND,
        young: false,
    };
    entry.apply(&grant, Nanos::new(T0 + SECOND / 4), &view);
    corpus.write("lease_entry", "leased", &with_noise(&entry.encode(), 3));

    corpus.write("fleet_view", "alone", &FleetView::ALONE.encode());
    corpus.write("fleet_view", "three-proxies", &view.encode());

    // Dynamic metadata as jwt_authn leaves a verified token's payload.
    corpus.write(
        "metadata_struct",
        "jwt-payload",
        &encode_struct(&serde_json::json!({"claims": {
            "sub": "alice", "exp": 4102444800u64, "groups": ["eng", "ops"],
            "org": {"id": "acme", "plan": "pro"}, "admin": false, "none": null,
        }})),
    );
    corpus.write(
        "metadata_struct",
        "ext-authz",
        &encode_struct(&serde_json::json!({"tenant": "t-1", "ratio": 0.25})),
    );

    // The control lease: a worker's, fresh, and the singleton's, released; each with the
    // 8 bytes of the time that follow the lease in the target's input.
    let worker = Lease {
        holder: Role::Worker,
        term: 7,
        expires: Nanos::new(T0 + 3 * SECOND),
    };
    let singleton = Lease {
        holder: Role::Singleton,
        term: 8,
        expires: Nanos::ZERO,
    };
    for (name, lease) in [("worker", worker), ("singleton-released", singleton)] {
        let mut seed = lease.encode().to_vec();
        seed.extend_from_slice(&(T0 + SECOND).to_le_bytes());
        corpus.write("control_lease", name, &seed);
    }

    let quiet = BucketState::default();
    corpus.write("bucket_state", "full", &with_noise(&quiet.encode(), 4));
    let busy = BucketState {
        tat: (1 << 40) + 2 * SECOND,
        demand: 42.5,
        demand_at: (1 << 40) + SECOND,
        born_at: 1 << 40,
        first_seen: 1 << 40,
    };
    corpus.write("bucket_state", "busy", &with_noise(&busy.encode(), 5));

    let usage = Usage {
        attempts: 12,
        unleased: 3,
        returned: 0,
        want: 18,
        first_use_ns: 0,
        known_full_in_ns: 0,
    };
    let sync = SyncRequest {
        proxy: "envoy-1".into(),
        interval_ms: 250,
        covers_ms: 250,
        seq: 1_700_000_000_000,
        buckets: vec![
            BucketUsage::new(0xb0c4e7, limit.interval_ns(), limit.burst(), &usage),
            BucketUsage::new(u64::MAX, SECOND, 1, &Usage::default()),
        ],
        next_sync_ms: 0,
    };
    corpus.write("sync_request", "two-buckets", &sync.to_json());
    let answer = SyncResponse {
        fleet_size: 3,
        warming_up: false,
        grants: vec![grant, Grant::default()],
    };
    corpus.write("sync_response", "two-grants", &json(&answer));
    let warming = SyncResponse {
        fleet_size: 1,
        warming_up: true,
        grants: vec![],
    };
    corpus.write("sync_response", "warming-up", &json(&warming));

    let document = RulesetDocument {
        version: 7,
        rules: rules.clone(),
    };
    corpus.write(
        "ruleset_document",
        "example-shared-data",
        &document.encode(),
    );
    corpus.write("ruleset_document", "example-json", &json(&document));
    let empty = RulesetDocument {
        version: 1,
        rules: vec![],
    };
    corpus.write("ruleset_document", "empty-shared-data", &empty.encode());

    let batch = RuleBatch {
        rules: vec![
            RuleReport {
                rule: "api-per-key".into(),
                counts: RuleCounts {
                    allowed: 120,
                    denied: 7,
                    near_limit: 30,
                    ..RuleCounts::default()
                },
                top_clients: vec![
                    ClientCount {
                        client: "alice".into(),
                        throttled: 5,
                        error: 0,
                        tokens: 0,
                    },
                    ClientCount {
                        client: "bob".into(),
                        throttled: 2,
                        error: 1,
                        tokens: 40,
                    },
                ],
                top_requesters: vec![ClientRequests {
                    client: "alice".into(),
                    requests: 90,
                    error: 0,
                }],
            },
            RuleReport {
                rule: "per-ip-shadow".into(),
                counts: RuleCounts {
                    allowed: 40,
                    shadow_denied: 3,
                    key_missing: 1,
                    ..RuleCounts::default()
                },
                top_clients: vec![],
                top_requesters: vec![],
            },
        ],
        overflow: 0,
    };
    corpus.write("rule_batch", "two-rules", &batch.encode());
    corpus.write("rule_batch", "empty", &RuleBatch::default().encode());
    let report = Report {
        proxy_id: "envoy-1".into(),
        start_ms: 1_700_000_000_000,
        end_ms: 1_700_000_002_000,
        ruleset_version: 7,
        batch,
        dropped_reports: 0,
    };
    corpus.write("report_json", "two-rules", &report.to_json());

    let config = FilterConfigSpec {
        rules: rules.clone(),
        failure_mode: FailureMode::Closed,
        ..FilterConfigSpec::default()
    };
    corpus.write("filter_config", "example-rules", &json(&config));
    corpus.write("filter_config", "defaults", b"{}");
    let control = ControlConfigSpec {
        admin_cluster: "sluice_admin".into(),
        admin_authority: "127.0.0.1:8080".into(),
        token: "slc_proxy_token".into(),
        proxy_id: Some("envoy-1".into()),
        poll_timeout_seconds: 30,
        report_interval_seconds: 2,
        sync_interval_ms: 250,
    };
    corpus.write("control_config", "full", &json(&control));

    // The rules file target's first byte picks the syntax: even JSON, odd YAML.
    corpus.write(
        "rules_file",
        "example-yaml",
        &prefixed(1, rules_yaml.as_bytes()),
    );
    corpus.write(
        "rules_file",
        "example-json",
        &prefixed(0, rules_json.as_bytes()),
    );
    let wrapped = format!("{{\"rules\":{rules_json}}}");
    corpus.write(
        "rules_file",
        "wrapped-json",
        &prefixed(0, wrapped.as_bytes()),
    );

    for (seed, len) in [(6, 256), (7, 1024), (8, 4096)] {
        corpus.write("decide", &format!("noise-{len}"), &noise(seed, len));
    }

    // The usage reader's first byte picks the format (0 OpenAI Chat, 1 OpenAI Responses,
    // 2 Anthropic Messages, 3 JSON pointers), its second the framing (odd: an event
    // stream) and, in its other bits, the chunk size less one (7 and 16 bytes here); the
    // bodies are the core's provider fixtures.
    for (name, format, body) in USAGE_FIXTURES {
        let framing = if name.ends_with(".sse") {
            6 << 1 | 1
        } else {
            15 << 1
        };
        corpus.write(
            "usage_reader",
            name,
            &[&[*format, framing][..], body].concat(),
        );
    }
}

/// The usage reader's seeds: the fixtures of `core/tests/usage.rs`, each with its format.
const USAGE_FIXTURES: &[(&str, u8, &[u8])] = &[
    (
        "openai_chat.json",
        0,
        include_bytes!("../../../core/tests/fixtures/usage/openai_chat.json"),
    ),
    (
        "openai_chat.sse",
        0,
        include_bytes!("../../../core/tests/fixtures/usage/openai_chat.sse"),
    ),
    (
        "openai_responses.json",
        1,
        include_bytes!("../../../core/tests/fixtures/usage/openai_responses.json"),
    ),
    (
        "openai_responses.sse",
        1,
        include_bytes!("../../../core/tests/fixtures/usage/openai_responses.sse"),
    ),
    (
        "anthropic_messages.json",
        2,
        include_bytes!("../../../core/tests/fixtures/usage/anthropic_messages.json"),
    ),
    (
        "anthropic_messages.sse",
        2,
        include_bytes!("../../../core/tests/fixtures/usage/anthropic_messages.sse"),
    ),
    (
        "gemini_pointer.json",
        3,
        include_bytes!("../../../core/tests/fixtures/usage/gemini_pointer.json"),
    ),
    (
        "gemini_pointer.sse",
        3,
        include_bytes!("../../../core/tests/fixtures/usage/gemini_pointer.sse"),
    ),
];

struct Corpus(PathBuf);

impl Corpus {
    fn write(&self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.0.join(target);
        fs::create_dir_all(&dir).expect("the corpus folder can be created");
        fs::write(dir.join(name), bytes).expect("the seed can be written");
    }
}

fn encoded_slot(slot: &SlotValue) -> Vec<u8> {
    let mut out = Vec::new();
    slot.encode(&mut out);
    out
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain data serialises")
}

fn prefixed(first: u8, rest: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    out.extend_from_slice(rest);
    out
}

/// `bytes`, then 256 fixed pseudo-random bytes for what the target reads after them.
fn with_noise(bytes: &[u8], seed: u64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.extend(noise(seed, 256));
    out
}

/// Deterministic bytes (xorshift64*), so regenerating the corpus changes nothing.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}
