//! Envoy's memory stays bounded by the slot table, whatever the number of clients.
//!
//! Shared-data keys can never be deleted, so a filter that made one key per client would
//! grow by roughly 200 bytes per client: about 200 MiB for a million. Sluice keeps buckets
//! in a fixed table of slots and reclaims idle ones.

use serde_json::json;
use sluice_tests::{Client, Envoy, EnvoyOptions, Req};

const SLOTS: u32 = 16_384;
/// What one slot can cost Envoy at most: about 94 bytes of map entry, the key string and a
/// value of up to 138 bytes, rounded up generously for allocator overhead.
const BYTES_PER_SLOT: u64 = 512;
const MIB: u64 = 1 << 20;

#[test]
fn a_million_distinct_clients_leave_envoy_memory_flat() {
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "per-key", "key": {"header": "x-api-key"},
            "limits": [{"requests": 10, "period": "second"}]
        }]),
        slots: Some(SLOTS),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 32);
    let run = |first: u64, count: u64| {
        let counts = client.run_counting(count, move |i| {
            Req::get("/").header("x-api-key", format!("client-{}", first + i))
        });
        assert_eq!(counts.errors, 0, "{:?}", counts.first_error);
        assert_eq!(
            counts.get(200),
            count,
            "every new client has a full bucket: {counts:?}"
        );
        counts
    };

    // Warm Envoy's own buffers and the table before the baseline.
    run(0, 50_000);
    let baseline = envoy.rss_bytes();
    let first = run(50_000, 100_000);
    let after_150k = envoy.rss_bytes();
    let rest = run(150_000, 850_000);
    let after_1m = envoy.rss_bytes();

    eprintln!(
        "Envoy RSS: {:.1} MiB after 50k clients, {:.1} MiB after 150k, {:.1} MiB after 1M \
         ({:.0} and {:.0} requests/s)",
        baseline as f64 / MIB as f64,
        after_150k as f64 / MIB as f64,
        after_1m as f64 / MIB as f64,
        first.rate(),
        rest.rate(),
    );
    let growth = after_1m.saturating_sub(baseline);
    let budget = u64::from(SLOTS) * BYTES_PER_SLOT + 8 * MIB;
    assert!(
        growth <= budget,
        "Envoy grew {:.1} MiB over 950k new clients; the slot table allows {:.1} MiB",
        growth as f64 / MIB as f64,
        budget as f64 / MIB as f64
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_fail_open_total"), 0);
    assert_eq!(envoy.counter("wasmcustom.sluice_allowed_total"), 1_000_000);
}
