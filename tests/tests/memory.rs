//! Envoy's memory stays bounded by the slot table, whatever the number of clients.
//!
//! The run sends new clients until a million or a time limit, whichever comes first, so it
//! takes as long on a fast machine as on a slow one; the bench's memory section measures
//! the full million.
//!
//! Shared-data keys can never be deleted, so a filter that made one key per client would
//! grow by roughly 200 bytes per client: about 200 MiB for a million. Sluice keeps buckets
//! in a fixed table of slots and reclaims idle ones.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{Client, Envoy, EnvoyOptions, Req};

const SLOTS: u32 = 16_384;
/// What one slot can cost Envoy at most: about 94 bytes of map entry, the key string and a
/// value of up to 138 bytes, rounded up generously for allocator overhead.
const BYTES_PER_SLOT: u64 = 512;
const MIB: u64 = 1 << 20;

/// Distinct clients the run must reach beyond the baseline: ten times the slot table, so
/// every slot has been reclaimed many times over and a per-client cost could not hide.
const MIN_CLIENTS: u64 = 10 * SLOTS as u64;
/// Distinct clients the run aims for, and how long it may take to get there: a fast machine
/// sends a million, a slow or busy one stops at the time limit with fewer (but at least
/// `MIN_CLIENTS`), and the bound on memory is the same for both.
const TARGET_CLIENTS: u64 = 1_000_000;
const TIME_LIMIT: Duration = Duration::from_secs(150);

#[test]
fn distinct_clients_far_beyond_the_slot_table_leave_envoy_memory_flat() {
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "per-key", "key": {"header": "x-api-key"},
            "limits": [{"requests": 10, "period": "second"}]
        }]),
        slots: Some(SLOTS),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 32);
    let started = Instant::now();
    let run = |first: u64, count: u64, limit: Duration| {
        let counts = client.run_counting_for(count, limit, move |i| {
            Req::get("/").header("x-api-key", format!("client-{}", first + i))
        });
        assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
        assert_eq!(
            counts.total.get(200),
            counts.total.responses(),
            "every new client has a full bucket: {counts:?}"
        );
        counts
    };

    // Warm Envoy's own buffers and the table before the baseline.
    let warm = run(0, 50_000, TIME_LIMIT);
    let baseline = envoy.rss_bytes();
    let rest = run(
        warm.total.responses(),
        TARGET_CLIENTS - warm.total.responses(),
        TIME_LIMIT.saturating_sub(started.elapsed()),
    );
    let after = envoy.rss_bytes();
    let clients = rest.total.responses();

    eprintln!(
        "Envoy RSS: {:.1} MiB after {} clients, {:.1} MiB after {} more ({:.0} requests/s)",
        baseline as f64 / MIB as f64,
        warm.total.responses(),
        after as f64 / MIB as f64,
        clients,
        rest.rate(),
    );
    assert!(
        clients >= MIN_CLIENTS,
        "only {clients} new clients in {} s; the test needs {MIN_CLIENTS} to say anything",
        TIME_LIMIT.as_secs()
    );
    let growth = after.saturating_sub(baseline);
    let budget = u64::from(SLOTS) * BYTES_PER_SLOT + 8 * MIB;
    assert!(
        growth <= budget,
        "Envoy grew {:.1} MiB over {clients} new clients; the slot table allows {:.1} MiB",
        growth as f64 / MIB as f64,
        budget as f64 / MIB as f64
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_fail_open_total"), 0);
    assert_eq!(
        envoy.counter("wasmcustom.sluice_allowed_total"),
        warm.total.responses() + clients
    );
}
