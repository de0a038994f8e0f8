//! Report ingestion and metric queries of the admin API: `sluice_admin::ingest_bench`
//! (simulated proxies POSTing a report a second each against the real server on
//! loopback, and the dashboard's queries over a week of history), run as its example
//! binary and saved beside the main report.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cmd::{self, note, step};

/// Runs the ingest benchmark for `seconds` with `proxies` proxies and writes its Markdown
/// tables to `<out_dir>/<name>-ingest.md`.
pub fn run(out_dir: &Path, name: &str, proxies: usize, seconds: u64) -> Result<PathBuf> {
    let args = [
        "run".to_string(),
        "--release".into(),
        "--quiet".into(),
        "-p".into(),
        "sluice-admin".into(),
        "--example".into(),
        "ingest_bench".into(),
        "--".into(),
        "--proxies".into(),
        proxies.to_string(),
        "--seconds".into(),
        seconds.to_string(),
    ];
    let command = format!("cargo {}", args.join(" "));
    step(format!("ingest: {command}"));
    let output = cmd::cargo()
        .args(&args)
        .current_dir(cmd::project_root())
        .output()
        .context("running the ingest benchmark")?;
    if !output.status.success() {
        bail!(
            "the ingest benchmark failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tables = String::from_utf8_lossy(&output.stdout);
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
