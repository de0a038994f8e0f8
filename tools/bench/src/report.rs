//! The Markdown and JSON reports, the summary printed at the end of a run, and pointing
//! the README's generated headline at a new report.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::accuracy::{AccuracyResults, RATES, WORKERS};
use crate::machine;
use crate::memory::MemoryResults;
use crate::path::{MANY_CLIENTS, PathResults, Sample};
use crate::profile::ProfileResults;
use crate::setup::Bench;
use crate::stats::{self, Summary};

const MIB: f64 = 1024.0 * 1024.0;
const README_HEADING: &str = "## Benchmarks";

/// What the sections produced; a failed section keeps its error.
#[derive(Debug, Default)]
pub struct Results {
    pub path: Option<Result<PathResults>>,
    pub accuracy: Option<Result<AccuracyResults>>,
    pub memory: Option<Result<MemoryResults>>,
    pub profile: Option<Result<ProfileResults>>,
}

#[derive(Debug)]
pub struct Report<'a> {
    pub bench: &'a Bench,
    pub results: &'a Results,
    pub invocation: &'a str,
    pub stamp: &'a str,
    pub elapsed: Duration,
    /// `tools/bench/results/<file_name>.md`.
    pub file_name: &'a str,
}

fn err_text<T>(r: &Result<T>) -> Option<String> {
    r.as_ref().err().map(|e| format!("{e:#}"))
}

/// A section of the report under `heading`: its text, or why it failed; nothing when it
/// did not run.
fn write_section<T>(
    md: &mut String,
    heading: &str,
    result: &Option<Result<T>>,
    text: impl FnOnce(&T) -> String,
) {
    let Some(result) = result else {
        return;
    };
    let _ = write!(md, "\n## {heading}\n\n");
    match result {
        Ok(value) => md.push_str(&text(value)),
        Err(e) => {
            let _ = writeln!(md, "**Failed:** {e:#}");
        }
    }
}

