//! What a benchmark ran on: machine, versions and the date, for the report.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_harness::cmd;

#[derive(Debug, Clone)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub memory: String,
    pub envoy_version: String,
    pub rustc: String,
    pub wasm_route: String,
    pub git_commit: String,
    pub wrk: String,
    pub taskset: bool,
    /// `/proc/loadavg` when the run started: how busy the machine already was.
    pub loadavg_start: String,
    pub clk_tck: u64,
}

impl Machine {
    pub fn inspect(envoy: &Path, wasm_route: &str, wrk: &str) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map(|(_, model)| model.trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let kernel = cmd::probe(Command::new("uname").args(["-srm"]))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|kb| kb.trim().strip_suffix("kB"))
                    .and_then(|kb| kb.trim().parse::<u64>().ok())
            })
            .map_or_else(
                || "unknown".to_string(),
                |kb| format!("{:.1} GiB", kb as f64 / (1024.0 * 1024.0)),
            );
        let envoy_version = cmd::probe(Command::new(envoy).arg("--version"))
            .map(|v| {
                let v = v.trim();
                v.rsplit_once("version: ").map_or(v, |(_, v)| v).to_string()
            })
            .unwrap_or_else(|| "unknown".to_string());
        let rustc = cmd::probe(
            Command::new("rustc")
                .current_dir(cmd::project_root())
                .arg("-V"),
        )
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
        let git_commit = git_commit();
        let clk_tck = cmd::probe(Command::new("getconf").arg("CLK_TCK"))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100);
        Machine {
            cpu_model,
            cores,
            kernel,
            memory,
            envoy_version,
            rustc,
            wasm_route: wasm_route.to_string(),
            git_commit,
            wrk: wrk.to_string(),
            taskset: cmd::which("taskset").is_some(),
            loadavg_start: loadavg(),
            clk_tck,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "kernel": self.kernel,
            "memory": self.memory,
            "envoy": self.envoy_version,
            "rustc": self.rustc,
            "wasm_route": self.wasm_route,
            "git_commit": self.git_commit,
            "wrk": self.wrk,
            "taskset": self.taskset,
            "loadavg_start": self.loadavg_start,
            "clk_tck": self.clk_tck,
        })
    }
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Pins the calling thread to `cpus` (a `taskset -c` list) with `taskset -p`, for a load
/// generator's threads inside this process (the bench forbids unsafe code, so no
/// `sched_setaffinity`). The thread's id is read from `/proc/thread-self`; a failure is
/// reported and the thread stays unpinned.
pub fn pin_this_thread(cpus: &str) {
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|link| link.file_name().map(|t| t.to_string_lossy().into_owned()));
    let pinned = tid.as_deref().is_some_and(|tid| {
        Command::new("taskset")
            .args(["-p", "-c", cpus, tid])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !pinned {
        cmd::note(format!(
            "could not pin a load thread to CPU {cpus}: it runs unpinned"
        ));
    }
}

fn git_commit() -> String {
    let root = cmd::project_root();
    let Some(commit) = cmd::probe(
        Command::new("git")
            .current_dir(&root)
            .args(["rev-parse", "HEAD"]),
    ) else {
        return "unknown (not a git checkout)".to_string();
    };
    let dirty = cmd::probe(Command::new("git").current_dir(&root).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]))
    .is_some_and(|s| !s.trim().is_empty());
    let commit = commit.trim();
    if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit.to_string()
    }
}

/// UTC now as (`YYYY-MM-DD`, `YYYY-MM-DD HH:MM:SS UTC`).
pub fn utc_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let date = format!("{y:04}-{m:02}-{d:02}");
    let stamp = format!(
        "{date} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    (date, stamp)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_778), (2026, 11, 21));
    }
}
