//! The report-ingest benchmark: can the admin API take what a fleet of proxies sends, and
//! do the dashboard's queries stay quick over a week of history while it does?
//!
//! For each database (SQLite in a temporary file; PostgreSQL when a server URL is given,
//! in a database created for the run and dropped after), [`run`]:
//!
//! 1. pre-fills a week of history directly through the store: per rule, 1 h and 1 min
//!    buckets with their 50 most throttled clients, and per proxy the 1 h buckets (the
//!    per-proxy 1 min rows, ten million for 100 proxies, are left out unless asked for:
//!    the measured queries do not read them);
//! 2. starts the real server on 127.0.0.1:0 and lets `proxies` simulated proxies POST
//!    one report a second each for `duration` (a report: `rules` rules, `clients` top
//!    clients drawn from the proxy's own 1,000, half of them shared with the next proxy);
//! 3. meanwhile asks `/metrics/series`, `/metrics/clients` and `/metrics/rules` over the
//!    last week, day and 15 minutes, one query at a time;
//! 4. asks the same queries with the proxies quiet, has every proxy send one last report
//!    and stops the server at once (its final flush writes them), and reports accepted
//!    reports per second, POST latency percentiles, query latencies and what the flushes
//!    cost.
//!
//! The load generator runs in the same process as the server, so on a small machine the
//! numbers are a floor, not a ceiling.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sluice_admin::http::AppState;
use sluice_admin::server;
use sluice_admin::store::{
    Actor, ClientBucket, Counts, MetricsBatch, ProxyBucket, Resolution, Role, RuleBucket, Store,
    TOP_CLIENTS_PER_BUCKET, now_ms,
};
use sluice_harness::PostgresDatabase;
use sluice_harness::cmd::{note, step};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Simulated proxies, each sending one report a second.
    pub proxies: usize,
    /// How long they send.
    pub duration: Duration,
    /// Rules per report.
    pub rules: usize,
    /// Top clients per rule per report.
    pub clients: usize,
    /// Distinct clients each proxy sees.
    pub clients_per_proxy: usize,
    /// Days of history written before the run.
    pub history_days: u32,
    /// Also write per-proxy 1 min history (100 proxies × 10 rules × a week = 10 M rows).
    pub proxy_minutes: bool,
    /// Also run on SQLite.
    pub sqlite: bool,
    /// A PostgreSQL server URL (`postgres://user@host:port/db`): the run creates its own
    /// database there, and drops it after.
    pub postgres_url: Option<String>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            proxies: 100,
            duration: Duration::from_secs(30),
            rules: 10,
            clients: 20,
            clients_per_proxy: 1000,
            history_days: 7,
            proxy_minutes: false,
            sqlite: true,
            postgres_url: None,
        }
    }
}

/// Latency percentiles of one kind of request, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort_unstable();
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let at =
            |q: usize| samples.get((samples.len() * q / 100).min(samples.len().saturating_sub(1)));
        Latency {
            p50_ms: ms(at(50)),
            p99_ms: ms(at(99)),
            max_ms: ms(samples.last()),
        }
    }
}

/// One backend's results.
#[derive(Debug, Clone)]
pub struct BackendResult {
    pub backend: &'static str,
    pub history_rows: u64,
    pub history_seconds: f64,
    /// Reports sent, accepted (204) and not.
    pub sent: u64,
    pub accepted: u64,
    pub refused: u64,
    pub load_seconds: f64,
    pub post: Latency,
    /// (query, latency while the proxies send, latency after they stopped).
    pub queries: Vec<(String, Latency, Latency)>,
    pub flushes: u64,
    pub flush_mean_ms: f64,
    pub rows_written: u64,
    /// Entries in memory when the server was stopped, written by its final flush.
    pub pending_at_stop: usize,
    /// Time for the clean stop, the final flush included.
    pub stop_ms: f64,
}

impl BackendResult {
    pub fn accepted_per_second(&self) -> f64 {
        self.accepted as f64 / self.load_seconds.max(1e-9)
    }
}