impl Report<'_> {
    fn path(&self) -> Option<&PathResults> {
        self.results.path.as_ref()?.as_ref().ok()
    }

    fn accuracy(&self) -> Option<&AccuracyResults> {
        self.results.accuracy.as_ref()?.as_ref().ok()
    }

    fn memory(&self) -> Option<&MemoryResults> {
        self.results.memory.as_ref()?.as_ref().ok()
    }

    fn profile(&self) -> Option<&ProfileResults> {
        self.results.profile.as_ref()?.as_ref().ok()
    }

    fn mode(&self) -> &'static str {
        if self.bench.settings.quick {
            "quick"
        } else {
            "full"
        }
    }

    pub fn json(&self) -> Value {
        let s = &self.bench.settings;
        let section = |present: bool, value: Option<Value>, error: Option<String>| {
            if !present {
                Value::Null
            } else {
                value.unwrap_or_else(|| json!({ "error": error }))
            }
        };
        json!({
            "schema": "sluice-bench/1",
            "date": self.stamp,
            "mode": self.mode(),
            "command": self.invocation,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "settings": {
                "rounds": s.rounds,
                "round_s": s.round.as_secs_f64(),
                "warmup_s": s.warmup.as_secs_f64(),
                "connections": s.connections,
                "envoy_cpus": self.bench.envoy_cpus,
                "load_cpus": self.bench.load_cpus,
                "accuracy_s": s.accuracy.as_secs_f64(),
                "accuracy_connections": s.accuracy_connections,
                "slots": s.slots,
                "memory_target_clients": s.memory_clients,
            },
            "machine": self.bench.machine.to_json(),
            "loadavg_end": machine::loadavg(),
            "run_dir": self.bench.run_dir.display().to_string(),
            "request_path": section(self.results.path.is_some(), self.path().map(PathResults::to_json), self.results.path.as_ref().and_then(err_text)),
            "accuracy": section(self.results.accuracy.is_some(), self.accuracy().map(AccuracyResults::to_json), self.results.accuracy.as_ref().and_then(err_text)),
            "memory": section(self.results.memory.is_some(), self.memory().map(MemoryResults::to_json), self.results.memory.as_ref().and_then(err_text)),
            "profile": section(self.results.profile.is_some(), self.profile().map(ProfileResults::to_json), self.results.profile.as_ref().and_then(err_text)),
            "findings": self.findings(),
        })
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.bench.machine;
        let _ = writeln!(
            md,
            "# Sluice benchmark: {} ({} run)\n",
            self.stamp,
            self.mode()
        );
        let _ = writeln!(
            md,
            "Produced by `{}` in {:.1} minutes. Machine-readable results: [`{}.json`]({}.json).\n",
            self.invocation,
            self.elapsed.as_secs_f64() / 60.0,
            self.file_name,
            self.file_name
        );
        md.push_str(
            "This machine is shared and noisy: absolute figures move from run to run. Read the \
             **ratios and differences**, measured side by side in one interleaved run, and the \
             min–max spread over rounds next to each median.\n\n",
        );
        if self.bench.settings.quick {
            let _ = writeln!(
                md,
                "**Quick mode:** {} rounds of {} s, accuracy runs of {} s, and {} distinct \
                 clients in the memory run instead of 1,000,000.\n",
                self.bench.settings.rounds,
                self.bench.settings.round.as_secs(),
                self.bench.settings.accuracy.as_secs(),
                group(self.bench.settings.memory_clients)
            );
        }

        md.push_str("## Headline\n\n");
        md.push_str(&self.headline());

        md.push_str("\n## Machine and versions\n\n| | |\n|---|---|\n");
        for (k, v) in [
            ("CPU", format!("{} ({} cores)", m.cpu_model, m.cores)),
            ("memory", m.memory.clone()),
            ("kernel", m.kernel.clone()),
            ("Envoy", m.envoy_version.clone()),
            ("rustc (host)", m.rustc.clone()),
            ("wasm toolchain route", m.wasm_route.clone()),
            ("load generator", self.load_generator_note()),
            ("git commit", format!("`{}`", m.git_commit)),
            ("wasm modules", self.module_sizes()),
            (
                "load average",
                format!(
                    "{} at start, {} at end",
                    m.loadavg_start,
                    machine::loadavg()
                ),
            ),
            ("clock ticks per second", m.clk_tck.to_string()),
        ] {
            let _ = writeln!(md, "| {k} | {v} |");
        }

        let quick = self.bench.settings.quick;
        write_section(&mut md, "1. Request path cost", &self.results.path, |p| {
            self.path_section(p)
        });
        write_section(
            &mut md,
            "2. Accuracy",
            &self.results.accuracy,
            accuracy_section,
        );
        write_section(&mut md, "3. Memory", &self.results.memory, |m| {
            memory_section(m, quick)
        });
        write_section(
            &mut md,
            "4. Where the core's time goes",
            &self.results.profile,
            profile_section,
        );

        md.push_str("\n## Findings\n\n");
        for finding in self.findings() {
            let _ = writeln!(md, "- {finding}");
        }

        md.push_str("\n## Exact commands\n\n");
        let _ = writeln!(
            md,
            "Everything below was run by `{}`; configs, Lua scripts and Envoy logs are in \
             `{}`.\n",
            self.invocation,
            self.bench
                .run_dir
                .strip_prefix(sluice_harness::cmd::project_root())
                .unwrap_or(&self.bench.run_dir)
                .display()
        );
        md.push_str("```sh\n");
        let mut lines: Vec<String> = Vec::new();
        if let Some(p) = self.path() {
            lines.push("# 1. request path: bootstraps (sluice envoy-config; (a)-(c) then swap the wasm filter), Envoys, one wrk per variant and round".into());
            lines.extend(p.config_commands.iter().cloned());
            lines.extend(p.envoy_commands.iter().cloned());
            lines.extend(p.wrk_commands.iter().cloned());
        }
        if let Some(a) = self.accuracy() {
            lines.push(
                "# 2. accuracy (the wrk line is repeated per rate with /r500, /r5000)".into(),
            );
            lines.extend(a.commands.iter().cloned());
        }
        if let Some(mem) = self.memory() {
            lines.push("# 3. memory (the churn wrk line is repeated per segment with prefixes m1-, m2-, ...)".into());
            lines.extend(mem.commands.iter().cloned());
        }
        if let Some(p) = self.profile() {
            lines.push("# 4. profile".into());
            lines.extend(p.commands.iter().cloned());
        }
        let root = format!("{}/", sluice_harness::cmd::project_root().display());
        for line in lines {
            let _ = writeln!(md, "{}", line.replace(&root, ""));
        }
        md.push_str("```\n");
        md
    }

    fn module_sizes(&self) -> String {
        let size = |p: &Path| {
            std::fs::metadata(p).map_or_else(
                |_| "?".to_string(),
                |m| format!("{:.0} KiB", m.len() as f64 / 1024.0),
            )
        };
        let g = &self.bench.generator;
        format!(
            "`sluice_filter.wasm` {}, `sluice_passthrough_filter.wasm` {}",
            size(&g.filter_wasm),
            size(&g.passthrough_wasm)
        )
    }

    fn load_generator_note(&self) -> String {
        let w = &self.bench.wrk;
        let mut s = format!("{} (`{}`)", w.version, w.program.display());
        if w.installed_now {
            s.push_str(", installed by this run with `apt-get install wrk`");
        }
        s
    }

    fn headline(&self) -> String {
        let mut md = String::new();
        if let Some(p) = self.path() {
            md.push_str(&headline_table(p));
        }
        if let Some(a) = self.accuracy() {
            let _ = writeln!(md, "\n{}", accuracy_verdict(a));
        }
        if let Some(mem) = self.memory() {
            let _ = writeln!(md, "\n{}", memory_verdict(mem));
        }
        md
    }

    fn path_section(&self, p: &PathResults) -> String {
        let s = &self.bench.settings;
        let mut md = String::new();
        let pin = match (&self.bench.envoy_cpus, &self.bench.load_cpus) {
            (Some(e), Some(l)) => {
                format!("Envoy pinned to core {e} (`taskset -c {e}`), wrk pinned to core {l}")
            }
            _ => "Envoy and wrk unpinned (no taskset or a single core)".to_string(),
        };
        let _ = writeln!(
            md,
            "One Envoy per variant, all started up front: `--concurrency 1`, the listener and \
             `direct_response` route that `sluice envoy-config --upstream direct` writes, \
             differing only in the HTTP filter before the router. {pin}; `wrk -t1 -c{}` with \
             the same `x-api-key` header on every request (variant (f) sets it per request from \
             a Lua script). Each variant got {} s of warm-up, then {} interleaved rounds of {} s \
             (a b c … a b c …). **Envoy CPU per request** is Envoy's utime + stime from \
             `/proc/<pid>/stat` over the round, divided by the requests Envoy completed \
             (`http.ingress_http.downstream_rq_completed`). Ratios are computed within each \
             round, then summarised: median (min–max) over rounds.\n",
            s.connections,
            s.warmup.as_secs(),
            s.rounds,
            s.round.as_secs()
        );
        let a = p.index("a");
        let c = p.index("c");
        md.push_str(
            "| variant | Envoy CPU µs/request | CPU ÷ (a) | CPU ÷ (c) | throughput req/s | \
             throughput ÷ (a) | throughput ÷ (c) | p50 µs | p99 µs | Envoy core busy | non-2xx |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for (i, v) in p.variants.iter().enumerate() {
            let ratio = |base: Option<usize>, f: fn(&Sample) -> f64| {
                stats::show(base.and_then(|b| p.paired(i, b, |x, y| f(x) / f(y))), 2)
            };
            let _ = writeln!(
                md,
                "| ({}) {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                v.id,
                v.label,
                stats::show(p.summary(i, Sample::cpu_per_request_us), 1),
                ratio(a, Sample::cpu_per_request_us),
                ratio(c, Sample::cpu_per_request_us),
                median(p.summary(i, Sample::throughput), 0),
                ratio(a, Sample::throughput),
                ratio(c, Sample::throughput),
                median(p.summary(i, |s| s.measured.p50_us as f64), 0),
                median(p.summary(i, |s| s.measured.p99_us as f64), 0),
                median(p.summary(i, |s| s.cores_used() * 100.0), 0) + "%",
                median(p.summary(i, |s| s.denied_share() * 100.0), 1) + "%",
            );
        }
        md.push_str(
            "\nVariants: (a) no HTTP filter but the router; (b) `envoy.filters.http.local_ratelimit` \
             with one shared token bucket of 10⁹ tokens per second (never denies), enabled and \
             enforced for 100%, `local_rate_limit_per_downstream_connection: false`; (c) the \
             pass-through wasm filter (`bench/passthrough-filter`, returns `Continue`, same V8 \
             runtime and settings as Sluice); (d) Sluice with one rule keyed on `x-api-key`, \
             10⁹ requests per second; (e) three rules keyed on `x-api-key`, the client IP and \
             the path, each with two limits (per second and per minute); (f) as (d) with wrk \
             cycling through 100,000 `x-api-key` values (65,536 slots); (g) one rule of 100 per \
             second and one client, so nearly every response is a 429 with its problem+json \
             body; (d0) as (d) with the rule's rate-limit response headers switched off, to \
             show what those cost; (h) as (d) with the limit's `scope: global`: no coordinator, \
             the worker enforces it from the lease table alone.\n\n",
        );
        if let Some(rev) = &s.baseline {
            let _ = writeln!(
                md,
                "(db), (eb) and (fb) are (d), (e) and (f) with the filter built at \
                 `--baseline {rev}` instead of this tree's, in the same rounds, with the same \
                 configuration.\n"
            );
        }
        md.push_str(
            "Differences in Envoy CPU per request, within each round (median, min–max, µs):\n\n",
        );
        md.push_str("| what | difference | µs/request |\n|---|---|---|\n");
        for (what, x, y) in [
            ("Sluice's own cost (one rule, one client)", "d", "c"),
            ("the wasm boundary (pass-through filter)", "c", "a"),
            ("native local_ratelimit", "b", "a"),
            ("Sluice in all (one rule, one client)", "d", "a"),
            ("two more rules, second tiers", "e", "d"),
            ("100,000 clients instead of one", "f", "d"),
            ("denying (429 + body) instead of allowing", "g", "d"),
            ("rate-limit response headers", "d", "d0"),
            ("a global-scope limit instead of a proxy one", "h", "d"),
            (
                "this tree against the baseline (one rule, one client)",
                "d",
                "db",
            ),
            (
                "this tree against the baseline (3 rules × 2 tiers)",
                "e",
                "eb",
            ),
            (
                "this tree against the baseline (100,000 clients)",
                "f",
                "fb",
            ),
        ] {
            if let (Some(i), Some(j)) = (p.index(x), p.index(y)) {
                let diff = p.paired(i, j, |a, b| a.cpu_per_request_us() - b.cpu_per_request_us());
                let _ = writeln!(md, "| {what} | ({x}) − ({y}) | {} |", stats::show(diff, 2));
            }
        }
        let counters: Vec<String> = p
            .variants
            .iter()
            .zip(&p.counters)
            .filter(|(_, c)| !c.is_empty())
            .map(|(v, c)| {
                let pick = |name: &str| c.iter().find(|(k, _)| k == name).map_or(0, |(_, n)| *n);
                format!(
                    "({}) requests {}, denied {} ({} of them from memory), fail-open {}, \
                     errors {}, CAS conflicts {}, slot evictions {}, shared slots {}",
                    v.id,
                    group(pick("sluice_requests_total")),
                    group(pick("sluice_denied_total")),
                    group(pick("sluice_denials_remembered_total")),
                    group(pick("sluice_fail_open_total")),
                    group(pick("sluice_errors_total")),
                    group(pick("sluice_cas_contention_total")),
                    group(pick("sluice_slot_evictions_total")),
                    group(pick("sluice_slot_shared_total")),
                )
            })
            .collect();
        if !counters.is_empty() {
            md.push_str("\nSluice's counters at the end of the section (warm-up included):\n\n");
            for line in counters {
                let _ = writeln!(md, "- {line}");
            }
        }
        md
    }

    /// Data-driven observations; the hand-written analysis of a run goes below them.
    fn findings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p) = self.path() {
            let diff = |x: &str, y: &str| {
                let (i, j) = (p.index(x)?, p.index(y)?);
                p.paired(i, j, |a, b| a.cpu_per_request_us() - b.cpu_per_request_us())
            };
            let ratio = |x: &str, y: &str| {
                let (i, j) = (p.index(x)?, p.index(y)?);
                p.paired(i, j, |a, b| a.cpu_per_request_us() / b.cpu_per_request_us())
            };
            if let (Some(own), Some(floor)) = (diff("d", "c"), diff("c", "a")) {
                out.push(format!(
                    "Sluice's own work costs {:.2} µs of Envoy CPU per request over the \
                     pass-through filter (median; {:.2}–{:.2}), on top of the {:.2} µs the wasm \
                     boundary itself costs: the filter's work is {:.1}× the unavoidable floor.",
                    own.median,
                    own.min,
                    own.max,
                    floor.median,
                    own.median / floor.median.max(1e-9)
                ));
            }
            if let (Some(d_a), Some(b_a)) = (ratio("d", "a"), ratio("b", "a")) {
                out.push(format!(
                    "Envoy CPU per request relative to no filter: Sluice (d) {:.2}×, native \
                     local_ratelimit (b) {:.2}×.",
                    d_a.median, b_a.median
                ));
            }
            if let Some(h) = diff("d", "d0") {
                out.push(format!(
                    "The rate-limit response headers on allowed requests cost {:.2} µs per \
                     request (d − d0): one `add_header_map_value` host call per field.",
                    h.median
                ));
            }
            if let Some(g) = ratio("h", "d") {
                out.push(format!(
                    "A global-scope limit (no coordinator, the lease table alone) costs {:.2}× \
                     a proxy-scope one in Envoy CPU per request ((h) ÷ (d), median; {:.2}–{:.2}).",
                    g.median, g.min, g.max
                ));
            }
            if let Some(f) = diff("f", "d") {
                out.push(format!(
                    "{} distinct clients cost {:.2} µs more per request than one (f − d): \
                     up to {} shared-data reads per request while probing for the client's \
                     slot, and a new slot value each time.",
                    group(MANY_CLIENTS),
                    f.median,
                    4
                ));
            }
            if let Some(rev) = &self.bench.settings.baseline {
                let against: Vec<String> = [("d", "db"), ("e", "eb"), ("f", "fb")]
                    .into_iter()
                    .filter_map(|(x, y)| {
                        let d = diff(x, y)?;
                        Some(format!(
                            "({x}) {:+.2} µs ({:+.2} to {:+.2})",
                            d.median, d.min, d.max
                        ))
                    })
                    .collect();
                if !against.is_empty() {
                    out.push(format!(
                        "This tree's filter against the one built at `{rev}`, Envoy CPU per \
                         request in the same rounds (median, min to max): {}.",
                        against.join(", ")
                    ));
                }
            }
            if let Some(g) = diff("g", "d") {
                out.push(format!(
                    "A denial costs {:+.2} µs per request against an allowed request (g − d): \
                     no CAS write, but the local reply with its problem+json body.",
                    g.median
                ));
            }
            for (i, v) in p.variants.iter().enumerate() {
                let share = p.summary(i, Sample::denied_share).map_or(0.0, |s| s.median);
                let errors: u64 = p
                    .samples
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|s| s.measured.errors)
                    .sum();
                if v.denies && share < 0.9 {
                    out.push(format!(
                        "**Check:** ({}) was meant to be mostly denied but only {:.1}% of its \
                         responses were non-2xx.",
                        v.id,
                        share * 100.0
                    ));
                } else if !v.denies && share > 0.0 {
                    out.push(format!(
                        "**Check:** ({}) should never deny, yet {:.3}% of its responses were \
                         non-2xx.",
                        v.id,
                        share * 100.0
                    ));
                }
                if errors > 0 {
                    out.push(format!(
                        "**Check:** ({}) had {errors} load-generator errors (connect, read, \
                         write or timeout).",
                        v.id
                    ));
                }
            }
            let busy = p
                .variants
                .iter()
                .enumerate()
                .filter_map(|(i, _)| p.summary(i, Sample::cores_used))
                .map(|s| s.median)
                .fold(f64::INFINITY, f64::min);
            if busy.is_finite() && busy < 0.9 {
                out.push(format!(
                    "Envoy's core was not saturated in every variant (lowest median {:.0}% \
                     busy): other processes on this shared machine took CPU, so throughput \
                     figures understate Envoy; CPU per request is the measure to trust.",
                    busy * 100.0
                ));
            }
        }
        if let Some(a) = self.accuracy() {
            out.push(accuracy_verdict(a));
        }
        if let Some(mem) = self.memory() {
            out.push(memory_verdict(mem));
        }
        out
    }

    /// The run's summary, printed when it ends (prose wrapped like the README). The README
    /// itself copies the report's `## Headline` through a generated section.
    pub fn readme_section(&self) -> String {
        wrap_prose(&self.readme_text(), 90)
    }

    fn readme_text(&self) -> String {
        let mut md = String::new();
        let m = &self.bench.machine;
        let _ = writeln!(md, "{README_HEADING}\n");
        let _ = writeln!(
            md,
            "Measured by `{}` on {} ({} cores, shared and noisy: ratios from one interleaved \
             run, not absolute claims); the full report, with the exact commands, is \
             [`tools/bench/results/{}.md`](tools/bench/results/{}.md).\n",
            self.invocation, m.cpu_model, m.cores, self.file_name, self.file_name
        );
        md.push_str(&self.headline());
        md
    }
}

