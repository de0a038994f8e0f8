//! Token budgets through a real Envoy (two workers) in front of the harness's fake LLM
//! API: reservations, the usage committed exactly, refunds, and bad usage charged the
//! reservation and passed through unchanged.
//!
//! Budgets that must not refill during a test refill one token every 120 s, so what the
//! bucket holds after a run is exactly its burst less what was charged; a probe reads it
//! from `X-RateLimit-Remaining` (the probe reserves one token and is answered 500, which
//! refunds it). The exactness and refund checks run the 10,000 requests whatever
//! they take (a deadline far beyond any machine's need only stops a hung run); the other
//! loads run for a duration, never a count that assumes a speed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};
use sluice_harness::llm::{LlmOptions, LlmUpstream};
use sluice_tests::h2::{H2Call, H2Load, H2Outcome, h2_run};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Target, wait_for};

/// A burst that 120 s per token cannot refill within a test, that [`MANY`] mixed requests
/// cannot spend (their usage is about 14 million tokens per rule), and whose refill time
/// fits the 146 years a bucket may hold.
const BIG: u64 = 30_000_000;

/// How many requests the exactness and refund checks send.
const MANY: u64 = 10_000;

/// What a run of [`MANY`] requests may take before it is called hung: far beyond what
/// the slowest machine needs, so it never decides a result.
const MANY_DEADLINE: Duration = Duration::from_secs(300);

fn envoy_for(llm: &LlmUpstream, rules: Value) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules,
        upstream: Target::Cluster(llm.addr()),
        ..Default::default()
    })
}

/// A rule for `path_prefix` with one token limit per API key of `burst` tokens, refilled
/// one token every 120 s.
fn slow_budget(name: &str, prefix: &str, usage: &str, burst: u64, tokens: Value) -> Value {
    let mut section = json!({"usage": usage, "default_estimate": 1000});
    if let Value::Object(extra) = tokens {
        for (k, v) in extra {
            section[k] = v;
        }
    }
    json!({
        "name": name, "match": {"path_prefix": prefix}, "key": {"header": "x-api-key"},
        "limits": [{"tokens": 1, "period": 120, "burst": burst}],
        "tokens": section,
    })
}

fn post(path: &str, key: &str, body: Value) -> Req {
    Req::post(path, body.to_string())
        .header("x-api-key", key)
        .header("content-type", "application/json")
}

