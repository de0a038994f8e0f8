//! Running `cargo test` while counting its results, for one closing summary line.
//!
//! cargo prints a `test result:` line per test binary, and the last one is often an empty
//! doc-test run; CI and people want one total for the whole suite.

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_harness::cmd::{self, note};

/// Test counts summed over libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl TestCounts {
    /// Adds the counts of one libtest `test result: ok. 7 passed; 0 failed; 1 ignored; ...`
    /// line, or of cargo-nextest's closing `Summary [ 9.1s] 9 tests run: 8 passed, 1 failed,
    /// 2 skipped` line (where a test that timed out counts as failed).
    fn add_result_line(&mut self, line: &str) {
        let line = line.trim();
        let rest = if let Some(rest) = line.strip_prefix("test result: ") {
            rest
        } else if line.starts_with("Summary [") {
            match line.split_once(" run: ") {
                Some((_, rest)) => rest,
                None => return,
            }
        } else {
            return;
        };
        for part in rest.split(['.', ';', ',']) {
            let mut words = part.split_whitespace();
            let (Some(count), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(count) = count.parse::<u64>() else {
                continue;
            };
            match what {
                "passed" => self.passed += count,
                "failed" | "timed" => self.failed += count,
                "ignored" | "skipped" => self.ignored += count,
                _ => {}
            }
        }
    }
}

/// Runs `cargo test`, passing its output through while adding up the test counts into `counts`
/// (also when it fails, so the caller can still report them).
///
/// stdout and stderr share one socket pair, so cargo's status lines, libtest's results and
/// panic messages stay in the order they were written.
pub fn run_tests(cmd: &mut Command, counts: &mut TestCounts) -> Result<()> {
    let shown = cmd::display(cmd);
    note(format!("$ {shown}"));
    let (read_end, write_end) = UnixStream::pair().context("creating a socket for test output")?;
    let write_end_too = write_end
        .try_clone()
        .context("duplicating the test output socket")?;
    cmd.stdout(Stdio::from(OwnedFd::from(write_end)))
        .stderr(Stdio::from(OwnedFd::from(write_end_too)));
    let spawned = cmd.spawn();
    // The command keeps its copies of the write end; drop them, or the reader never sees EOF.
    cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let mut child = spawned.with_context(|| format!("could not start `{shown}`"))?;

    let read_end_handle = read_end
        .try_clone()
        .context("duplicating the test output socket")?;
    let (done_tx, done_rx) = mpsc::channel();
    let relay = thread::spawn(move || {
        let result = relay_test_output(read_end);
        // The receiver may have given up waiting; nothing to do then.
        let _ = done_tx.send(());
        result
    });

    let status = child
        .wait()
        .with_context(|| format!("waiting for `{shown}`"));
    // A process the tests started and leaked (e.g. an Envoy) inherits the socket and would keep
    // the relay waiting forever: give it a moment, then stop reading.
    if done_rx.recv_timeout(Duration::from_secs(2)).is_err() {
        note("processes left behind by the tests still hold their output; no longer relaying it");
        let _ = read_end_handle.shutdown(Shutdown::Read);
    }
    match relay.join() {
        Ok(Ok(relayed)) => {
            counts.passed += relayed.passed;
            counts.failed += relayed.failed;
            counts.ignored += relayed.ignored;
        }
        Ok(Err(err)) => note(format!("relaying test output: {err:#}")),
        Err(_panic) => note("relaying test output panicked"),
    }
    cmd::check(status?, &shown)
}

fn relay_test_output(read_end: UnixStream) -> Result<TestCounts> {
    let mut counts = TestCounts::default();
    let mut reader = BufReader::new(read_end);
    let mut terminal = std::io::stdout();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader
            .read_until(b'\n', &mut line)
            .context("reading test output")?
            == 0
        {
            return Ok(counts);
        }
        terminal
            .write_all(&line)
            .and_then(|()| terminal.flush())
            .context("writing test output")?;
        counts.add_result_line(&String::from_utf8_lossy(&line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_result_lines() {
        let mut counts = TestCounts::default();
        counts.add_result_line(
            "test result: ok. 7 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; \
             finished in 0.00s\n",
        );
        counts.add_result_line("test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured");
        counts.add_result_line("test passed ... ok");
        counts.add_result_line(
            "     Summary [  41.203s] 12 tests run: 9 passed, 2 failed, 1 timed out, 4 skipped",
        );
        counts.add_result_line("        PASS [   1.204s] sluice-tests::smoke envoy_proxies");
        let expected = TestCounts {
            passed: 17,
            failed: 6,
            ignored: 6,
        };
        assert_eq!(counts, expected);
    }
}