fn median(summary: Option<Summary>, decimals: usize) -> String {
    summary.map_or_else(|| "—".to_string(), |s| format!("{:.*}", decimals, s.median))
}

fn headline_table(p: &PathResults) -> String {
    let mut md = String::new();
    let (Some(a), Some(c)) = (p.index("a"), p.index("c")) else {
        return md;
    };
    md.push_str(
        "| Envoy, 1 worker, direct_response | CPU µs/request | ÷ no filter | ÷ pass-through wasm | \
         throughput ÷ no filter |\n|---|---|---|---|---|\n",
    );
    for (i, v) in p.variants.iter().enumerate() {
        if v.id == "d0" {
            continue;
        }
        let _ = writeln!(
            md,
            "| ({}) {} | {} | {} | {} | {} |",
            v.id,
            v.label,
            median(p.summary(i, Sample::cpu_per_request_us), 1),
            median(
                p.paired(i, a, |x, y| x.cpu_per_request_us() / y.cpu_per_request_us()),
                2
            ),
            median(
                p.paired(i, c, |x, y| x.cpu_per_request_us() / y.cpu_per_request_us()),
                2
            ),
            median(p.paired(i, a, |x, y| x.throughput() / y.throughput()), 2),
        );
    }
    if let (Some(d), Some(c)) = (p.index("d"), p.index("c")) {
        let own = p.paired(d, c, |x, y| x.cpu_per_request_us() - y.cpu_per_request_us());
        let _ = writeln!(
            md,
            "\nSluice's own cost, (d) − (c): **{} µs** of Envoy CPU per request (median, \
             min–max over {} rounds).",
            stats::show(own, 2),
            p.samples.len()
        );
    }
    md
}