/// The tokens `key`'s bucket holds under the rule matching `path`, waiting up to 10 s for
/// it to reach `expect` (settlements of requests that ended early land after their
/// answer). Returns what it last read.
fn remaining(client: &Client, path: &str, key: &str, expect: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = post(path, key, json!({"max_tokens": 1})).header("x-llm-fault", "status-500");
        let r = client.send(probe);
        assert_eq!(r.status, 500, "{r:?}");
        let left = r
            .header("x-ratelimit-remaining")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no x-ratelimit-remaining: {r:?}"))
            + 1;
        if left == expect || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The body of request `n` of a mixed load: every shape, streamed and not, with and
/// without `max_tokens`, a nonce so each draws its own usage.
fn mixed(n: u64) -> (String, Value, &'static str) {
    let max = (n % 3 != 0).then_some(1 + n % 1500);
    let mut body = json!({"model": "fake", "user": format!("u{n}")});
    let (path, key) = match n % 7 {
        0 => ("/openai/v1/chat/completions", "o"),
        1 => {
            body["stream"] = json!(true);
            ("/openai/v1/chat/completions", "o")
        }
        2 => {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
            ("/openai/v1/chat/completions", "o")
        }
        3 => ("/openai/v1/responses", "o"),
        4 => {
            body["stream"] = json!(true);
            ("/openai/v1/responses", "o")
        }
        5 => ("/anthropic/v1/messages", "a"),
        _ => {
            body["stream"] = json!(true);
            ("/anthropic/v1/messages", "a")
        }
    };
    if let Some(max) = max {
        let field = match n % 7 {
            0 => "max_completion_tokens",
            3 | 4 => "max_output_tokens",
            _ => "max_tokens",
        };
        body[field] = json!(max);
    }
    (path.to_string(), body, key)
}

#[test]
fn tokens_charged_equal_the_usage_reported_over_mixed_requests() {
    // Writes split events, lines and UTF-8 characters anywhere: every tenth response in
    // seven-byte writes, the others in 61-byte ones (each write costs the fake a timer
    // tick, so seven bytes throughout would make the run minutes long).
    let llm = LlmUpstream::start(LlmOptions::default()).unwrap();
    let envoy = envoy_for(
        &llm,
        json!([
            slow_budget(
                "openai",
                "/openai/",
                "openai",
                BIG,
                json!({"include_usage": true})
            ),
            slow_budget("anthropic", "/anthropic/", "anthropic", BIG, json!({})),
        ]),
    );
    let client = Client::connect(envoy.listener_addr(), 8);
    let outcome = client.run_counting_for(MANY, MANY_DEADLINE, |n| {
        let (path, body, key) = mixed(n);
        let write_bytes = if n % 10 == 0 { 7 } else { 61 };
        post(&path, key, body).header("x-llm-chunk-bytes", write_bytes.to_string())
    });
    assert_eq!(outcome.total.errors, 0, "{:?}", outcome.total.first_error);
    let answered = outcome.total.get(200);
    assert_eq!(
        answered,
        outcome.total.responses(),
        "all allowed and answered"
    );
    assert_eq!(answered, MANY, "every request of the mixed load answered");

    let (openai, anthropic) = (llm.reported("o"), llm.reported("a"));
    assert_eq!(
        openai.responses + anthropic.responses,
        answered,
        "every answer reported usage"
    );
    let probe = Client::connect(envoy.listener_addr(), 1);
    let openai_charged = BIG
        - remaining(
            &probe,
            "/openai/v1/chat/completions",
            "o",
            BIG - openai.total(),
        );
    let anthropic_charged = BIG
        - remaining(
            &probe,
            "/anthropic/v1/messages",
            "a",
            BIG - anthropic.total(),
        );
    assert_eq!(
        openai_charged,
        openai.total(),
        "OpenAI: charged = reported, exactly"
    );
    assert_eq!(
        anthropic_charged,
        anthropic.total(),
        "Anthropic: charged = reported, exactly"
    );
    // Workers hand their counts to Envoy on their tick.
    wait_for("every settlement counted", Duration::from_secs(5), || {
        envoy.counter("wasmcustom.sluice_token_settled_total") >= answered
    });
    assert_eq!(
        envoy.counter("wasmcustom.sluice_token_settled_total"),
        answered
    );
    let unknown: u64 = envoy
        .stats_matching("sluice_token_usage_unknown")
        .values()
        .sum();
    assert_eq!(unknown, 0);
    assert_eq!(
        envoy.counter("wasmcustom.sluice_token_body_unread_total"),
        0
    );
    // Each rule's statistics count the tokens its upstream reported, exactly (the probes
    // were answered 500 and used nothing), and nothing throttled.
    let used = |rule: &str| {
        envoy
            .stat(&format!("wasmcustom.sluice_rule.{rule}.tokens_used_total"))
            .unwrap_or(0)
    };
    wait_for("token statistics flushed", Duration::from_secs(5), || {
        used("openai") == openai.total() && used("anthropic") == anthropic.total()
    });
    for rule in ["openai", "anthropic"] {
        let throttled = format!("wasmcustom.sluice_rule.{rule}.tokens_throttled_total");
        assert_eq!(envoy.counter(&throttled), 0, "{rule}");
    }
    eprintln!(
        "{answered} answers; charged OpenAI {openai_charged}, Anthropic {anthropic_charged} tokens"
    );
}

#[test]
fn concurrent_streams_never_admit_more_output_than_burst_plus_rate_times_elapsed() {
    const RATE: f64 = 400.0;
    const BURST: f64 = 4_000.0;
    // Slow streams (about 0.2 s each), so a hundred are in flight at once.
    let llm = LlmUpstream::start(LlmOptions {
        chunk_gap: Duration::from_millis(30),
        deltas: 5,
        ..Default::default()
    })
    .unwrap();
    let envoy = envoy_for(
        &llm,
        json!([{
            "name": "llm", "key": {"header": "x-api-key"},
            "limits": [{"tokens": 24_000, "period": "minute", "burst": 4_000, "count": "output"}],
            "tokens": {"usage": "openai", "default_estimate": 1000, "include_usage": true},
        }]),
    );
    let client = Client::connect(envoy.listener_addr(), 100);
    let started = Instant::now();
    let outcome = client.run_for(Duration::from_secs(5), |n| {
        post(
            "/v1/chat/completions",
            "k",
            json!({"stream": true, "max_tokens": 300, "user": format!("u{n}")}),
        )
    });
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(outcome.total.errors, 0, "{:?}", outcome.total.first_error);
    let reported = llm.reported("k");
    let bound = BURST + RATE * elapsed;
    eprintln!(
        "{} admitted, {} denied; reported output {} tokens in {elapsed:.2} s (bound {bound:.0}, {:.1}%)",
        outcome.total.get(200),
        outcome.total.get(429),
        reported.output,
        100.0 * reported.output as f64 / bound
    );
    assert_eq!(reported.responses, outcome.total.get(200));
    assert!(outcome.total.get(429) > 0, "the budget must bind");
    assert!(
        reported.output as f64 <= bound,
        "{} > {bound}",
        reported.output
    );
    // Reservations of 300 are about twice the usage (1 to 300, uniform): at least a
    // third of the bound is still used.
    assert!(
        reported.output as f64 >= bound / 3.0,
        "{} < {bound} / 3",
        reported.output
    );
    // The response fields describe the token budget.
    let probe = Client::connect(envoy.listener_addr(), 1).send(post(
        "/v1/chat/completions",
        "other",
        json!({"max_tokens": 10}),
    ));
    assert_eq!(probe.status, 200);
    assert_eq!(probe.header("x-ratelimit-limit"), Some("4000"), "{probe:?}");
    assert_eq!(
        probe.header("ratelimit-policy"),
        Some("\"llm\";q=4000;w=10"),
        "{probe:?}"
    );
    assert_eq!(
        probe.header("x-ratelimit-remaining"),
        Some("3990"),
        "{probe:?}"
    );
}

/// Call `n` of a failing load: a chat completion (streamed or not) the fake fails with
/// `fault`, reserving 700 tokens.
fn json_call(n: u64, fault: &'static str, stream: bool) -> (Value, &'static str) {
    (
        json!({"stream": stream, "max_tokens": 700, "user": format!("u{n}")}),
        fault,
    )
}

/// Sends `total` calls to `/v1/chat/completions` for API key `k` over HTTP/2 (see
/// [`h2_run`]), made by `call(n)` (a body, and the fault the fake answers with), 32 at a
/// time over four connections, reading each answer to its end or its reset; bounded by
/// [`MANY_DEADLINE`].
fn llm_h2_run(
    addr: SocketAddr,
    total: u64,
    call: impl Fn(u64) -> (Value, &'static str) + Send + Sync + 'static,
) -> H2Outcome {
    let load = H2Load {
        connections: 4,
        streams: 8,
        deadline: MANY_DEADLINE,
    };
    h2_run(addr, total, load, move |n| {
        let (body, fault) = call(n);
        let request = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("x-api-key", "k")
            .header("content-type", "application/json")
            .header("x-llm-fault", fault)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        H2Call::whole(request)
    })
}

#[test]
fn failed_aborted_and_reset_calls_refund_their_reservation() {
    let llm = LlmUpstream::start(LlmOptions {
        chunk_gap: Duration::from_millis(5),
        endless_for: Duration::from_secs(30),
        ..Default::default()
    })
    .unwrap();
    const BURST: u64 = 1_000_000;
    let envoy = envoy_for(
        &llm,
        json!([slow_budget(
            "llm",
            "/",
            "openai",
            BURST,
            json!({"include_usage": true})
        )]),
    );
    // Streams the upstream aborts halfway, then calls failing every other way: an abort
    // before the body, and 500s streamed and not.
    let aborted = llm_h2_run(envoy.listener_addr(), MANY, |n| json_call(n, "abort", true));
    assert_eq!(aborted.answered(200), 0, "{aborted:?}");
    assert_eq!(aborted.failed(), MANY, "{aborted:?}");
    let others = llm_h2_run(envoy.listener_addr(), MANY / 5, |n| match n % 3 {
        0 => json_call(n, "abort", false),
        1 => json_call(n, "status-500", true),
        _ => json_call(n, "status-500", false),
    });
    assert_eq!(others.answered(200), 0, "{others:?}");
    assert_eq!(others.failed(), MANY / 5, "{others:?}");
    let failed = aborted.failed() + others.failed();
    // Clients that hang up in the middle of a stream that never ends.
    for i in 0..5 {
        let mut stream = TcpStream::connect(envoy.listener_addr()).unwrap();
        let body =
            json!({"stream": true, "max_tokens": 900, "user": format!("reset{i}")}).to_string();
        write!(
            stream,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\nx-llm-fault: endless\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut first = [0u8; 256];
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let n = stream.read(&mut first).unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        drop(stream);
    }
    let probe = Client::connect(envoy.listener_addr(), 1);
    assert_eq!(
        remaining(&probe, "/v1/chat/completions", "k", BURST),
        BURST,
        "nothing leaked"
    );
    wait_for("the refunds counted", Duration::from_secs(5), || {
        envoy.counter("wasmcustom.sluice_token_refunded_total") > failed
    });
    let refunded = envoy.counter("wasmcustom.sluice_token_refunded_total");
    assert!(
        refunded > failed,
        "{refunded} refunds for {failed} failures, 5 resets and the probes"
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_token_settled_total"), 0);
}

#[test]
fn bad_usage_is_charged_the_reservation_counted_and_passed_through_unchanged() {
    let llm = LlmUpstream::start(LlmOptions {
        chunk_bytes: 5,
        endless_for: Duration::from_millis(300),
        ..Default::default()
    })
    .unwrap();
    const BURST: u64 = 1_000_000;
    let envoy = envoy_for(
        &llm,
        json!([
            slow_budget("openai", "/openai/", "openai", BURST, json!({})),
            slow_budget("anthropic", "/anthropic/", "anthropic", BURST, json!({})),
        ]),
    );
    let via_envoy = Client::connect(envoy.listener_addr(), 1);
    let direct = Client::connect(llm.addr(), 1);
    let mut charged = [0u64; 2];
    let mut sent = 0u64;
    for path in [
        "/openai/v1/chat/completions",
        "/openai/v1/responses",
        "/anthropic/v1/messages",
    ] {
        for stream in [false, true] {
            for fault in [
                "broken-json",
                "negative",
                "huge",
                "string",
                "no-usage",
                "endless",
            ] {
                if fault == "endless" && !stream {
                    continue;
                }
                let body = json!({"stream": stream, "stream_options": {"include_usage": true},
                                  "max_tokens": 50, "user": format!("{path}{fault}")});
                let request = post(path, "k", body).header("x-llm-fault", fault);
                let expected = direct.send(request.clone());
                let got = via_envoy.send(request);
                assert_eq!(got.status, 200, "{path} {stream} {fault}: {got:?}");
                if fault == "endless" {
                    // As many deltas as its time held: the same events, however many.
                    let delta = expected.body.split_inclusive("\n\n").next().unwrap();
                    assert!(!got.body.is_empty(), "{path} {fault}");
                    assert_eq!(got.body.replace(delta, ""), "", "{path} {fault}: changed");
                } else {
                    assert_eq!(got.body, expected.body, "{path} {stream} {fault}: changed");
                }
                charged[usize::from(path.starts_with("/anthropic"))] += 50;
                sent += 1;
            }
        }
    }
    let probe = Client::connect(envoy.listener_addr(), 1);
    assert_eq!(
        BURST
            - remaining(
                &probe,
                "/openai/v1/chat/completions",
                "k",
                BURST - charged[0]
            ),
        charged[0],
        "OpenAI: each charged its reservation"
    );
    assert_eq!(
        BURST - remaining(&probe, "/anthropic/v1/messages", "k", BURST - charged[1]),
        charged[1],
        "Anthropic: each charged its reservation"
    );
    // Workers hand their counts to Envoy on their tick.
    let unknown = || -> u64 {
        envoy
            .stats_matching("sluice_token_usage_unknown")
            .values()
            .sum()
    };
    wait_for("every bad usage counted", Duration::from_secs(5), || {
        unknown() >= sent
    });
    assert_eq!(
        unknown(),
        sent,
        "{:?}",
        envoy.stats_matching("sluice_token")
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_token_settled_total"), 0);
}

/// Three Envoys (two workers each) following one admin API, one `scope: global` token
/// budget created through the API, streams on all three at once: the fleet admits no more
/// output than one bucket would.
#[test]
fn a_global_token_budget_binds_the_fleet_as_one_bucket() {
    use sluice_tests::{AdminServer, Method};
    const RATE: f64 = 300.0;
    const BURST: f64 = 3_000.0;
    let llm = LlmUpstream::start(LlmOptions {
        chunk_gap: Duration::from_millis(20),
        ..Default::default()
    })
    .unwrap();
    let admin = AdminServer::start();
    let token = admin.create_token("proxy", "fleet");
    let envoys: Vec<Envoy> = (0..3)
        .map(|i| {
            Envoy::start(EnvoyOptions {
                admin: Some(admin.connection(&token, &format!("edge-{i}"))),
                upstream: Target::Cluster(llm.addr()),
                ..Default::default()
            })
        })
        .collect();
    let (status, body) = admin.call(
        Method::POST,
        "/api/v1/rules",
        Some(json!({
            "name": "fleet-tokens", "key": "global",
            "limits": [{"tokens": 18_000, "period": "minute", "burst": 3_000, "count": "output", "scope": "global"}],
            "tokens": {"usage": "anthropic", "default_estimate": 500},
        })),
    );
    assert_eq!(status, 201, "{body}");
    for envoy in &envoys {
        wait_for(
            "every worker to run the rule",
            Duration::from_secs(30),
            || {
                envoy.counter("wasmcustom.sluice_rulesets_applied_total")
                    >= envoy.concurrency() as u64
            },
        );
        wait_for(
            "the fleet to be coordinated",
            Duration::from_secs(30),
            || {
                envoy.stat("wasmcustom.sluice_control_fleet_size") == Some(3)
                    && envoy.stat("wasmcustom.sluice_control_global_fallback") == Some(0)
            },
        );
    }
    let started = Instant::now();
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = envoys
            .iter()
            .zip([12, 6, 2])
            .map(|(envoy, connections)| {
                s.spawn(move || {
                    Client::connect(envoy.listener_addr(), connections).run_for(
                        Duration::from_secs(5),
                        |n| {
                            post(
                                "/v1/messages",
                                "k",
                                json!({"stream": n % 2 == 0, "max_tokens": 200, "user": format!("u{n}")}),
                            )
                        },
                    )
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let admitted: u64 = outcomes.iter().map(|o| o.total.get(200)).sum();
    let denied: u64 = outcomes.iter().map(|o| o.total.get(429)).sum();
    assert!(outcomes.iter().all(|o| o.total.errors == 0), "{outcomes:?}");
    let reported = llm.reported("k");
    let bound = BURST + RATE * elapsed;
    eprintln!(
        "fleet: {admitted} admitted, {denied} denied; reported output {} tokens in {elapsed:.2} s (bound {bound:.0}, {:.1}%)",
        reported.output,
        100.0 * reported.output as f64 / bound
    );
    assert_eq!(reported.responses, admitted);
    assert!(denied > 0, "the budget must bind");
    assert!(
        reported.output as f64 <= bound,
        "{} > {bound}",
        reported.output
    );
}
