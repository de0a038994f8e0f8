//! LLM token budgets (issue #29): what reading the usage out of responses costs a stream.
//!
//! Two Envoys from `sluice envoy-config`, two workers each, in front of the harness's fake
//! LLM API (OpenAI Chat Completions, streamed with a usage chunk), differing only in their
//! rule: `requests` has a request limit (responses are not read), `tokens` adds a token
//! limit on the same rule (every response is read for its usage, every stream parsed as it
//! passes). Neither limit binds. The variants alternate within each round:
//!
//! 1. **Latency**: streams of 20 events 5 ms apart; the client times the response headers
//!    (time to first byte) and the gap between each two body chunks it receives.
//! 2. **Cost**: Envoy's CPU time (`/proc/<pid>/stat`) per MB of long streams (events
//!    written back to back) and per small JSON request.
//! 3. **Memory** (once per variant): Envoy's RSS while one 50 MB stream passes, and the
//!    token variant's settlement of it (its usage is read at the very end).
//!
//! Written beside the main report as `<date>-tokens.md`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_harness::cmd::{note, step};
use sluice_harness::envoy::EnvoyProcess;
use sluice_harness::llm::{LlmOptions, LlmUpstream, delta_event_bytes};
use sluice_harness::wait_until;

use crate::setup::Bench;
use crate::stats::{self, Summary};

const WORKERS: u32 = 2;
const PATH: &str = "/v1/chat/completions";
/// Streams in flight at once in the latency and cost phases.
const CONCURRENT: usize = 4;
/// The latency phase's streams: events this far apart.
const EVENT_GAP: Duration = Duration::from_millis(5);
const LATENCY_DELTAS: usize = 20;
/// The cost phase's long streams, about 0.75 MB each.
const LONG_DELTAS: usize = 5_000;
/// The memory phase's one stream.
const BIG_STREAM_BYTES: usize = 50_000_000;
const SETTLED: &str = "wasmcustom.sluice_token_settled_total";
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// The two rules compared: identical but for the token limit.
fn rules(tokens: bool) -> Value {
    let mut limits = vec![json!({"requests": 1_000_000_000u64, "period": "second"})];
    if tokens {
        limits.push(json!({"tokens": 1_000_000_000u64, "period": "second"}));
    }
    let mut rule = json!({
        "name": "llm", "match": {"path_prefix": "/v1/"}, "key": {"header": "x-api-key"},
        "limits": limits,
    });
    if tokens {
        rule["tokens"] =
            json!({"usage": "openai", "default_estimate": 1000, "include_usage": true});
    }
    json!([rule])
}

/// One Envoy of the comparison.
struct Variant {
    name: &'static str,
    /// Its rule has a token limit (responses are read, settlements counted).
    reads_tokens: bool,
    envoy: EnvoyProcess,
    url: String,
    latency: Latency,
    cpu_ms_per_mb: Vec<f64>,
    cpu_us_per_request: Vec<f64>,
    /// The 50 MB stream, or why it failed.
    memory: Option<Result<BigStream, String>>,
}

#[derive(Debug, Default)]
struct Latency {
    first_byte_ms: Vec<f64>,
    chunk_gap_ms: Vec<f64>,
    /// Each round's p99s on their own: a noisy round moves the pooled p99 of both
    /// variants' samples, but only its own entry here.
    first_byte_p99_by_round: Vec<f64>,
    chunk_gap_p99_by_round: Vec<f64>,
}

/// The 50 MB stream through one Envoy.
#[derive(Debug, Clone, Copy)]
struct BigStream {
    bytes: u64,
    seconds: f64,
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
    /// The token variant's settlements counted for it (1 when its usage was read).
    settled: u64,
}

