//! The documentation's rules, so a reader can trust what the README and `docs/` say:
//!
//! * **Links resolve.** Every relative Markdown link in [`DOC_FILES`] (and the `*.md` of
//!   [`DOC_FOLDERS`])
//!   names a file of the checkout, and an anchor into a Markdown file names one of its
//!   headings; a repository path written as inline code (`` `tools/bench/results/X.md` ``)
//!   exists too. A file git ignores (a quick bench run's report, a build output) counts as
//!   missing: a clean clone will not have it, so a link to it breaks there.
//! * **Generated sections match their source.** A block between
//!   `<!-- generated from PATH#ANCHOR -->` and `<!-- end generated -->` holds exactly the
//!   section of the committed result file PATH under the heading ANCHOR (relative links
//!   rewritten for the document). `cargo xtask docs` rewrites every such block; tidy fails
//!   when one differs, so a figure can only change by changing its result file.
//! * **Every exported metric is documented, and only those.** The metric names the filter,
//!   the admin API and the coordinator define (read from their sources) are the names in
//!   the first column of the tables of [`METRICS_REFERENCE`], both ways.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

/// The documents checked, besides every `docs/*.md`.
pub const DOC_FILES: &[&str] = &["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md"];

/// Folders whose `*.md` files are checked too: the reference pages, and the committed
/// results (whose links the README's generated sections copy).
pub const DOC_FOLDERS: &[&str] = &["docs", "tools/bench/results"];

/// The one reference of metric names.
pub const METRICS_REFERENCE: &str = "docs/metrics.md";

const GENERATED_START: &str = "<!-- generated from ";
const GENERATED_END: &str = "<!-- end generated -->";

/// Where metric names are defined: (folder, how names appear there).
const METRIC_SOURCES: &[(&str, Definition)] = &[
    ("filter/src", Definition::EnvoyMetric),
    ("admin-api/src", Definition::Registry),
    ("coordinator/src", Definition::Registry),
];

/// Top-level folders whose files are written by builds, not committed.
const GENERATED_PATHS: &[&str] = &["target/", "dashboard/dist", ".venv/"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Definition {
    /// `Counter::define("NAME")` / `Gauge::define("NAME")` in the filter: the name as
    /// Envoy exports it; and the per-rule counters `sluice_rule.{id}.{outcome}_total`,
    /// exported as `sluice_rule_{outcome}_total`.
    EnvoyMetric,
    /// prometheus-client's `register("NAME", "help", ...)` (or a `("NAME", "help", ...)`
    /// tuple handed to it): counters are exported with `_total` appended.
    Registry,
}

/// A metric name the code exports, and whether the exporter may append `_total`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exported {
    pub name: String,
    pub may_add_total: bool,
    pub file: String,
}

/// Every documentation problem in the checkout at `root`.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).ok();
    let ignored = ignored_paths(root);
    let exists = |rel: &str| root.join(rel).exists() && !is_ignored(&ignored, rel);
    // Inline code may name a file relative to the crate it is about (`tests/api.rs` in a
    // paragraph on `admin-api/`).
    let crates = crate_dirs(root)?;
    let named = |rel: &str| exists(rel) || crates.iter().any(|dir| dir.join(rel).exists());
    let mut failures = Vec::new();
    for doc in doc_files(root)? {
        let text = read(&doc).with_context(|| format!("reading {doc}"))?;
        failures.extend(check_links(&doc, &text, &exists, &named, &read));
        failures.extend(check_generated(&doc, &text, &read));
    }
    let exported = exported_metrics(root)?;
    let reference = read(METRICS_REFERENCE).unwrap_or_default();
    failures.extend(check_metrics(&exported, &reference));
    Ok(failures)
}