fn accuracy_section(a: &AccuracyResults) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "One Envoy per worker count ({:?}), unpinned so the workers run in parallel, with \
         three `global` rules on their own paths; wrk (`-t2 -c{}`, unpinned) sends {} s of \
         load to one rule at a time, far above its rate. **Allowed** is `burst + rate × \
         elapsed` with elapsed measured by wrk around the run (from before it connects to \
         after its last response). **Admitted** is the 2xx responses wrk received in that \
         time: each was decided inside the window, so an exact limiter never exceeds the \
         allowance. Envoy's own count (`sluice_allowed_total`) is shown beside it; it also \
         includes requests still in flight when wrk stopped, decided after wrk's clock ended.\n",
        WORKERS,
        a.connections,
        a.duration.as_secs()
    );
    md.push_str(
        "| workers | rate/s | burst | elapsed s | allowed | admitted | Envoy's count | \
         over-admission | under-admission | offered req/s | CAS conflicts | connections per \
         worker |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &a.cases {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.1} | {} | {} | {:.3}% | {:.3}% | {:.0} | {} | {:?} |",
            c.workers,
            group(c.rate),
            group(c.burst),
            c.elapsed(),
            c.allowed(),
            group(c.admitted()),
            group(c.admitted_by_envoy),
            c.over_percent(),
            c.under_percent(),
            c.offered(),
            group(c.cas_conflicts),
            c.per_worker_connections,
        );
    }
    let _ = writeln!(md, "\n{}", accuracy_verdict(a));
    md
}

