//! Building the dashboard: the Leptos app for wasm32 (same toolchain route as the filter),
//! `wasm-bindgen` for its JavaScript glue, and the files in `dashboard/dist/` that the
//! `sluice` binary embeds (rust-embed, see `admin-api/src/ui.rs`).
//!
//! Asset names carry a content hash (`assets/sluice_dashboard-1a2b3c4d5e6f7081.wasm`), so the
//! server can let browsers cache them for a year; `index.html` names the current ones. The
//! folder is rewritten only when its content changes, so an unchanged dashboard does not make
//! cargo rebuild `sluice`.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{CHROMEDRIVER_ENV, CHROMIUM_ENV};

use crate::toolchain::WasmRoute;

const PACKAGE: &str = "sluice-dashboard";
const ARTEFACT: &str = "sluice_dashboard.wasm";
/// `[profile.dashboard]` in the workspace manifest: release, optimised for size.
pub const PROFILE: &str = "dashboard";
/// `[profile.dashboard-test]`: what the suite tests, built quickly.
pub const TEST_PROFILE: &str = "dashboard-test";
const OUT_NAME: &str = "sluice_dashboard";

/// What was built, for the summary line.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub dir: PathBuf,
    pub wasm_bytes: u64,
    pub wasm_gzip_bytes: Option<u64>,
    pub js_bytes: u64,
}

pub fn dist_dir() -> PathBuf {
    cmd::project_root().join("dashboard").join("dist")
}

/// Builds the dashboard into `dashboard/dist/` in `cargo_profile`: [`PROFILE`] to ship,
/// [`TEST_PROFILE`] for the suite.
pub fn build(route: WasmRoute, cargo_profile: &str) -> Result<Bundle> {
    step(format!(
        "building {PACKAGE} (wasm32, profile `{cargo_profile}`, {route} route)"
    ));
    let mut command = route.cargo("build");
    command
        .args(["--profile", cargo_profile, "--package", PACKAGE])
        // Leptos then type-erases views and reactive closures: much less monomorphised code,
        // so a smaller bundle and a faster build, for a vtable call per render.
        .env("RUSTFLAGS", rustflags());
    let wasm = cmd::cargo_build_artefact(&mut command, ARTEFACT)
        .with_context(|| format!("building {PACKAGE} for wasm32"))?;
    let bindgen = ensure_wasm_bindgen()?;

    step("generating the dashboard's JavaScript glue (wasm-bindgen)");
    let generated = cmd::project_root().join("target").join("dashboard-bindgen");
    remove_dir(&generated)?;
    cmd::run(
        Command::new(&bindgen)
            .args([
                "--target",
                "web",
                "--no-typescript",
                "--remove-name-section",
            ])
            .arg("--out-name")
            .arg(OUT_NAME)
            .arg("--out-dir")
            .arg(&generated)
            .arg(&wasm),
    )
    .context("running wasm-bindgen")?;

    step("assembling dashboard/dist/");
    let files = assemble(&generated)?;
    let dir = dist_dir();
    write_if_changed(&dir, &files)?;
    let size = |suffix: &str| {
        files
            .iter()
            .find(|(name, _)| name.ends_with(suffix))
            .map_or(0, |(_, bytes)| bytes.len() as u64)
    };
    let bundle = Bundle {
        dir,
        wasm_bytes: size(".wasm"),
        wasm_gzip_bytes: files
            .iter()
            .find(|(name, _)| name.ends_with(".wasm.gz"))
            .map(|(_, bytes)| bytes.len() as u64),
        js_bytes: files
            .iter()
            .filter(|(name, _)| name.ends_with(".js"))
            .map(|(_, bytes)| bytes.len() as u64)
            .sum(),
    };
    note(format!(
        "bundle: {} KiB wasm{}, {} KiB JavaScript",
        bundle.wasm_bytes / 1024,
        bundle
            .wasm_gzip_bytes
            .map(|g| format!(" ({} KiB gzipped)", g / 1024))
            .unwrap_or_default(),
        bundle.js_bytes / 1024
    ));
    Ok(bundle)
}

fn rustflags() -> String {
    let existing = std::env::var("RUSTFLAGS").unwrap_or_default();
    format!("{existing} --cfg erase_components")
        .trim()
        .to_string()
}