/// The paths git ignores in the checkout at `root` (a folder ends in `/`); empty when
/// `root` is not a git checkout or git is missing, so a tarball is checked by existence.
fn ignored_paths(root: &Path) -> Vec<String> {
    let listed = std::process::Command::new("git")
        .args([
            "ls-files",
            "--others",
            "--ignored",
            "--exclude-standard",
            "--directory",
        ])
        .current_dir(root)
        .output();
    match listed {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `rel` is one of the `ignored` paths or lies in an ignored folder.
fn is_ignored(ignored: &[String], rel: &str) -> bool {
    ignored.iter().any(|path| {
        rel == path.trim_end_matches('/') || (path.ends_with('/') && rel.starts_with(path.as_str()))
    })
}

/// Rewrites every generated section from its result file; returns the documents changed.
pub fn fix(root: &Path) -> Result<Vec<String>> {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).ok();
    let mut changed = Vec::new();
    for doc in doc_files(root)? {
        let text = read(&doc).with_context(|| format!("reading {doc}"))?;
        let (rewritten, _) = regenerate(&doc, &text, &read);
        if rewritten != text {
            std::fs::write(root.join(&doc), rewritten).with_context(|| format!("writing {doc}"))?;
            changed.push(doc);
        }
    }
    Ok(changed)
}

/// The folders of the checkout holding a `Cargo.toml`, two levels deep at most.
fn crate_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    let mut pending = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        if dir.join("Cargo.toml").is_file() {
            dirs.push(dir.clone());
        }
        if depth == 2 {
            continue;
        }
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type()?.is_dir() && !name.starts_with('.') && name != "target" {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    Ok(dirs)
}

/// README.md, ARCHITECTURE.md, CONTRIBUTING.md, docs/*.md and the results' *.md, relative
/// to `root`.
fn doc_files(root: &Path) -> Result<Vec<String>> {
    let ignored = ignored_paths(root);
    let mut files: Vec<String> = DOC_FILES
        .iter()
        .filter(|f| root.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    for folder in DOC_FOLDERS {
        let dir = root.join(folder);
        if !dir.is_dir() {
            continue;
        }
        let mut inside = Vec::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {folder}/"))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let rel = format!("{folder}/{name}");
            if name.ends_with(".md") && !is_ignored(&ignored, &rel) {
                inside.push(rel);
            }
        }
        inside.sort();
        files.extend(inside);
    }
    Ok(files)
}

// ---------------------------------------------------------------------------------------
// Links

/// Broken links and repository paths in one document.
pub fn check_links(
    doc: &str,
    text: &str,
    exists: &dyn Fn(&str) -> bool,
    named: &dyn Fn(&str) -> bool,
    read: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut in_fence = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let (prose, code_spans) = split_code_spans(line);
        for target in link_targets(&prose) {
            if let Some(problem) = check_target(doc, text, &target, exists, read) {
                failures.push(format!("{doc}:{}: link `{target}`: {problem}", n + 1));
            }
        }
        for span in code_spans {
            if looks_like_repo_path(&span, exists) && !named(&span) {
                failures.push(format!(
                    "{doc}:{}: `{span}` names a file that does not exist",
                    n + 1
                ));
            }
        }
    }
    failures
}

/// The line without its inline code spans, and the spans' contents.
fn split_code_spans(line: &str) -> (String, Vec<String>) {
    let mut prose = String::new();
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        prose.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let fence = "`".repeat(ticks);
        match after.find(&fence) {
            Some(end) => {
                spans.push(after[..end].trim().to_string());
                // Keep a placeholder so `[`x`](y)` still reads as a link.
                prose.push_str("code");
                rest = &after[end + ticks..];
            }
            None => {
                prose.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    prose.push_str(rest);
    (prose, spans)
}

/// The targets of `[text](target)` and `![alt](target)` in a line of prose.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].trim();
        // `[x](<path with spaces>)` and `[x](path "title")`.
        let target = target
            .trim_start_matches('<')
            .split(['>', ' '])
            .next()
            .unwrap_or("");
        if !target.is_empty() {
            targets.push(target.to_string());
        }
        rest = &after[end + 1..];
    }
    targets
}

