//! Small helpers for running external commands and reporting progress.
//!
//! Every step announces itself with `==> ...` and echoes the exact command line, so a CI log
//! alone is enough to reproduce a failure by hand.

use std::ffi::OsStr;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Announces a step.
pub fn step(msg: impl Display) {
    println!("==> {msg}");
}

/// Reports a detail of the current step (e.g. that something is already there).
pub fn note(msg: impl Display) {
    println!("    {msg}");
}

/// The workspace root. This crate is always built from `<root>/harness`, so this holds
/// whatever the current directory is (`cargo xtask` may be run from any sub-directory).
pub fn project_root() -> PathBuf {
    // This crate lives in `tools/harness/`.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .nth(2)
        .unwrap_or(manifest_dir)
        .to_path_buf()
}

/// The `cargo` that runs xtask (or the benchmark), so nested builds use the same toolchain
/// (cargo sets `CARGO`).
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(project_root());
    cmd
}

/// A shell-like rendering of a command, including the environment it changes.
pub fn display(cmd: &Command) -> String {
    let mut removed = Vec::new();
    let mut set = Vec::new();
    let current_path = std::env::var("PATH").unwrap_or_default();
    for (key, value) in cmd.get_envs() {
        let key = key.to_string_lossy();
        match value {
            None => removed.push(format!("-u {key}")),
            // Keep PATH readable: `PATH=/usr/bin:$PATH` rather than the whole expansion.
            Some(value) if key == "PATH" && !current_path.is_empty() => {
                let value = value.to_string_lossy();
                match value.strip_suffix(current_path.as_str()) {
                    Some(prefix) => set.push(format!("PATH={prefix}$PATH")),
                    None => set.push(format!("PATH={}", quote(OsStr::new(value.as_ref())))),
                }
            }
            Some(value) => set.push(format!("{key}={}", quote(value))),
        }
    }
    let mut parts = Vec::new();
    if !removed.is_empty() {
        parts.push("env".to_owned());
        parts.append(&mut removed);
    }
    parts.append(&mut set);
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs a command with inherited stdio; fails unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = display(cmd);
    note(format!("$ {shown}"));
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{shown}`"))?;
    check(status, &shown)
}

/// Runs a command and returns its stdout; stderr is passed through so errors stay visible.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = display(cmd);
    note(format!("$ {shown}"));
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    check(out.status, &shown)?;
    String::from_utf8(out.stdout).with_context(|| format!("`{shown}` printed non-UTF-8 output"))
}

/// Like [`output`], but quiet and forgiving: `None` when the program is missing or fails.
/// For probes such as "is this tool installed?".
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// What became of a command run with a time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    TimedOut,
}

/// Runs a command with inherited stdio, killing it after `limit`. Used for network-bound
/// tools that may hang on machines without general internet access.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Result<Outcome> {
    let shown = display(cmd);
    note(format!("$ {shown}   (time limit {} s)", limit.as_secs()));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for `{shown}`"))?
        {
            return Ok(if status.success() {
                Outcome::Succeeded
            } else {
                Outcome::Failed
            });
        }
        if Instant::now() >= deadline {
            // Best effort: the child may have exited in the meantime.
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome::TimedOut);
        }
        thread::sleep(Duration::from_millis(200));
    }
}

pub fn check(status: ExitStatus, shown: &str) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("`{shown}` failed ({status})")
    }
}

/// Finds an executable on `PATH`, like `command -v`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// True for an existing regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Copies a build artefact into place, creating the destination folder. Writes a temporary file
/// and renames it, so a running copy of the destination (e.g. during `demo`) is not disturbed.
pub fn copy_file(from: &Path, to: &Path) -> Result<()> {
    let new = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    if std::fs::read(to).is_ok_and(|old| old == new) {
        note(format!("{} is up to date", to.display()));
        return Ok(());
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut partial = to.as_os_str().to_owned();
    partial.push(".part");
    let partial = PathBuf::from(partial);
    // `fs::copy` keeps the permission bits, so the binary stays executable.
    std::fs::copy(from, &partial)
        .with_context(|| format!("copying {} to {}", from.display(), partial.display()))?;
    std::fs::rename(&partial, to)
        .with_context(|| format!("renaming {} to {}", partial.display(), to.display()))?;
    note(format!("{} -> {}", from.display(), to.display()));
    Ok(())
}

/// Runs a `cargo build` that reports JSON messages and returns the artefact called `file_name`,
/// so callers never guess the target-directory layout (CARGO_TARGET_DIR, `--target`, ...).
pub fn cargo_build_artefact(cmd: &mut Command, file_name: &str) -> Result<PathBuf> {
    // Diagnostics still go to the terminal, rendered as usual; only stdout carries JSON.
    cmd.arg("--message-format=json-render-diagnostics");
    let messages = output(cmd)?;
    find_artefact(&messages, file_name)
        .with_context(|| format!("cargo reported no artefact named {file_name}"))
}

fn find_artefact(messages: &str, file_name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|name| name.as_str().map(PathBuf::from))
        .rfind(|path| path.file_name() == Some(OsStr::new(file_name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_named_artefact_among_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","filenames":["/t/release/libfoo.rlib"]}
not json at all
{"reason":"compiler-artifact","filenames":["/t/release/sluice"],"executable":"/t/release/sluice"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            find_artefact(messages, "sluice"),
            Some(PathBuf::from("/t/release/sluice"))
        );
        assert_eq!(find_artefact(messages, "sluice_filter.wasm"), None);
    }

    #[test]
    fn display_quotes_what_a_shell_would_split() {
        let mut cmd = Command::new("cargo");
        cmd.args(["test", "--", "a b"])
            .env("X", "1")
            .env_remove("Y");
        assert_eq!(display(&cmd), "env -u Y X=1 cargo test -- 'a b'");
    }
}