/// Measures and writes `<out_dir>/<name>-tokens.md`.
pub fn run(bench: &Bench, out_dir: &Path, name: &str) -> Result<PathBuf> {
    let settings = &bench.settings;
    step(format!(
        "tokens: {} rounds of {:?} per phase and variant, then a 50 MB stream each",
        settings.rounds, settings.round
    ));
    let dir = bench.run_dir.join("tokens");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Each request says how its stream is paced and how long it is.
    let llm = LlmUpstream::start(LlmOptions::default())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the client's runtime")?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENT)
        .timeout(Duration::from_secs(120))
        .build()?;

    let mut variants = Vec::new();
    let mut commands = Vec::new();
    for (variant, tokens) in [("requests", false), ("tokens", true)] {
        let bootstrap = bench.generator.write_proxying(
            &format!("tokens-{variant}"),
            &rules(tokens),
            WORKERS,
            llm.addr(),
        )?;
        commands.push(bootstrap.command.clone());
        let envoy = bench.start_envoy(
            &bootstrap.path,
            WORKERS,
            bench.envoy_cpus.as_deref(),
            &dir,
            &format!("tokens-{variant}"),
        )?;
        let url = format!("http://{}", envoy.listener());
        variants.push(Variant {
            name: variant,
            reads_tokens: tokens,
            envoy,
            url,
            latency: Latency::default(),
            cpu_ms_per_mb: Vec::new(),
            cpu_us_per_request: Vec::new(),
            memory: None,
        });
    }
    for round in 0..settings.rounds {
        for v in &mut variants {
            note(format!("round {}: {} variant", round + 1, v.name));
            let (first, gaps) = runtime.block_on(latency(&client, &v.url, settings.round))?;
            v.latency
                .first_byte_p99_by_round
                .push(quantile(&first, 0.99));
            v.latency.chunk_gap_p99_by_round.push(quantile(&gaps, 0.99));
            v.latency.first_byte_ms.extend(first);
            v.latency.chunk_gap_ms.extend(gaps);
            v.cpu_ms_per_mb
                .push(cpu_per_mb(&runtime, &client, v, settings.round)?);
            v.cpu_us_per_request
                .push(cpu_per_request(&runtime, &client, v, settings.round)?);
        }
    }
    for v in &mut variants {
        // A failed stream is reported, not fatal: the phases above still stand.
        v.memory = Some(big_stream(&runtime, &client, v).map_err(|e| format!("{e:#}")));
    }
    let text = markdown(&variants, &commands, settings.rounds, settings.round);
    let path = out_dir.join(format!("{name}-tokens.md"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    note(format!("tokens: {}", path.display()));
    Ok(path)
}

/// Paced streams for `duration`: each response's time to its headers, and the gaps
/// between the body chunks that followed.
async fn latency(
    client: &reqwest::Client,
    url: &str,
    duration: Duration,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENT {
        let (client, url) = (client.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut first, mut gaps) = (Vec::new(), Vec::new());
            let mut n = 0u64;
            while Instant::now() < stop {
                n += 1;
                let sent = Instant::now();
                let paced = Shape {
                    deltas: LATENCY_DELTAS,
                    gap: EVENT_GAP,
                    write_bytes: 0,
                };
                let mut response = stream_request(&client, &url, worker, n, paced).await?;
                first.push(ms(sent.elapsed()));
                let mut last = None::<Instant>;
                while let Some(chunk) = response.chunk().await? {
                    if chunk.is_empty() {
                        continue;
                    }
                    let now = Instant::now();
                    if let Some(before) = last {
                        gaps.push(ms(now - before));
                    }
                    last = Some(now);
                }
            }
            anyhow::Ok((first, gaps))
        }));
    }
    let (mut first, mut gaps) = (Vec::new(), Vec::new());
    for task in tasks {
        let (f, g) = task.await??;
        first.extend(f);
        gaps.extend(g);
    }
    Ok((first, gaps))
}

/// How the fake writes a stream: its content deltas, the pause between writes, and the
/// bytes of a write (0: each event whole).
#[derive(Debug, Clone, Copy)]
struct Shape {
    deltas: usize,
    gap: Duration,
    write_bytes: usize,
}

/// A streamed chat request from client `worker` (a body of its own each time, so the
/// fake draws its usage anew), answered in `shape`.
async fn stream_request(
    client: &reqwest::Client,
    url: &str,
    worker: usize,
    n: u64,
    shape: Shape,
) -> Result<reqwest::Response> {
    let body = json!({"model": "fake", "stream": true, "max_tokens": 500,
                      "user": format!("w{worker}-{n}")});
    let response = client
        .post(format!("{url}{PATH}"))
        .header("x-api-key", format!("client-{worker}"))
        .header("content-type", "application/json")
        .header("x-llm-deltas", shape.deltas.to_string())
        .header("x-llm-gap-ms", shape.gap.as_millis().to_string())
        .header("x-llm-chunk-bytes", shape.write_bytes.to_string())
        .body(body.to_string())
        .send()
        .await?;
    if response.status() != 200 {
        bail!("answered {}", response.status());
    }
    Ok(response)
}

/// Events written back to back, 64 KiB a write (cut anywhere, as a busy upstream's are).
fn flat_out(deltas: usize) -> Shape {
    Shape {
        deltas,
        gap: Duration::ZERO,
        write_bytes: 64 * 1024,
    }
}