fn check_target(
    doc: &str,
    doc_text: &str,
    target: &str,
    exists: &dyn Fn(&str) -> bool,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        doc.to_string()
    } else {
        resolve(doc, path)?
    };
    if !exists(&file) {
        return Some(format!(
            "{file} does not exist in a clean clone (missing, or ignored by git)"
        ));
    }
    if let Some(anchor) = anchor.filter(|_| file.ends_with(".md")) {
        let text = if path.is_empty() {
            doc_text.to_string()
        } else {
            read(&file).unwrap_or_default()
        };
        if !heading_slugs(&text).contains(anchor) {
            return Some(format!("{file} has no heading #{anchor}"));
        }
    }
    None
}

/// `path` relative to the folder of `doc`, as a path from the checkout's root; `None`
/// when it leaves the checkout.
fn resolve(doc: &str, path: &str) -> Option<String> {
    let base = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut parts: Vec<String> = Vec::new();
    for component in base.join(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            _ => {}
        }
    }
    Some(parts.join("/"))
}

/// The anchors GitHub gives a document's headings: lower case, punctuation dropped,
/// spaces as `-`, repeats numbered `-1`, `-2`.
pub fn heading_slugs(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut slugs = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug = slug(title);
        let count = seen.entry(slug.clone()).or_insert(0);
        slugs.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    slugs
}

fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Inline code that names a file of the checkout: a relative path without spaces or
/// placeholders whose first folder exists, and not a build output.
fn looks_like_repo_path(span: &str, exists: &dyn Fn(&str) -> bool) -> bool {
    let Some((first, rest)) = span.split_once('/') else {
        return false;
    };
    !first.is_empty()
        && !rest.is_empty()
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && !span.contains("..")
        && !GENERATED_PATHS.iter().any(|g| span.starts_with(g))
        && !span.ends_with('/')
        && Path::new(span).extension().is_some()
        && exists(first)
}

// ---------------------------------------------------------------------------------------
// Generated sections

/// Generated sections that differ from their result files.
pub fn check_generated(
    doc: &str,
    text: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let (rewritten, mut failures) = regenerate(doc, text, read);
    if rewritten != text {
        let old: Vec<&str> = text.lines().collect();
        let new: Vec<&str> = rewritten.lines().collect();
        let at = old
            .iter()
            .zip(&new)
            .position(|(a, b)| a != b)
            .unwrap_or(old.len().min(new.len()));
        failures.push(format!(
            "{doc}:{}: a generated section differs from its result file:\n      \
             the document says: {}\n      the result says:   {}\n      \
             change the result file, not the copy; `cargo xtask docs` rewrites the copy",
            at + 1,
            old.get(at).unwrap_or(&"(nothing)"),
            new.get(at).unwrap_or(&"(nothing)"),
        ));
    }
    failures
}

/// The document with every generated section rewritten from its source, and the
/// sections that cannot be (a missing file or heading, no end marker).
fn regenerate(
    doc: &str,
    text: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut failures = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        out.push_str(line);
        out.push('\n');
        let Some(source) = line
            .trim()
            .strip_prefix(GENERATED_START)
            .and_then(|s| s.strip_suffix("-->"))
            .map(str::trim)
        else {
            continue;
        };
        let mut old = Vec::new();
        let mut closed = false;
        for (_, inner) in lines.by_ref() {
            if inner.trim() == GENERATED_END {
                closed = true;
                break;
            }
            old.push(inner);
        }
        if !closed {
            failures.push(format!(
                "{doc}:{}: generated section without `{GENERATED_END}`",
                n + 1
            ));
        }
        match section_of(doc, source, read) {
            Ok(body) => out.push_str(&body),
            Err(problem) => {
                failures.push(format!("{doc}:{}: {source}: {problem}", n + 1));
                for inner in old {
                    out.push_str(inner);
                    out.push('\n');
                }
            }
        }
        if closed {
            out.push_str(GENERATED_END);
            out.push('\n');
        }
    }
    if !text.ends_with('\n') {
        out.pop();
    }
    (out, failures)
}