fn accuracy_verdict(a: &AccuracyResults) -> String {
    let worst_over = a.cases.iter().map(|c| c.over_percent()).fold(0.0, f64::max);
    let worst_under = a
        .cases
        .iter()
        .map(|c| c.under_percent())
        .fold(0.0, f64::max);
    let conflicts: u64 = a.cases.iter().map(|c| c.cas_conflicts).sum();
    let fail_open: u64 = a.cases.iter().map(|c| c.fail_open).sum();
    let bar = if worst_over == 0.0 && worst_under <= 1.0 {
        "meets the quality bar (never over, at most 1% under)"
    } else {
        "**misses the quality bar** (never over, at most 1% under)"
    };
    format!(
        "Accuracy over {} runs ({} rates × {} and {} workers): worst over-admission \
         {worst_over:.3}%, worst under-admission {worst_under:.3}%: {bar}. The workers raced \
         ({} CAS conflicts, all retried; {} fail-open).",
        a.cases.len(),
        RATES.len(),
        WORKERS[0],
        WORKERS[1],
        group(conflicts),
        group(fail_open)
    )
}

fn memory_section(m: &MemoryResults, quick: bool) -> String {
    let mut md = String::new();
    let f = &m.fill;
    let _ = writeln!(
        md,
        "Two Envoys, `--concurrency 2`, one rule keyed on `x-api-key`; wrk `-t1 -c32` with a \
         Lua script giving every request the key it needs. RSS is `VmRSS` from \
         `/proc/<pid>/status`, read after a second's rest.\n"
    );
    let _ = writeln!(
        md,
        "**Bytes per tracked client.** A table of {} slots (larger than the churn run's, so \
         the growth stands well above RSS noise) and a limit of 10 per hour, which keeps every \
         client below full capacity for the whole run, so no slot is reclaimed: {} distinct \
         clients (half the table, so few have to share) over {} requests created about {} slot keys \
         ({} requests found every probed slot busy and shared one). RSS went from {:.1} MiB to \
         {:.1} MiB: **{:.0} bytes per tracked client**, all of Envoy's costs included (the \
         shared-data map entry, the key string, the slot value, allocator overhead). A full \
         {}-slot table therefore holds about {:.1} MiB.\n",
        group(u64::from(m.fill_slots)),
        group(f.clients),
        group(f.requests),
        group(f.slots_used().round() as u64),
        group(f.shared),
        f.rss_before as f64 / MIB,
        f.rss_after as f64 / MIB,
        f.bytes_per_client(),
        group(u64::from(m.slots)),
        f.bytes_per_client() * f64::from(m.slots) / MIB
    );
    let _ = writeln!(
        md,
        "**{} distinct clients.** A table of {} slots, a limit of 10 per second, every request \
         a new client.{}\n",
        group(m.clients()),
        group(u64::from(m.slots)),
        if quick {
            " (Quick mode: fewer clients than the full run's 1,000,000.)"
        } else {
            ""
        }
    );
    md.push_str("| distinct clients | Envoy RSS MiB | change since start MiB | seconds |\n|---|---|---|---|\n");
    for c in &m.checkpoints {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:+.1} | {:.0} |",
            group(c.clients),
            c.rss as f64 / MIB,
            (c.rss as f64 - m.rss_start() as f64) / MIB,
            c.seconds
        );
    }
    let pick = |name: &str| {
        m.counters
            .iter()
            .find(|(k, _)| k == name)
            .map_or(0, |(_, n)| *n)
    };
    let _ = writeln!(
        md,
        "\nSluice's counters after the churn: requests {}, allowed {}, denied {}, slot \
         evictions {}, shared slots {}, fail-open {}.\n",
        group(pick("sluice_requests_total")),
        group(pick("sluice_allowed_total")),
        group(pick("sluice_denied_total")),
        group(pick("sluice_slot_evictions_total")),
        group(pick("sluice_slot_shared_total")),
        group(pick("sluice_fail_open_total")),
    );
    let _ = writeln!(md, "{}", memory_verdict(m));
    md
}