/// Runs the benchmark on every backend asked for.
pub async fn run(options: &BenchOptions) -> Result<Vec<BackendResult>> {
    let mut results = Vec::new();
    if options.sqlite {
        let dir = std::env::temp_dir().join(format!(
            "sluice-ingest-bench-{}-{:08x}",
            std::process::id(),
            rand::rng().random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite://{}", dir.join("sluice.db").display());
        let result = run_on(options, "sqlite", &url).await;
        let _ = std::fs::remove_dir_all(&dir);
        results.push(result?);
    }
    if let Some(server_url) = &options.postgres_url {
        // Created with the client tools, and dropped (forcibly) when the run ends.
        let database = PostgresDatabase::create(server_url, "sluice_bench")?;
        results.push(run_on(options, "postgres", database.url()).await?);
    }
    Ok(results)
}

fn rule_id(r: usize) -> String {
    format!("bench-rule-{r}")
}

/// Writes `days` of history ending at the current minute. Returns the rows written.
async fn prefill(store: &Store, options: &BenchOptions, now: i64) -> Result<u64> {
    let mut rng = StdRng::seed_from_u64(7);
    let day_ms = 86_400_000;
    let start = Resolution::Hour.bucket(now) - i64::from(options.history_days) * day_ms;
    let end = Resolution::Minute.bucket(now);
    let mut rows = 0u64;
    let client_pool = (options.proxies * options.clients_per_proxy / 2).max(1);
    let counts = |rng: &mut StdRng, scale: u64| Counts {
        allowed: rng.random_range(500..1500) * scale,
        denied: rng.random_range(10..100) * scale,
        shadow_denied: rng.random_range(0..10) * scale,
        near_limit: rng.random_range(0..50) * scale,
        fail_open: 0,
        key_missing: rng.random_range(0..5) * scale,
        ..Counts::default()
    };
    // Two hours per transaction keeps batches to a few tens of thousands of rows.
    let chunk = 2 * 3_600_000;
    let mut from = start;
    while from < end {
        let to = (from + chunk).min(end);
        let mut batch = MetricsBatch::default();
        for resolution in [Resolution::Minute, Resolution::Hour] {
            let scale = u64::try_from(resolution.seconds()).unwrap_or(1) * options.proxies as u64;
            let mut t = from;
            while t < to {
                for r in 0..options.rules {
                    let rule = rule_id(r);
                    batch.rules.push(RuleBucket {
                        resolution,
                        bucket_ms: t,
                        rule: rule.clone(),
                        counts: counts(&mut rng, scale),
                    });
                    let per_proxy = resolution == Resolution::Hour || options.proxy_minutes;
                    if per_proxy {
                        for p in 0..options.proxies {
                            batch.proxies.push(ProxyBucket {
                                resolution,
                                bucket_ms: t,
                                proxy: format!("bench-proxy-{p:03}"),
                                rule: rule.clone(),
                                counts: counts(&mut rng, resolution.seconds() as u64),
                            });
                        }
                    }
                    let picked = rand::seq::index::sample(
                        &mut rng,
                        client_pool,
                        TOP_CLIENTS_PER_BUCKET.min(client_pool),
                    );
                    for c in picked {
                        let throttled = rng.random_range(1..1000) * scale / 100;
                        batch.clients.push(ClientBucket {
                            resolution,
                            bucket_ms: t,
                            rule: rule.clone(),
                            client: format!("client-{c:06}"),
                            throttled,
                            error: throttled / 10,
                            tokens: 0,
                        });
                    }
                }
                t += resolution.ms();
            }
        }
        rows += batch.rows() as u64;
        store.load_metrics(&batch).await?;
        from = to;
    }
    Ok(rows)
}

/// One simulated proxy's report.
fn make_report(rng: &mut StdRng, options: &BenchOptions, proxy: usize, now: i64) -> Value {
    let first_client = proxy * options.clients_per_proxy / 2;
    let rules: Vec<Value> = (0..options.rules)
        .map(|r| {
            let picked = rand::seq::index::sample(
                rng,
                options.clients_per_proxy,
                options.clients.min(options.clients_per_proxy),
            );
            let mut top: Vec<(usize, u64)> = picked
                .into_iter()
                .map(|c| (first_client + c, rng.random_range(1..50)))
                .collect();
            top.sort_by_key(|c| std::cmp::Reverse(c.1));
            json!({
                "rule": rule_id(r),
                "allowed": rng.random_range(500..1500),
                "denied": rng.random_range(10..100),
                "shadow_denied": rng.random_range(0..10),
                "near_limit": rng.random_range(0..50),
                "key_missing": rng.random_range(0..5),
                "top_clients": top.iter().map(|(c, n)| json!({
                    "client": format!("client-{c:06}"), "throttled": n, "error": 0
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "proxy_id": format!("bench-proxy-{proxy:03}"),
        "start_ms": now - 1000,
        "end_ms": now,
        "ruleset_version": 0,
        "rules": rules,
    })
}

/// Reads one value from the OpenMetrics text.
fn scrape(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn run_on(options: &BenchOptions, backend: &'static str, url: &str) -> Result<BackendResult> {
    let store = Store::open(url).await?;
    let now = now_ms();
    let started = Instant::now();
    let history_rows = prefill(&store, options, now).await?;
    let history_seconds = started.elapsed().as_secs_f64();

    let proxy_token = store
        .create_token(&Actor::system(), "bench-proxies", Role::Proxy, now_ms())
        .await?
        .secret;
    let viewer_token = store
        .create_token(&Actor::system(), "bench-viewer", Role::Viewer, now_ms())
        .await?
        .secret;
    let admin_token = store
        .create_token(&Actor::system(), "bench-admin", Role::Admin, now_ms())
        .await?
        .secret;
    let state = AppState::new(store.clone()).await?;
    let server = server::start(state, "127.0.0.1:0".parse()?).await?;
    let base = format!("http://{}", server.addr());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(options.proxies + 8)
        .build()?;
    // The server takes reports only of rules it issued.
    for r in 0..options.rules {
        let rule = json!({"name": rule_id(r), "key": "global",
                          "limits": [{"requests": 10, "period": "second"}]});
        let status = http
            .post(format!("{base}/api/v1/rules"))
            .bearer_auth(&admin_token)
            .json(&rule)
            .send()
            .await?
            .status();
        if status.as_u16() != 201 {
            return Err(anyhow!("creating {} was answered {status}", rule_id(r)));
        }
    }

    let deadline = tokio::time::Instant::now() + options.duration;
    let mut senders = Vec::new();
    for p in 0..options.proxies {
        let (http, base, token, options) = (
            http.clone(),
            base.clone(),
            proxy_token.clone(),
            options.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(1000 + p as u64);
            // Spread the proxies over the second, as real ones are.
            let phase = Duration::from_millis((p as u64 * 1000) / options.proxies.max(1) as u64);
            let mut ticks = tokio::time::interval_at(
                tokio::time::Instant::now() + phase,
                Duration::from_secs(1),
            );
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut latencies, mut accepted, mut refused) = (Vec::new(), 0u64, 0u64);
            loop {
                ticks.tick().await;
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
                let body = make_report(&mut rng, &options, p, now_ms());
                let sent = Instant::now();
                let response = http
                    .post(format!("{base}/api/v1/reports"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await;
                latencies.push(sent.elapsed());
                match response {
                    Ok(r) if r.status().as_u16() == 204 => accepted += 1,
                    _ => refused += 1,
                }
            }
            (latencies, accepted, refused)
        }));
    }

    // The dashboard's queries, one at a time, while the proxies send.
    let day = 86_400_000;
    let week = format!("?from={}&to={now}", now - 7 * day);
    let windows = [
        ("week (1 h)", week.clone()),
        ("day (1 min)", format!("?from={}&to={now}", now - day)),
        ("15 min (10 s, live)", String::new()),
    ];
    let mut queries: Vec<(String, String)> = ["series", "clients"]
        .iter()
        .flat_map(|view| {
            windows.iter().map(move |(window, query)| {
                (
                    format!("{view}, {window}"),
                    format!("/api/v1/metrics/{view}{query}"),
                )
            })
        })
        .collect();
    queries.push((
        "rules, week (1 h)".to_string(),
        format!("/api/v1/metrics/rules{week}"),
    ));
    let query = |path: &str| {
        let request = http.get(format!("{base}{path}")).bearer_auth(&viewer_token);
        let path = path.to_string();
        async move {
            let sent = Instant::now();
            let response = request.send().await?;
            if !response.status().is_success() {
                return Err(anyhow!(
                    "{path} answered {}: {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                ));
            }
            let _ = response.bytes().await?;
            Ok::<_, anyhow::Error>(sent.elapsed())
        }
    };
    let mut loaded: Vec<Vec<Duration>> = vec![Vec::new(); queries.len()];
    let mut round = 0usize;
    // Let the first flushes happen before measuring.
    tokio::time::sleep(Duration::from_secs(3).min(options.duration / 4)).await;
    while tokio::time::Instant::now() < deadline {
        let i = round % queries.len();
        round += 1;
        loaded[i].push(query(&queries[i].1).await?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut latencies, mut accepted, mut refused) = (Vec::new(), 0, 0);
    for s in senders {
        let (l, a, r) = s.await?;
        latencies.extend(l);
        accepted += a;
        refused += r;
    }
    // The proxies send during `duration`; waiting for the last answers is not sending time.
    let load_seconds = options.duration.as_secs_f64();
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    // The same queries with the proxies quiet.
    let mut idle: Vec<Vec<Duration>> = vec![Vec::new(); queries.len()];
    for _ in 0..5 {
        for (i, (_, path)) in queries.iter().enumerate() {
            idle[i].push(query(path).await?);
        }
    }
    // One last report from every proxy, then a clean stop at once: the final flush
    // writes them.
    let mut rng = StdRng::seed_from_u64(99);
    let last: Vec<_> = (0..options.proxies)
        .map(|p| {
            let request = http
                .post(format!("{base}/api/v1/reports"))
                .bearer_auth(&proxy_token)
                // A second ahead: each proxy's reports must move forward by 500 ms, and
                // its last tick may have been just now.
                .json(&make_report(&mut rng, options, p, now_ms() + 1_000));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    for sent in last {
        let status = sent.await??;
        if status != 204 {
            return Err(anyhow!("a last report was answered {status}"));
        }
    }
    let pending_at_stop = server.state().pipeline().pending_entries();
    let stopping = Instant::now();
    server.stop().await?;
    let stop_ms = stopping.elapsed().as_secs_f64() * 1e3;
    store.close().await;

    let flushes = scrape(
        &metrics,
        "sluice_admin_metrics_flush_duration_seconds_count",
    );
    let flush_sum = scrape(&metrics, "sluice_admin_metrics_flush_duration_seconds_sum");
    let rows_written = [
        "metric_rule_buckets",
        "metric_proxy_buckets",
        "metric_clients",
        "proxies",
    ]
    .iter()
    .map(|t| {
        scrape(
            &metrics,
            &format!("sluice_admin_metrics_rows_written_total{{table=\"{t}\"}}"),
        )
    })
    .sum::<f64>();
    Ok(BackendResult {
        backend,
        history_rows,
        history_seconds,
        sent: accepted + refused,
        accepted,
        refused,
        load_seconds,
        post: Latency::of(latencies),
        queries: queries
            .into_iter()
            .zip(loaded.into_iter().zip(idle))
            .map(|((name, _), (l, i))| (name, Latency::of(l), Latency::of(i)))
            .collect(),
        flushes: flushes as u64,
        flush_mean_ms: if flushes > 0.0 {
            flush_sum / flushes * 1e3
        } else {
            0.0
        },
        rows_written: rows_written as u64,
        pending_at_stop,
        stop_ms,
    })
}

/// The results as Markdown tables.
pub fn markdown(options: &BenchOptions, results: &[BackendResult]) -> String {
    let mut out = format!(
        "Report ingest: {} proxies × 1 report/s for {} s ({} rules × {} top clients per report, \
         {} clients per proxy); {} days of history pre-filled.\n\n",
        options.proxies,
        options.duration.as_secs(),
        options.rules,
        options.clients,
        options.clients_per_proxy,
        options.history_days
    );
    out.push_str(
        "| backend | reports sent | accepted/s | refused | POST p50 | POST p99 | POST max \
         | flushes | mean flush | rows written | entries at stop | clean stop |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} | {:.0} ms | {} | {} | {:.0} ms |\n",
            r.backend,
            r.sent,
            r.accepted_per_second(),
            r.refused,
            r.post.p50_ms,
            r.post.p99_ms,
            r.post.max_ms,
            r.flushes,
            r.flush_mean_ms,
            r.rows_written,
            r.pending_at_stop,
            r.stop_ms
        ));
    }
    out.push_str(
        "\nQuery latency while the proxies send (p50, p99) and after (idle p50); history: ",
    );
    out.push_str(
        &results
            .iter()
            .map(|r| {
                format!(
                    "{} rows written in {:.0} s on {}",
                    r.history_rows, r.history_seconds, r.backend
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    );
    out.push_str("\n\n| query |");
    for r in results {
        let b = r.backend;
        out.push_str(&format!(" {b} p50 | {b} p99 | {b} idle |"));
    }
    out.push_str("\n|---|");
    for _ in results {
        out.push_str("---:|---:|---:|");
    }
    out.push('\n');
    if let Some(first) = results.first() {
        for (i, (name, _, _)) in first.queries.iter().enumerate() {
            out.push_str(&format!("| {name} |"));
            for r in results {
                let (l, idle) = r
                    .queries
                    .get(i)
                    .map(|q| (q.1.clone(), q.2.clone()))
                    .unwrap_or_default();
                out.push_str(&format!(
                    " {:.1} ms | {:.1} ms | {:.1} ms |",
                    l.p50_ms, l.p99_ms, idle.p50_ms
                ));
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_scrapes() {
        let l = Latency::of((1..=100).map(Duration::from_millis).collect());
        assert_eq!((l.p50_ms, l.p99_ms, l.max_ms), (51.0, 100.0, 100.0));
        let none = Latency::of(Vec::new());
        assert_eq!((none.p50_ms, none.p99_ms, none.max_ms), (0.0, 0.0, 0.0));
        assert_eq!(scrape("a_count 3\na 2\n", "a"), 2.0);
    }

    #[test]
    fn reports_are_valid() {
        let options = BenchOptions::default();
        let mut rng = StdRng::seed_from_u64(1);
        let now = now_ms();
        let body = make_report(&mut rng, &options, 3, now);
        let report: sluice_core::report::Report = serde_json::from_value(body).unwrap();
        assert_eq!(report.batch.rules.len(), options.rules);
        assert_eq!(report.batch.rules[0].top_clients.len(), options.clients);
    }
}

/// `sluice-bench ingest`: the ingest benchmark alone, with every knob; prints its tables.
#[derive(Debug, Clone, clap::Args)]
pub struct IngestArgs {
    /// Simulated proxies, one report a second each.
    #[arg(long, default_value_t = 100)]
    proxies: usize,
    /// How long they send.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Rules per report.
    #[arg(long, default_value_t = 10)]
    rules: usize,
    /// Top clients per rule per report.
    #[arg(long, default_value_t = 20)]
    clients: usize,
    /// Days of history to pre-fill.
    #[arg(long, default_value_t = 7)]
    history_days: u32,
    /// Also pre-fill per-proxy 1-minute history (millions of rows).
    #[arg(long)]
    proxy_minutes: bool,
    /// A PostgreSQL server to run on as well (a database is created and dropped).
    #[arg(long, env = "SLUICE_BENCH_POSTGRES_URL", value_name = "URL")]
    postgres: Option<String>,
    /// Skip SQLite.
    #[arg(long)]
    no_sqlite: bool,
}

impl IngestArgs {
    pub fn options(&self) -> BenchOptions {
        BenchOptions {
            proxies: self.proxies,
            duration: Duration::from_secs(self.seconds),
            rules: self.rules,
            clients: self.clients,
            history_days: self.history_days,
            proxy_minutes: self.proxy_minutes,
            sqlite: !self.no_sqlite,
            postgres_url: self.postgres.clone(),
            ..BenchOptions::default()
        }
    }
}

/// Runs the benchmark with `options` and returns its Markdown tables.
pub fn tables(options: &BenchOptions) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let results = runtime.block_on(run(options))?;
    Ok(markdown(options, &results))
}

/// The `ingest` section of `cargo xtask bench`: SQLite, `proxies` proxies for `seconds`,
/// its tables written to `<out_dir>/<name>-ingest.md`.
pub fn section(out_dir: &Path, name: &str, proxies: usize, seconds: u64) -> Result<PathBuf> {
    let command = format!("sluice-bench ingest --proxies {proxies} --seconds {seconds}");
    step(format!("ingest: {command}"));
    let options = BenchOptions {
        proxies,
        duration: Duration::from_secs(seconds),
        ..BenchOptions::default()
    };
    let tables = tables(&options).context("running the ingest benchmark")?;
    let path = out_dir.join(format!("{name}-ingest.md"));
    let text = format!(
        "# Sluice admin API: report ingestion and metric queries\n\n\
         Produced by `cargo xtask bench` running `{command}` on this shared 2-core machine \
         (the load generator shares the cores with the server).\n\n{tables}"
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    note(format!("ingest report: {}", path.display()));
    Ok(path)
}