/// The files of `dashboard/dist/`, by relative path.
fn assemble(generated: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let root = cmd::project_root().join("dashboard");
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let js = read(&generated.join(format!("{OUT_NAME}.js")))?;
    let wasm = read(&generated.join(format!("{OUT_NAME}_bg.wasm")))?;
    let css = read(&root.join("style.css"))?;
    let index =
        String::from_utf8(read(&root.join("index.html"))?).context("index.html is not UTF-8")?;

    let mut files = BTreeMap::new();
    let js_name = format!("assets/{OUT_NAME}-{}.js", content_hash(&js));
    let wasm_name = format!("assets/{OUT_NAME}_bg-{}.wasm", content_hash(&wasm));
    let css_name = format!("assets/style-{}.css", content_hash(&css));
    // A separate module (not an inline script), so the page's CSP can forbid inline scripts.
    let boot = format!(
        "// Generated by `cargo xtask build`.\nimport init from '/{js_name}';\ninit({{ module_or_path: '/{wasm_name}' }});\n"
    );
    let boot_name = format!("assets/boot-{}.js", content_hash(boot.as_bytes()));
    for placeholder in ["{{style}}", "{{script}}", "{{boot}}"] {
        if !index.contains(placeholder) {
            bail!("dashboard/index.html lacks the placeholder {placeholder}");
        }
    }
    let index = index
        .replace("{{style}}", &css_name)
        .replace("{{script}}", &js_name)
        .replace("{{boot}}", &boot_name);
    files.insert(js_name, js);
    files.insert(wasm_name, wasm);
    files.insert(css_name, css);
    files.insert(boot_name, boot.into_bytes());
    files.insert("index.html".to_string(), index.into_bytes());
    // Inline JavaScript snippets of dependencies, imported relative to the glue.
    let snippets = generated.join("snippets");
    if snippets.is_dir() {
        collect(&snippets, "assets/snippets", &mut files)?;
    }
    // Gzipped copies, served to browsers that accept gzip (all of them): the wasm shrinks
    // to about a third. Without a `gzip` program the server sends the plain files.
    let compressible: Vec<String> = files
        .keys()
        .filter(|name| {
            [".wasm", ".js", ".css"]
                .iter()
                .any(|ext| name.ends_with(ext))
        })
        .cloned()
        .collect();
    for name in compressible {
        if let Some(gz) = files.get(&name).and_then(|bytes| gzip(bytes)) {
            files.insert(format!("{name}.gz"), gz);
        }
    }
    Ok(files)
}

fn collect(dir: &Path, prefix: &str, files: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        if entry.file_type()?.is_dir() {
            collect(&entry.path(), &name, files)?;
        } else {
            files.insert(name, std::fs::read(entry.path())?);
        }
    }
    Ok(())
}

/// 16 hex digits of a fixed-key SipHash: enough to tell builds apart for cache busting.
fn content_hash(bytes: &[u8]) -> String {
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    format!("{:016x}", hasher.finish())
}

/// Replaces `dir` with exactly `files`, unless it already holds exactly them.
fn write_if_changed(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    let mut existing = BTreeMap::new();
    if dir.is_dir() {
        collect(dir, "", &mut existing)?;
    }
    let existing: BTreeMap<String, Vec<u8>> = existing
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches('/').to_string(), v))
        .collect();
    if &existing == files {
        note(format!("{} is up to date", dir.display()));
        return Ok(());
    }
    let staging = dir.with_extension("partial");
    remove_dir(&staging)?;
    for (name, bytes) in files {
        let path = staging.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    remove_dir(dir)?;
    std::fs::rename(&staging, dir)
        .with_context(|| format!("renaming {} to {}", staging.display(), dir.display()))?;
    note(format!("wrote {} files to {}", files.len(), dir.display()));
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// `gzip -9n` (no name or time stamp, so the output depends only on the input).
fn gzip(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = Command::new("gzip")
        .arg("-9nc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    let input = bytes.to_vec();
    // Written from another thread: gzip's output fills its pipe before its input is read.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().ok()?;
    writer.join().ok()?.ok()?;
    out.status.success().then_some(out.stdout)
}

/// The `wasm-bindgen` version in Cargo.lock: the CLI must match the library exactly.
pub fn locked_bindgen_version() -> Result<String> {
    let lock_path = cmd::project_root().join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path)
        .with_context(|| format!("reading {}", lock_path.display()))?;
    bindgen_version_in(&lock).context("Cargo.lock has no wasm-bindgen package")
}

fn bindgen_version_in(lock: &str) -> Option<String> {
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"wasm-bindgen\"" {
            let version = lines.next()?.trim();
            return Some(
                version
                    .strip_prefix("version = \"")?
                    .strip_suffix('"')?
                    .to_string(),
            );
        }
    }
    None
}