fn memory_verdict(m: &MemoryResults) -> String {
    let growth = m.rss_end() as f64 - m.rss_start() as f64;
    let table = m.fill.bytes_per_client() * f64::from(m.slots);
    format!(
        "Memory: Envoy's RSS went from {:.1} MiB to {:.1} MiB ({:+.1} MiB) while {} distinct \
         clients passed through a {}-slot table, against {:.1} MiB for a full table at the \
         measured {:.0} bytes per tracked client; over the second half of the clients it moved \
         {:+.1} MiB.",
        m.rss_start() as f64 / MIB,
        m.rss_end() as f64 / MIB,
        growth / MIB,
        group(m.clients()),
        group(u64::from(m.slots)),
        table / MIB,
        m.fill.bytes_per_client(),
        m.second_half_growth() as f64 / MIB
    )
}

fn profile_section(p: &ProfileResults) -> String {
    let mut md = String::new();
    md.push_str(
        "`core/examples/hot_path.rs` repeats what the filter does per request outside the host \
         calls: header pairs to `HttpRequest`, `Ruleset::decide_observed` against `MemoryStore` \
         counting into the worker's statistics (`report::Aggregate`), the rate-limit headers (or the denial body). Native, on the host CPU, timed in three \
         loops that each do one stage more, so each stage's cost is a difference of loops:\n\n```\n",
    );
    for line in &p.timing {
        let _ = writeln!(md, "{line}");
    }
    md.push_str("```\n");
    if let Some(why) = &p.skipped {
        let _ = writeln!(md, "\nCallgrind skipped: {why}.");
    }
    if !p.callgrind.is_empty() {
        md.push_str(
            "\nUnder callgrind (built without LTO, so small functions are inlined into their \
             callers; percentages of all instructions of the run). *Inclusive*: which part of \
             the request's work the instructions belong to (`Vec`/`String` clones stand for \
             the header pairs the host hands the filter). *Exclusive*: where they execute.\n",
        );
    }
    for profile in &p.callgrind {
        let _ = writeln!(
            md,
            "\nScenario ({}), inclusive | exclusive:\n\n```",
            profile.scenario
        );
        let rows = profile.inclusive.len().max(profile.exclusive.len());
        for row in 0..rows {
            let left = profile.inclusive.get(row).map_or("", String::as_str);
            let right = profile.exclusive.get(row).map_or("", String::as_str);
            let _ = writeln!(md, "{left:<62} | {right}");
        }
        md.push_str("```\n");
    }
    md
}