/// The text under `PATH#ANCHOR`'s heading, up to the next heading of its level or
/// higher, with relative links rewritten to work from `doc`.
fn section_of(
    doc: &str,
    source: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let (path, anchor) = source
        .split_once('#')
        .ok_or("name the section: PATH#HEADING-ANCHOR")?;
    let text = read(path).ok_or_else(|| format!("{path} does not exist"))?;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut level = None;
    let mut body = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        let heading = !in_fence && line.starts_with('#');
        if fence {
            in_fence = !in_fence;
        }
        if heading {
            let depth = line.chars().take_while(|&c| c == '#').count();
            if let Some(at) = level {
                if depth <= at {
                    break;
                }
            } else {
                let base = slug(line.trim_start_matches('#').trim());
                let count = seen.entry(base.clone()).or_insert(0);
                let this = if *count == 0 {
                    base
                } else {
                    format!("{base}-{count}")
                };
                *count += 1;
                if this == anchor {
                    level = Some(depth);
                }
                continue;
            }
        }
        if level.is_some() {
            body.push(line);
        }
    }
    if level.is_none() {
        return Err(format!("{path} has no heading #{anchor}"));
    }
    while body.first().is_some_and(|l| l.trim().is_empty()) {
        body.remove(0);
    }
    while body.last().is_some_and(|l| l.trim().is_empty()) {
        body.pop();
    }
    let from = Path::new(path).parent().unwrap_or(Path::new(""));
    let mut out = String::new();
    for line in body {
        out.push_str(&relink(line, from, doc));
        out.push('\n');
    }
    Ok(out)
}

