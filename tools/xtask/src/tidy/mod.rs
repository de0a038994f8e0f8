//! `cargo xtask tidy`: the repository's structural rules, checked on every run of the suite
//! (its first step: it takes seconds and builds nothing).
//!
//! * No import circle inside any crate ([`modules`]): the files of a crate depend on each
//!   other one way, so a reader can take them in order and a model type never learns how it
//!   is presented.
//! * No product source file over [`MAX_PRODUCT_FILE_LINES`] lines: past that a file holds
//!   more than one idea. Tooling (`tools/`) and test files are exempt.
//! * The documentation's links resolve, its generated sections match the committed
//!   results they come from, and the metrics reference lists exactly the metrics the code
//!   exports ([`docs`]; `cargo xtask docs` rewrites the generated sections).

pub mod docs;
pub mod modules;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sluice_harness::cmd::{self, note, step};

/// The longest a product source file may be.
pub const MAX_PRODUCT_FILE_LINES: usize = 900;

/// Folders never searched for crates.
const SKIPPED_DIRS: &[&str] = &["target", ".git", ".venv", "node_modules", "dist"];

/// Runs every rule over the checkout, reporting all failures before failing.
pub fn tidy() -> Result<()> {
    let root = cmd::project_root();
    let crates = crate_roots(&root)?;
    let mut failures = Vec::new();

    step(format!(
        "tidy: import circles in {} crate roots",
        crates.len()
    ));
    for crate_root in &crates {
        let read = |path: &Path| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        let edges = modules::crate_edges(crate_root, &read)?;
        for cycle in modules::cycles(&edges) {
            failures.push(describe_cycle(&root, &cycle, &edges));
        }
    }

    step(format!(
        "tidy: product source files of at most {MAX_PRODUCT_FILE_LINES} lines"
    ));
    for file in product_sources(&root, &crates)? {
        let lines = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .lines()
            .count();
        if lines > MAX_PRODUCT_FILE_LINES {
            failures.push(format!(
                "{} has {lines} lines (at most {MAX_PRODUCT_FILE_LINES}): split it by responsibility",
                relative(&root, &file)
            ));
        }
    }

    step(format!(
        "tidy: documentation links, generated sections and the metrics reference ({})",
        docs::METRICS_REFERENCE
    ));
    failures.extend(docs::check(&root)?);

    if failures.is_empty() {
        step("tidy passed");
        return Ok(());
    }
    for failure in &failures {
        note(failure);
    }
    bail!("tidy found {} problem(s) (above)", failures.len())
}

/// `cargo xtask docs`: rewrites every generated section of the documentation from the
/// committed result file it names.
pub fn fix_docs() -> Result<()> {
    let root = cmd::project_root();
    let changed = docs::fix(&root)?;
    if changed.is_empty() {
        step("docs: every generated section already matches its result file");
    } else {
        step(format!(
            "docs: rewrote generated sections in {}",
            changed.join(", ")
        ));
    }
    Ok(())
}

/// A circle, with the path that makes each of its edges, so the fix is obvious.
fn describe_cycle(root: &Path, cycle: &[PathBuf], edges: &[modules::Edge]) -> String {
    let mut text = format!(
        "import circle among {} files (each must depend on the others one way only):",
        cycle.len()
    );
    for edge in edges
        .iter()
        .filter(|e| cycle.contains(&e.from) && cycle.contains(&e.to))
    {
        text.push_str(&format!(
            "\n      {} -> {} (uses {})",
            relative(root, &edge.from),
            relative(root, &edge.to),
            edge.because
        ));
    }
    text
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every `src/lib.rs` and `src/main.rs` of the crates under `root`.
fn crate_roots(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        if dir.join("Cargo.toml").is_file() {
            for name in ["lib.rs", "main.rs"] {
                let file = dir.join("src").join(name);
                if file.is_file() {
                    found.push(file);
                }
            }
        }
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry?;
            let name = entry.file_name();
            let skipped =
                SKIPPED_DIRS.iter().any(|s| name == *s) || name.to_string_lossy().starts_with('.');
            if !skipped && entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The `.rs` files under the `src/` of each product crate: not tooling (`tools/`), not the
/// end-to-end tests (`tests/`).
fn product_sources(root: &Path, crates: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for crate_root in crates {
        let src = crate_root.parent().unwrap_or(root);
        let inside = relative(root, src);
        if inside.starts_with("tools/")
            || inside.starts_with("tests/")
            || !seen.insert(src.to_path_buf())
        {
            continue;
        }
        let mut pending = vec![src.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
            {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    Ok(files)
}