/// Envoy's CPU milliseconds per MB of long streams, over `duration`.
fn cpu_per_mb(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    v: &Variant,
    duration: Duration,
) -> Result<f64> {
    let (cpu_ms, bytes) = cpu_under_load(
        runtime,
        client,
        v,
        duration,
        |client, url, worker, n| async move {
            let long = flat_out(LONG_DELTAS);
            let mut response = stream_request(&client, &url, worker, n, long).await?;
            let mut bytes = 0u64;
            while let Some(chunk) = response.chunk().await? {
                bytes += chunk.len() as u64;
            }
            Ok(bytes)
        },
    )?;
    Ok(cpu_ms / (bytes as f64 / 1e6).max(1e-9))
}

/// Envoy's CPU microseconds per small JSON (not streamed) request, over `duration`.
fn cpu_per_request(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    v: &Variant,
    duration: Duration,
) -> Result<f64> {
    let (cpu_ms, requests) = cpu_under_load(
        runtime,
        client,
        v,
        duration,
        |client, url, worker, n| async move {
            let body =
                json!({"model": "fake", "max_tokens": 100, "user": format!("w{worker}-{n}")});
            let response = client
                .post(format!("{url}{PATH}"))
                .header("x-api-key", format!("client-{worker}"))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await?;
            if response.status() != 200 {
                bail!("answered {}", response.status());
            }
            response.bytes().await?;
            Ok(1)
        },
    )?;
    Ok(cpu_ms * 1e3 / requests.max(1) as f64)
}