/// Wraps paragraph lines at `width` columns, leaving headings, tables, lists and code
/// blocks as they are.
fn wrap_prose(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / width);
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let keep = in_code || line.len() <= width || line.starts_with(['#', '|', '-', '`', ' ']);
        if keep {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let mut current = String::new();
        for word in line.split(' ') {
            if !current.is_empty() && current.chars().count() + 1 + word.chars().count() > width {
                out.push_str(&current);
                out.push('\n');
                current.clear();
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push_str(&current);
        out.push('\n');
    }
    out
}

/// `1234567` -> `1,234,567`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The README's copy of a report's headline: a generated section that `cargo xtask docs`
/// fills from the result file it names, and `cargo xtask tidy` holds to it.
const HEADLINE_MARKER: (&str, &str) = (
    "<!-- generated from tools/bench/results/",
    ".md#headline -->",
);

/// Points README.md's generated headline section at the report `file_name` (without
/// `.md`). The copy itself is left to `cargo xtask docs`, so the README's figures only ever
/// come from a committed result. Returns whether a marker was found.
pub fn update_readme(path: &Path, file_name: &str) -> Result<bool> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (updated, found) = retarget_headline(&text, file_name);
    if updated != text {
        std::fs::write(path, updated).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(found)
}

fn retarget_headline(text: &str, file_name: &str) -> (String, bool) {
    let (start, end) = HEADLINE_MARKER;
    let mut found = false;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if trimmed.starts_with(start) && trimmed.ends_with(end) {
            found = true;
            out.push_str(&format!("{start}{file_name}{end}"));
            out.push_str(&line[trimmed.len()..]);
        } else {
            out.push_str(line);
        }
    }
    (out, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prose_is_wrapped_and_tables_are_not() {
        let table = format!("| {} |", "x ".repeat(60));
        let text = format!("{}\n{table}\n", "word ".repeat(30).trim_end());
        let wrapped = wrap_prose(&text, 40);
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines.iter().all(|l| l.len() <= 40 || l.starts_with('|')));
        assert_eq!(lines.last(), Some(&table.as_str()));
        assert_eq!(
            wrapped.replace('\n', " ").split_whitespace().count(),
            text.split_whitespace().count()
        );
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn the_readme_headline_marker_is_pointed_at_the_new_report() {
        let readme = "# S\n\n<!-- generated from tools/bench/results/2026-11-25.md#headline -->\n\
                      old\n<!-- end generated -->\n\
                      <!-- generated from tools/bench/results/2026-11-25-global.md#x -->\n";
        let (updated, found) = retarget_headline(readme, "2026-12-01");
        assert!(found);
        assert_eq!(
            updated,
            readme.replace("2026-11-25.md#headline", "2026-12-01.md#headline")
        );
        assert!(!retarget_headline("# S\n", "2026-12-01").1);
    }
}
