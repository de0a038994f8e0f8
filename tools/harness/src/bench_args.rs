//! The command line of `cargo xtask bench`, defined once: xtask parses it to know what to
//! provision, then hands the same flags to the benchmark binary (`sluice-bench`), which
//! parses them again.

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Shorter rounds and fewer clients: finishes in under 5 minutes once built.
    #[arg(long)]
    pub quick: bool,

    /// Run only these sections (comma-separated). Default: all; `profile` is left out of
    /// `--quick` unless named here.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,

    /// Rounds of the request-path comparison (default: 3 quick, 5 full).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: Option<u32>,

    /// Seconds per variant per round (default: 5 quick, 15 full).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=120))]
    pub duration: Option<u64>,

    /// Minutes of load in the soak section (`--only soak`).
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=240))]
    pub soak_minutes: u64,

    /// Also measure the filter built from this git revision (a commit, tag or branch) in
    /// the request-path section: variants (d), (e) and (f) again with that module, in the
    /// same interleaved rounds, so a change's cost is a difference within one run. The
    /// revision's filter must accept the configuration today's `sluice envoy-config`
    /// writes.
    #[arg(long, value_name = "REV")]
    pub baseline: Option<String>,

    /// Leave README.md alone (a full run of every section otherwise points its generated
    /// benchmark headline at the new report, for `cargo xtask docs` to copy).
    #[arg(long)]
    pub no_readme: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Section {
    Path,
    Accuracy,
    Memory,
    Profile,
    /// The admin API's report ingestion and metric queries (written beside the report).
    Ingest,
    /// Rule changes from the admin API to every Envoy worker (written beside the report).
    Propagation,
    /// Fleet-wide limits: three Envoys sharing global limits through the admin API, with
    /// faults (written beside the report).
    Global,
    /// Fleet-wide limits at mesh scale: simulated proxies speaking the sync protocol,
    /// 100 to 1,000 of them over 100,000 buckets, against one admin API in memory and two
    /// replicas on one Redis (only when named; written beside the report).
    FleetScale,
    /// A long run of one Envoy following `sluice serve` under churning clients and a rule
    /// edit every second: memory, errors and reports (`--soak-minutes`, default 30; only
    /// when named; written beside the report).
    Soak,
    /// The price of each host call the request path makes, from a probe module beside the
    /// pass-through filter (only when named; written beside the report).
    Hostcalls,
    /// LLM token budgets: stream latency, Envoy's CPU per MB and per request, and memory
    /// under a 50 MB stream, with and without a token limit (only when named; written
    /// beside the report).
    Tokens,
    /// Sluice as Envoy's rate limit service: `ShouldRateLimit` throughput and latency in
    /// memory and on Redis, beside the wasm filter on the same traffic (only when named;
    /// written beside the report).
    Rls,
    /// Shaping: what soft, elastic, in-flight and delay options cost a request they do not
    /// bind, how on time a delayed request passes, and Envoy's memory under a flood of
    /// waiting requests from many keys (only when named; written beside the report).
    Shaping,
}

impl BenchArgs {
    /// The sections this run measures, in order.
    pub fn sections(&self) -> Vec<Section> {
        if !self.only.is_empty() {
            return self.only.clone();
        }
        let mut all = vec![Section::Path, Section::Accuracy, Section::Memory];
        if !self.quick {
            all.push(Section::Profile);
            all.push(Section::Ingest);
        }
        all.push(Section::Propagation);
        all.push(Section::Global);
        all
    }

    /// The flags that reproduce these arguments, in a fixed order.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if self.quick {
            flags.push("--quick".to_string());
        }
        if !self.only.is_empty() {
            let names: Vec<String> = self
                .only
                .iter()
                .filter_map(|s| s.to_possible_value().map(|v| v.get_name().to_string()))
                .collect();
            flags.push("--only".to_string());
            flags.push(names.join(","));
        }
        if let Some(rounds) = self.rounds {
            flags.push("--rounds".to_string());
            flags.push(rounds.to_string());
        }
        if let Some(duration) = self.duration {
            flags.push("--duration".to_string());
            flags.push(duration.to_string());
        }
        if self.only.contains(&Section::Soak) {
            flags.push("--soak-minutes".to_string());
            flags.push(self.soak_minutes.to_string());
        }
        if let Some(rev) = &self.baseline {
            flags.push("--baseline".to_string());
            flags.push(rev.clone());
        }
        if self.no_readme {
            flags.push("--no-readme".to_string());
        }
        flags
    }

    /// The command line that reproduces this run, as the report quotes it.
    pub fn invocation(&self) -> String {
        let mut parts = vec!["cargo xtask bench".to_string()];
        let mut flags = self.flags().into_iter();
        while let Some(flag) = flags.next() {
            // A flag and its value are one part: `--only path,accuracy`.
            match flag.as_str() {
                "--only" | "--rounds" | "--duration" | "--soak-minutes" | "--baseline" => {
                    parts.push(format!("{flag} {}", flags.next().unwrap_or_default()));
                }
                _ => parts.push(flag),
            }
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(line: &[&str]) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(line.iter().copied()))
            .expect("valid flags")
            .args
    }

    #[test]
    fn flags_parse_back_to_the_same_arguments() {
        let args = parse(&[
            "--quick",
            "--only",
            "soak,path",
            "--rounds",
            "2",
            "--baseline",
            "HEAD~1",
            "--no-readme",
        ]);
        let again = parse(&args.flags().iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(again.flags(), args.flags());
        assert_eq!(again.only, [Section::Soak, Section::Path]);
        assert_eq!(
            args.invocation(),
            "cargo xtask bench --quick --only soak,path --rounds 2 --soak-minutes 30 --baseline HEAD~1 \
             --no-readme"
        );
    }

    #[test]
    fn quick_runs_leave_out_profile_and_ingest() {
        let sections = parse(&["--quick"]).sections();
        assert!(!sections.contains(&Section::Profile));
        assert!(!sections.contains(&Section::Ingest));
        assert!(sections.contains(&Section::Global));
        assert!(parse(&[]).sections().contains(&Section::Profile));
        assert_eq!(parse(&["--only", "ingest"]).sections(), [Section::Ingest]);
    }
}