/// A `wasm-bindgen` of exactly the locked version: on PATH, in cargo's bin folder, or
/// installed there now with `cargo install` (a few minutes, once).
fn ensure_wasm_bindgen() -> Result<PathBuf> {
    let version = locked_bindgen_version()?;
    step(format!(
        "checking for wasm-bindgen {version} (the version in Cargo.lock)"
    ));
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|home| home.join("bin"));
    let candidates: Vec<PathBuf> = cmd::which("wasm-bindgen")
        .into_iter()
        .chain(cargo_bin.iter().map(|bin| bin.join("wasm-bindgen")))
        .collect();
    let has_version = |path: &Path| {
        cmd::probe(Command::new(path).arg("--version"))
            .is_some_and(|v| v.split_whitespace().nth(1) == Some(version.as_str()))
    };
    if let Some(found) = candidates.iter().find(|p| has_version(p)) {
        note(format!("found {}", found.display()));
        return Ok(found.clone());
    }
    match candidates.iter().find(|p| cmd::is_executable(p)) {
        Some(other) => note(format!(
            "{} is another version; installing {version} alongside cargo's tools",
            other.display()
        )),
        None => note("not installed"),
    }
    step(format!(
        "installing wasm-bindgen-cli {version} with cargo install (takes a few minutes, once)"
    ));
    // No --locked: one of its pinned dependencies is missing from some registry mirrors.
    cmd::run(cmd::cargo().args(["install", "wasm-bindgen-cli", "--version", &version]))
        .context("installing wasm-bindgen-cli")?;
    let installed = cargo_bin
        .map(|bin| bin.join("wasm-bindgen"))
        .filter(|p| has_version(p))
        .context(
            "wasm-bindgen-cli was installed, but cargo's bin folder has no matching wasm-bindgen",
        )?;
    note(format!("installed {}", installed.display()));
    Ok(installed)
}

/// Chromium and chromedriver for the dashboard's browser tests: from `SLUICE_CHROMIUM` and
/// `SLUICE_CHROMEDRIVER`, or Debian's `chromium` and `chromium-driver`, installed if missing.
pub fn ensure_browser() -> Result<(PathBuf, PathBuf)> {
    step("provisioning Chromium and chromedriver (for the dashboard's browser tests)");
    let from_env = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let (Some(chromium), Some(driver)) = (from_env(CHROMIUM_ENV), from_env(CHROMEDRIVER_ENV)) {
        note(format!(
            "using {CHROMIUM_ENV}={} and {CHROMEDRIVER_ENV}={}",
            chromium.display(),
            driver.display()
        ));
        return Ok((chromium, driver));
    }
    let chromium = PathBuf::from("/usr/bin/chromium");
    let driver = PathBuf::from("/usr/bin/chromedriver");
    if cmd::is_executable(&chromium) && cmd::is_executable(&driver) {
        note("Debian's chromium and chromium-driver are installed");
    } else {
        note("chromium or chromedriver missing: installing Debian's packages");
        sluice_harness::apt::install(&["chromium", "chromium-driver"])?;
        if !(cmd::is_executable(&chromium) && cmd::is_executable(&driver)) {
            bail!(
                "installed chromium and chromium-driver, but /usr/bin/chromium or /usr/bin/chromedriver is still missing"
            );
        }
    }
    if let Some(version) = cmd::probe(Command::new(&driver).arg("--version")) {
        note(version.trim());
    }
    Ok((chromium, driver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_locked_wasm_bindgen_version() {
        let lock = "[[package]]\nname = \"wasm-bindgen-futures\"\nversion = \"0.4.80\"\n\n\
                    [[package]]\nname = \"wasm-bindgen\"\nversion = \"0.2.130\"\nsource = \"x\"\n";
        assert_eq!(bindgen_version_in(lock).as_deref(), Some("0.2.130"));
        assert_eq!(bindgen_version_in("[[package]]\nname = \"x\"\n"), None);
    }

    #[test]
    fn content_hashes_are_stable_and_differ() {
        assert_eq!(content_hash(b"a"), content_hash(b"a"));
        assert_ne!(content_hash(b"a"), content_hash(b"b"));
        assert_eq!(content_hash(b"a").len(), 16);
    }
}