/// `line` with each relative link target, written from folder `from`, rewritten to be
/// read from `doc`.
fn relink(line: &str, from: &Path, doc: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at + 2]);
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = &after[..end];
        if target.contains("://") || target.starts_with('#') || target.is_empty() {
            out.push_str(target);
        } else {
            let joined = from.join(target);
            out.push_str(&relative_from(doc, &joined));
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `target` (from the root) as a path relative to `doc`'s folder.
fn relative_from(doc: &str, target: &Path) -> String {
    let depth = Path::new(doc)
        .parent()
        .map_or(0, |p| p.components().count());
    let mut out = PathBuf::new();
    for _ in 0..depth {
        out.push("..");
    }
    out.push(target);
    out.to_string_lossy().replace('\\', "/")
}

// ---------------------------------------------------------------------------------------
// Metrics

/// Every metric name defined in [`METRIC_SOURCES`] under `root`.
pub fn exported_metrics(root: &Path) -> Result<Vec<Exported>> {
    let mut found = Vec::new();
    for (dir, definition) in METRIC_SOURCES {
        let mut pending = vec![root.join(dir)];
        let mut in_dir = Vec::new();
        while let Some(path) = pending.pop() {
            if path.is_dir() {
                for entry in std::fs::read_dir(&path)
                    .with_context(|| format!("listing {}", path.display()))?
                {
                    pending.push(entry?.path());
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let file = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                in_dir.extend(metrics_in_source(&text, *definition, &file));
            }
        }
        anyhow::ensure!(
            !in_dir.is_empty(),
            "tidy found no metric definitions under {dir}: if they moved or changed form, \
             teach tools/xtask/src/tidy/docs.rs where they are"
        );
        found.extend(in_dir);
    }
    found.sort();
    found.dedup_by(|a, b| a.name == b.name);
    Ok(found)
}

/// The metric names one source file defines. Test modules are left out.
pub fn metrics_in_source(text: &str, definition: Definition, file: &str) -> Vec<Exported> {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut found = Vec::new();
    let exported = |name: String, may_add_total| Exported {
        name,
        may_add_total,
        file: file.to_string(),
    };
    let mut rest = text;
    while let Some(at) = rest.find("\"sluice_") {
        let before = &rest[..at];
        let after = &rest[at + 1..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..end];
        let closed = after[end..].starts_with('"');
        let tail = after[end..].trim_start_matches('"').trim_start();
        match definition {
            Definition::EnvoyMetric => {
                if closed && before.ends_with("::define(") {
                    found.push(exported(name.to_string(), false));
                }
            }
            Definition::Registry => {
                if closed && tail.starts_with(',') && tail[1..].trim_start().starts_with('"') {
                    found.push(exported(name.to_string(), true));
                }
            }
        }
        rest = &after[end..];
    }
    if definition == Definition::EnvoyMetric
        && text.contains("\"sluice_rule.{id}.{outcome}_total\"")
    {
        let mut rest = text;
        while let Some(at) = rest.find("counter(\"") {
            let after = &rest[at + "counter(\"".len()..];
            let end = after.find('"').unwrap_or(0);
            let outcome = &after[..end];
            if !outcome.is_empty() && outcome.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                found.push(exported(format!("sluice_rule_{outcome}_total"), false));
            }
            rest = &after[end..];
        }
    }
    found
}

/// The names the reference documents: backticked `sluice_*` names in the first cell of
/// its table rows (labels in `{...}` dropped).
pub fn documented_metrics(reference: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in reference.lines() {
        let Some(row) = line.trim().strip_prefix('|') else {
            continue;
        };
        let first = row.split('|').next().unwrap_or("");
        let (_, spans) = split_code_spans(first);
        for span in spans {
            let name: String = span
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with("sluice_") {
                names.insert(name);
            }
        }
    }
    names
}

/// Exported metrics missing from the reference, and documented ones nothing exports.
pub fn check_metrics(exported: &[Exported], reference: &str) -> Vec<String> {
    let documented = documented_metrics(reference);
    let mut failures = Vec::new();
    let mut matched = BTreeSet::new();
    for metric in exported {
        let total = format!("{}_total", metric.name);
        let as_documented = if documented.contains(&metric.name) {
            Some(metric.name.clone())
        } else if metric.may_add_total && documented.contains(&total) {
            Some(total.clone())
        } else {
            None
        };
        match as_documented {
            Some(name) => {
                matched.insert(name);
            }
            None => failures.push(format!(
                "metric `{}` ({}) is exported but not documented in {METRICS_REFERENCE}",
                if metric.may_add_total {
                    format!("{} or {total}", metric.name)
                } else {
                    metric.name.clone()
                },
                metric.file
            )),
        }
    }
    for name in documented.difference(&matched) {
        failures.push(format!(
            "{METRICS_REFERENCE} documents `{name}`, which no code exports"
        ));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&'static str, &'static str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn links(doc: &str, text: &str, repo: &BTreeMap<String, String>) -> Vec<String> {
        let exists =
            |p: &str| repo.contains_key(p) || repo.keys().any(|k| k.starts_with(&format!("{p}/")));
        let read = |p: &str| repo.get(p).cloned();
        check_links(doc, text, &exists, &exists, &read)
    }

    #[test]
    fn ignored_files_and_files_in_ignored_folders_count_as_missing() {
        let ignored = vec![
            "tools/bench/results/2026-11-26-quick-tokens.md".to_string(),
            "target/".to_string(),
        ];
        assert!(is_ignored(
            &ignored,
            "tools/bench/results/2026-11-26-quick-tokens.md"
        ));
        assert!(is_ignored(&ignored, "target/dist/sluice_filter.wasm"));
        assert!(!is_ignored(
            &ignored,
            "tools/bench/results/2026-11-26-tokens.md"
        ));
        assert!(!is_ignored(&ignored, "targets.md"));
    }

    #[test]
    fn a_broken_link_fails_and_a_good_one_passes() {
        let repo = files(&[
            ("README.md", ""),
            ("docs/metrics.md", "# Metrics\n## The filter's counters\n"),
            ("tools/bench/results/2026-11-25.md", ""),
        ]);
        let text = "See [the results](tools/bench/results/2026-11-25.md), \
                    [metrics](docs/metrics.md#the-filters-counters), [up](#top) and \
                    [site](https://example.com).\n\n# Top\n";
        assert_eq!(links("README.md", text, &repo), Vec::<String>::new());

        let broken = "[gone](tools/bench/results/2026-11-25-quick-hostcalls.md)\n";
        let failures = links("README.md", broken, &repo);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("does not exist"), "{failures:?}");

        let bad_anchor = "[m](docs/metrics.md#nothing-here)\n";
        assert_eq!(links("README.md", bad_anchor, &repo).len(), 1);
        // From docs/, `../` climbs to the root.
        assert!(links("docs/x.md", "[r](../README.md)", &repo).is_empty());
        assert_eq!(links("docs/x.md", "[r](README.md)", &repo).len(), 1);
    }

    #[test]
    fn a_missing_path_in_inline_code_fails_but_code_blocks_and_build_outputs_do_not() {
        let repo = files(&[("tools/bench/results/a.md", "")]);
        assert!(links("README.md", "`tools/bench/results/a.md`", &repo).is_empty());
        assert_eq!(
            links("README.md", "`tools/bench/results/b.md`", &repo).len(),
            1
        );
        assert!(links("README.md", "```\n[x](nowhere.md)\n```\n", &repo).is_empty());
        assert!(links("README.md", "`target/dist/sluice_filter.wasm`", &repo).is_empty());
        assert!(links("README.md", "`/api/v1/rules`, `a/b`", &repo).is_empty());
    }

    #[test]
    fn slugs_follow_github() {
        let slugs = heading_slugs(
            "# Sluice\n## What clients see\n### gRPC clients\n## Fleet-wide limits, measured\n\
             ## The coordinator: 20 proxies × 10000 active buckets\n## Metrics\n## Metrics\n",
        );
        for slug in [
            "sluice",
            "what-clients-see",
            "grpc-clients",
            "fleet-wide-limits-measured",
            "the-coordinator-20-proxies--10000-active-buckets",
            "metrics",
            "metrics-1",
        ] {
            assert!(slugs.contains(slug), "{slug} in {slugs:?}");
        }
    }

    const RESULT: &str = "# Bench\n\nIntro, see [json](run.json).\n\n## Headline\n\n\
                          | variant | µs |\n|---|---|\n| (d) Sluice | 31.9 |\n\n\
                          Raw: [data](run.json).\n\n### Detail\n\nkept\n\n## Next\n\nnot kept\n";

    fn read_result(path: &str) -> Option<String> {
        (path == "tools/bench/results/run.md").then(|| RESULT.to_string())
    }

    fn doc_with(body: &str) -> String {
        format!(
            "# Doc\n\n<!-- generated from tools/bench/results/run.md#headline -->\n{body}\
             <!-- end generated -->\n\nafter\n"
        )
    }

    #[test]
    fn a_generated_section_is_its_source_section_with_links_rewritten() {
        let (text, failures) = regenerate("docs/x.md", &doc_with(""), &read_result);
        assert!(failures.is_empty(), "{failures:?}");
        assert!(text.contains("| (d) Sluice | 31.9 |\n"), "{text}");
        assert!(
            text.contains("[data](../tools/bench/results/run.json)"),
            "{text}"
        );
        assert!(
            text.contains("### Detail\n\nkept\n<!-- end generated -->"),
            "{text}"
        );
        assert!(!text.contains("not kept"), "{text}");
        assert!(check_generated("docs/x.md", &text, &read_result).is_empty());
        // Regenerating is idempotent.
        assert_eq!(regenerate("docs/x.md", &text, &read_result).0, text);
    }

    #[test]
    fn a_changed_figure_fails() {
        let (good, _) = regenerate("README.md", &doc_with(""), &read_result);
        let changed = good.replace("31.9", "29.9");
        let failures = check_generated("README.md", &changed, &read_result);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains("| (d) Sluice | 29.9 |"),
            "{failures:?}"
        );
        assert!(
            failures[0].contains("| (d) Sluice | 31.9 |"),
            "{failures:?}"
        );
    }

    #[test]
    fn a_generated_section_with_a_missing_source_fails() {
        let text = "<!-- generated from tools/bench/results/gone.md#headline -->\nold\n\
                    <!-- end generated -->\n";
        let failures = check_generated("README.md", text, &read_result);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("does not exist"), "{failures:?}");
        let text = text.replace("gone.md#headline", "run.md#nowhere");
        assert_eq!(check_generated("README.md", &text, &read_result).len(), 1);
    }

    const FILTER: &str = r#"
        fn define() -> Metrics {
            Metrics { requests: Counter::define("sluice_requests_total"),
                      version: Gauge::define("sluice_control_ruleset_version") }
        }
        let counter = |outcome: &str| Counter::define(&format!("sluice_rule.{id}.{outcome}_total"));
        RuleCounters { allowed: counter("allowed"), denied: counter("denied") }
        #[cfg(test)]
        mod tests { fn t() { Counter::define("sluice_only_in_tests_total"); } }
    "#;

    const ADMIN: &str = r#"
        registry.register("sluice_admin_rules", "Rules stored", rules.clone());
        registry.register(
            "sluice_admin_http_requests",
            "HTTP requests answered",
            requests.clone(),
        );
        let cookie = "sluice_session";
        let counters = [("sluice_quota_syncs", "Sync requests answered", &m.syncs)];
    "#;

    fn exported() -> Vec<Exported> {
        let mut all = metrics_in_source(FILTER, Definition::EnvoyMetric, "filter/src/metrics.rs");
        all.extend(metrics_in_source(
            ADMIN,
            Definition::Registry,
            "admin-api/src/metrics.rs",
        ));
        all
    }

    #[test]
    fn metric_names_are_read_from_their_definitions() {
        let names: Vec<String> = exported().into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "sluice_requests_total",
                "sluice_control_ruleset_version",
                "sluice_rule_allowed_total",
                "sluice_rule_denied_total",
                "sluice_admin_rules",
                "sluice_admin_http_requests",
                "sluice_quota_syncs",
            ]
        );
    }

    const REFERENCE: &str = "# Metrics\n\n| metric | meaning |\n|---|---|\n\
        | `sluice_requests_total` | requests |\n\
        | `sluice_control_ruleset_version` | gauge |\n\
        | `sluice_rule_allowed_total` / `sluice_rule_denied_total` | per rule |\n\
        | `sluice_admin_rules` | gauge |\n\
        | `sluice_admin_http_requests_total{method,route,status}` | counter |\n\
        | `sluice_quota_syncs_total` | counter |\n\n\
        PromQL: `rate(sluice_requests_total[5m])` and `sluice_not_a_row_total`.\n";

    #[test]
    fn documented_and_exported_metrics_agree() {
        assert_eq!(check_metrics(&exported(), REFERENCE), Vec::<String>::new());
    }

    #[test]
    fn an_undocumented_metric_fails() {
        let reference = REFERENCE.replace("| `sluice_admin_rules` | gauge |\n", "");
        let failures = check_metrics(&exported(), &reference);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("sluice_admin_rules"), "{failures:?}");
        assert!(failures[0].contains("not documented"), "{failures:?}");
    }

    #[test]
    fn a_documented_metric_nothing_exports_fails() {
        let reference = format!("{REFERENCE}\n| `sluice_gone_total` | removed |\n");
        let failures = check_metrics(&exported(), &reference);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("sluice_gone_total"), "{failures:?}");
        // A filter counter is exported as written: no `_total` is added to it.
        let reference = REFERENCE.replace("sluice_requests_total`", "sluice_requests`");
        assert_eq!(check_metrics(&exported(), &reference).len(), 2);
    }
}