/// Runs `one(client, url, worker, n)` back to back from [`CONCURRENT`] clients for
/// `duration`: Envoy's CPU milliseconds over the run, and what `one` counted, summed.
fn cpu_under_load<F, Fut>(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    v: &Variant,
    duration: Duration,
    one: F,
) -> Result<(f64, u64)>
where
    F: Fn(reqwest::Client, String, usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64>> + Send,
{
    let ticks = v.envoy.cpu_ticks()?;
    let counted = runtime.block_on(async {
        let stop = Instant::now() + duration;
        let mut tasks = Vec::new();
        for worker in 0..CONCURRENT {
            let (client, url, one) = (client.clone(), v.url.clone(), one.clone());
            tasks.push(tokio::spawn(async move {
                let (mut counted, mut n) = (0u64, 0u64);
                while Instant::now() < stop {
                    n += 1;
                    counted += one(client.clone(), url.clone(), worker, n).await?;
                }
                anyhow::Ok(counted)
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await??;
        }
        anyhow::Ok(total)
    })?;
    Ok((ticks_ms(v.envoy.cpu_ticks()? - ticks), counted))
}

/// One stream of at least 50 MB through `v`, Envoy's RSS sampled every 50 ms.
fn big_stream(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    v: &Variant,
) -> Result<BigStream> {
    let deltas = BIG_STREAM_BYTES.div_ceil(delta_event_bytes(PATH));
    let settled_before = v.envoy.stat(SETTLED)?.unwrap_or(0);
    let rss_before = v.envoy.rss_bytes()?;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, pid) = (Arc::clone(&done), v.envoy.pid());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(sluice_harness::envoy::rss_bytes(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    let started = Instant::now();
    let bytes = runtime.block_on(async {
        let mut response = stream_request(client, &v.url, 0, u64::MAX, flat_out(deltas)).await?;
        let mut bytes = 0u64;
        while let Some(chunk) = response.chunk().await? {
            bytes += chunk.len() as u64;
        }
        anyhow::Ok(bytes)
    });
    let seconds = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let rss_peak = sampler.join().unwrap_or(0);
    let bytes = bytes?;
    let settled = if v.reads_tokens {
        wait_until("the 50 MB stream's settlement", WAIT_LIMIT, || {
            Ok(v.envoy.stat(SETTLED)?.unwrap_or(0) > settled_before)
        })?;
        v.envoy.stat(SETTLED)?.unwrap_or(0) - settled_before
    } else {
        0
    };
    Ok(BigStream {
        bytes,
        seconds,
        rss_before,
        rss_peak: rss_peak.max(rss_before),
        rss_after: v.envoy.rss_bytes()?,
        settled,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Clock ticks (USER_HZ, 100 on Linux) to milliseconds.
fn ticks_ms(ticks: u64) -> f64 {
    ticks as f64 * 10.0
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get((sorted.len().saturating_sub(1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn markdown(variants: &[Variant], commands: &[String], rounds: u32, round: Duration) -> String {
    let mut out = format!(
        "# Sluice token budgets: what reading usage costs\n\n\
         Produced by `cargo xtask bench --only tokens`. Two Envoys ({WORKERS} workers each) in \
         front of the harness's fake LLM API on loopback, identical but for their rule: \
         `requests` has a request limit only (responses are not read); `tokens` adds a token \
         limit (`usage: openai`, `include_usage: true`), so every response is read for its \
         usage and every stream parsed as it passes. Neither limit binds. {rounds} rounds of \
         {round:?} per phase, the variants alternating within each round; {CONCURRENT} \
         requests in flight.\n\n"
    );
    out.push_str("## Streams: time to first byte and gaps between chunks\n\n");
    out.push_str(&format!(
        "Streams of {LATENCY_DELTAS} events written {} ms apart (and a usage chunk). \
         First byte: from sending the request to the response headers. Gaps: between two \
         body chunks as the client received them.\n\n\
         | variant | streams | first byte p50 ms | p99 ms | chunk gaps | gap p50 ms | p99 ms |\n\
         |---|---|---|---|---|---|---|\n",
        EVENT_GAP.as_millis()
    ));
    for v in variants {
        let l = &v.latency;
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} |\n",
            v.name,
            l.first_byte_ms.len(),
            quantile(&l.first_byte_ms, 0.5),
            quantile(&l.first_byte_ms, 0.99),
            l.chunk_gap_ms.len(),
            quantile(&l.chunk_gap_ms, 0.5),
            quantile(&l.chunk_gap_ms, 0.99),
        ));
    }
    if let [plain, tokens] = variants {
        let diff = |f: fn(&Latency) -> &Vec<f64>| {
            quantile(f(&tokens.latency), 0.99) - quantile(f(&plain.latency), 0.99)
        };
        // The variants alternate within a round, so a round's two p99s saw the same
        // machine: their difference is the fairer comparison on a shared machine.
        let by_round = |f: fn(&Latency) -> &Vec<f64>| {
            let differences = f(&tokens.latency)
                .iter()
                .zip(f(&plain.latency))
                .map(|(t, p)| t - p);
            stats::show(Summary::of(differences), 2)
        };
        out.push_str(&format!(
            "\nThe token rule's p99 minus the request rule's, over all streams: first byte \
             {:+.2} ms, chunk gaps {:+.2} ms; round by round, median (min–max): first byte \
             {} ms, chunk gaps {} ms (the bar: within 1 ms).\n",
            diff(|l| &l.first_byte_ms),
            diff(|l| &l.chunk_gap_ms),
            by_round(|l| &l.first_byte_p99_by_round),
            by_round(|l| &l.chunk_gap_p99_by_round),
        ));
    }
    out.push_str(
        "\n## Envoy's CPU\n\nMedian over rounds (min–max). Per MB: streams of about 0.75 MB, \
         events written back to back in 64 KiB writes. Per request: small JSON answers, not streamed.\n\n\
         | variant | CPU ms per streamed MB | CPU µs per request |\n|---|---|---|\n",
    );
    for v in variants {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            v.name,
            stats::show(Summary::of(v.cpu_ms_per_mb.iter().copied()), 2),
            stats::show(Summary::of(v.cpu_us_per_request.iter().copied()), 0),
        ));
    }
    out.push_str(
        "\n## One 50 MB stream\n\nEnvoy's resident memory before, at its peak while the \
         stream passed (sampled every 50 ms) and after. The token variant reads the stream's \
         usage from its last event: `settled` counts that settlement.\n\n\
         | variant | MB | seconds | RSS before MB | peak MB | after MB | settled |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for v in variants {
        if let Some(Err(e)) = &v.memory {
            out.push_str(&format!("| {} | failed: {e} | | | | | |\n", v.name));
        }
        if let Some(Ok(m)) = v.memory {
            let mb = |b: u64| b as f64 / 1e6;
            out.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
                v.name,
                mb(m.bytes),
                m.seconds,
                mb(m.rss_before),
                mb(m.rss_peak),
                mb(m.rss_after),
                if v.reads_tokens {
                    m.settled.to_string()
                } else {
                    "–".into()
                },
            ));
        }
    }
    out.push_str("\nBootstraps: `");
    out.push_str(&commands.join("`, `"));
    out.push_str("`, each with its rule.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variants_differ_only_in_the_token_limit() {
        let (plain, tokens) = (rules(false), rules(true));
        assert_eq!(plain[0]["limits"].as_array().unwrap().len(), 1);
        assert_eq!(tokens[0]["limits"].as_array().unwrap().len(), 2);
        assert_eq!(tokens[0]["limits"][0], plain[0]["limits"][0]);
        assert_eq!(tokens[0]["match"], plain[0]["match"]);
        assert!(plain[0].get("tokens").is_none());
    }

    #[test]
    fn quantiles_pick_from_the_sorted_values() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
