//! The corpus test's driver: runs one target on every corpus file, then on mutated corpus
//! entries for a time box, each input under `catch_unwind`; the first panic stops the
//! target, with its input saved and the command that replays it under libFuzzer.

pub mod mutate;

use std::any::Any;
use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Write;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, mpsc};
use std::time::{Duration, Instant};

use mutate::Mutator;

/// The time box per target when `SLUICE_FUZZ_SECONDS` is not set.
pub const DEFAULT_SECONDS: f64 = 2.0;

/// The base seed when `SLUICE_FUZZ_SEED` is not set: fixed, so two runs of the suite try
/// the same inputs (as many as each has time for).
pub const DEFAULT_SEED: u64 = 0x51ce_f022_5eed_0001;

/// An input that runs this long is a hang, as `cargo xtask fuzz` has libFuzzer report it:
/// nothing a proxy decodes may take seconds.
const INPUT_TIMEOUT: Duration = Duration::from_secs(20);

/// libFuzzer's default for the longest input it makes (`-max_len`): 4096 bytes, or the
/// longest corpus entry.
const MIN_MAX_LEN: usize = 4096;

/// How one run fuzzes.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long to feed mutated inputs, after the corpus: a duration, never a count, since
    /// inputs per second differ a hundredfold between targets and machines.
    pub time_box: Duration,
    /// Each target's mutator is seeded with this and the target's name.
    pub seed: u64,
    /// Where failing mutated inputs are saved.
    pub failures: PathBuf,
}

impl Settings {
    /// From `SLUICE_FUZZ_SECONDS` (seconds per target, fractions allowed, 0 to replay the
    /// corpus only) and `SLUICE_FUZZ_SEED` (decimal or `0x` hex), or their defaults.
    pub fn from_env(failures: PathBuf) -> Settings {
        let seconds = match std::env::var("SLUICE_FUZZ_SECONDS") {
            Ok(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or_else(|| {
                    panic!(
                        "SLUICE_FUZZ_SECONDS={text:?}: expected seconds per target, like 2 or 0.5"
                    )
                }),
            Err(_) => Duration::from_secs_f64(DEFAULT_SECONDS),
        };
        let seed = match std::env::var("SLUICE_FUZZ_SEED") {
            Ok(text) => parse_seed(&text).unwrap_or_else(|| {
                panic!("SLUICE_FUZZ_SEED={text:?}: expected a 64-bit number, decimal or 0x hex")
            }),
            Err(_) => DEFAULT_SEED,
        };
        Settings {
            time_box: seconds,
            seed,
            failures,
        }
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// One corpus file.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

/// Every file in `dir`, by name.
pub fn read_corpus(dir: &Path) -> Vec<Entry> {
    let listing = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading the corpus folder {}: {e}", dir.display()));
    let mut entries: Vec<Entry> = listing
        .map(|entry| entry.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
        .map(|entry| {
            let path = entry.path();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("reading the corpus file {}: {e}", path.display()));
            Entry { path, bytes }
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries
}

/// What a target's run did, when nothing failed.
#[derive(Debug, Clone)]
pub struct Run {
    pub target: String,
    pub replayed: usize,
    pub mutated: u64,
    pub elapsed: Duration,
    pub base_seed: u64,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fuzz {:<18} {:>3} corpus files replayed, {:>8} mutated inputs, {:.2} s \
             (SLUICE_FUZZ_SEED={:#x})",
            self.target,
            self.replayed,
            self.mutated,
            self.elapsed.as_secs_f64(),
            self.base_seed
        )
    }
}

/// How the failing input was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundBy {
    /// A committed corpus file.
    Corpus,
    /// The `index`-th mutated input (from 1) of the mutator seeded with `seed`.
    Mutation { index: u64, seed: u64 },
}

/// A target's first panic.
#[derive(Debug, Clone)]
pub struct Failure {
    pub target: String,
    /// Where and what it panicked with (and a backtrace under `RUST_BACKTRACE`).
    pub panic: String,
    pub input: Vec<u8>,
    /// The input's file: the corpus file, or where a mutated input was saved (or why it
    /// could not be).
    pub saved: Result<PathBuf, String>,
    pub found_by: FoundBy,
    pub base_seed: u64,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match &self.found_by {
            FoundBy::Corpus => "a committed corpus file".to_string(),
            FoundBy::Mutation { index, seed } => format!(
                "mutated input #{index} (SLUICE_FUZZ_SEED={:#x}, target seed {seed:#x})",
                self.base_seed
            ),
        };
        writeln!(f, "fuzz target `{}` failed on {how}:", self.target)?;
        for line in self.panic.lines() {
            writeln!(f, "    {line}")?;
        }
        match &self.saved {
            Ok(path) => {
                writeln!(
                    f,
                    "  input ({} bytes): {}",
                    self.input.len(),
                    path.display()
                )?;
                write!(
                    f,
                    "  reproduce under libFuzzer (from the project root): \
                     RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tools/fuzz {} {}",
                    self.target,
                    path.display()
                )
            }
            Err(why) => write!(
                f,
                "  input ({} bytes) not saved ({why}): {:02x?}",
                self.input.len(),
                self.input
            ),
        }
    }
}

/// Runs `target` on every corpus entry, then on mutated entries until the time box is
/// over; stops at the first panic (or hang, see [`Watchdog`]).
pub fn fuzz(
    name: &str,
    target: fn(&[u8]),
    corpus: &[Entry],
    settings: &Settings,
) -> Result<Run, Box<Failure>> {
    install_panic_hook();
    let started = Instant::now();
    let watchdog = Watchdog::new(name, settings);
    let (mutated, finding) = std::thread::scope(|scope| {
        let (stop, stopped) = mpsc::channel::<()>();
        scope.spawn(|| watchdog.watch(stopped));
        let outcome = campaign(name, target, corpus, settings, &watchdog);
        drop(stop);
        outcome
    });
    match finding {
        None => Ok(Run {
            target: name.to_string(),
            replayed: corpus.len(),
            mutated,
            elapsed: started.elapsed(),
            base_seed: settings.seed,
        }),
        Some(finding) => Err(Box::new(finding.into_failure(name, settings))),
    }
}

/// A panic and the input that caused it.
struct Finding {
    panic: String,
    input: Vec<u8>,
    found_by: FoundBy,
    /// The corpus file, when it was one.
    file: Option<PathBuf>,
}

impl Finding {
    /// The failure, with a mutated input saved to the failures folder.
    fn into_failure(self, target: &str, settings: &Settings) -> Failure {
        let saved = match self.file {
            Some(file) => Ok(file),
            None => save(&settings.failures, target, &self.input),
        };
        Failure {
            target: target.to_string(),
            panic: self.panic,
            input: self.input,
            saved,
            found_by: self.found_by,
            base_seed: settings.seed,
        }
    }
}

/// The corpus, then mutations: how many mutated inputs ran, and the first finding.
fn campaign(
    name: &str,
    target: fn(&[u8]),
    corpus: &[Entry],
    settings: &Settings,
    watchdog: &Watchdog<'_>,
) -> (u64, Option<Finding>) {
    for entry in corpus {
        watchdog.starting(&entry.bytes, FoundBy::Corpus);
        let result = run_one(target, &entry.bytes);
        watchdog.finished();
        if let Err(panic) = result {
            let finding = Finding {
                panic,
                input: entry.bytes.clone(),
                found_by: FoundBy::Corpus,
                file: Some(entry.path.clone()),
            };
            return (0, Some(finding));
        }
    }

    // The mutator needs something to start from; a target without seeds starts from the
    // empty input, as libFuzzer does.
    let mut seeds: Vec<Vec<u8>> = corpus.iter().map(|e| e.bytes.clone()).collect();
    if seeds.is_empty() {
        seeds.push(Vec::new());
    }
    let max_len = seeds
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .max(MIN_MAX_LEN);
    let seed = settings.seed ^ fnv1a(name.as_bytes());
    let mut mutator = Mutator::new(seed, max_len);
    let mut input = Vec::with_capacity(max_len);
    let mut mutated = 0;
    let fuzzing = Instant::now();
    while fuzzing.elapsed() < settings.time_box {
        mutator.next_input(&seeds, &mut input);
        mutated += 1;
        let found_by = FoundBy::Mutation {
            index: mutated,
            seed,
        };
        watchdog.starting(&input, found_by.clone());
        let result = run_one(target, &input);
        watchdog.finished();
        if let Err(panic) = result {
            let finding = Finding {
                panic,
                input,
                found_by,
                file: None,
            };
            return (mutated, Some(finding));
        }
    }
    (mutated, None)
}

/// Saves a failing input as `<dir>/<target>-<hash>`, the hash naming its bytes.
fn save(dir: &Path, target: &str, input: &[u8]) -> Result<PathBuf, String> {
    let path = dir.join(format!("{target}-{:016x}", fnv1a(input)));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// FNV-1a, 64 bits: stable across Rust versions and machines, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

thread_local! {
    /// Whether this thread is inside a target: its panics are findings, reported by the
    /// harness, not test failures for the default hook to print.
    static IN_TARGET: Cell<bool> = const { Cell::new(false) };
    /// The last finding's location and message, from the panic hook.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs one input; a panic comes back as its location and message.
fn run_one(target: fn(&[u8]), input: &[u8]) -> Result<(), String> {
    IN_TARGET.set(true);
    let result = panic::catch_unwind(|| target(input));
    IN_TARGET.set(false);
    result.map_err(|payload| {
        LAST_PANIC
            .take()
            .unwrap_or_else(|| format!("panicked: {}", message(payload.as_ref())))
    })
}

/// A hook that keeps a target's panic (where, what, and a backtrace when `RUST_BACKTRACE`
/// asks) for the harness instead of printing it; any other panic goes to the hook that
/// was there before. One hook for the process: the tests run in parallel threads.
fn install_panic_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !IN_TARGET.get() {
                return previous(info);
            }
            let location = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            let mut text = format!("panicked{location}: {}", message(info.payload()));
            let backtrace = Backtrace::capture();
            if backtrace.status() == BacktraceStatus::Captured {
                text.push('\n');
                text.push_str(&target_frames(&backtrace.to_string()));
            }
            LAST_PANIC.set(Some(text));
        }));
    });
}

/// The frames of a captured backtrace between the panic machinery and the harness: the
/// target's own, as the default hook's short backtrace shows them. All of it when those
/// frames cannot be told apart.
fn target_frames(backtrace: &str) -> String {
    // A frame is a numbered line (`  7: crate::function`) and its `at file:line` lines.
    let mut frames: Vec<Vec<&str>> = Vec::new();
    for line in backtrace.lines() {
        let numbered = line
            .trim_start()
            .split_once(": ")
            .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
        match frames.last_mut() {
            Some(frame) if !numbered => frame.push(line),
            _ => frames.push(vec![line]),
        }
    }
    let names = |frame: &Vec<&str>, what: &str| frame.first().is_some_and(|l| l.contains(what));
    let first = frames
        .iter()
        .rposition(|f| names(f, "core::panicking::") || names(f, "rust_begin_unwind"))
        .map_or(0, |i| i + 1);
    let end = frames
        .iter()
        .position(|f| names(f, "harness::run_one"))
        .unwrap_or(frames.len());
    let kept = frames.get(first..end).filter(|kept| !kept.is_empty());
    kept.unwrap_or(&frames).concat().join("\n")
}

fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(a panic without a message)"
    }
}

/// Catches hangs: a panic can be caught, an endless loop cannot. It watches the running
/// input from another thread and, past [`INPUT_TIMEOUT`], saves it, says so on the real
/// standard error (the test's captured output would be lost) and ends the process.
struct Watchdog<'a> {
    target: &'a str,
    settings: &'a Settings,
    running: Mutex<Running>,
}

/// The input being run, if any.
struct Running {
    since: Option<Instant>,
    /// Kept between inputs, so that copying an input does not allocate.
    input: Vec<u8>,
    found_by: FoundBy,
}

impl<'a> Watchdog<'a> {
    fn new(target: &'a str, settings: &'a Settings) -> Self {
        Watchdog {
            target,
            settings,
            running: Mutex::new(Running {
                since: None,
                input: Vec::new(),
                found_by: FoundBy::Corpus,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn starting(&self, input: &[u8], found_by: FoundBy) {
        let mut running = self.lock();
        running.since = Some(Instant::now());
        running.input.clear();
        running.input.extend_from_slice(input);
        running.found_by = found_by;
    }

    fn finished(&self) {
        self.lock().since = None;
    }

    /// Checks twice a second until `stopped` closes.
    fn watch(&self, stopped: mpsc::Receiver<()>) {
        while let Err(mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(Duration::from_millis(500))
        {
            let running = self.lock();
            if running
                .since
                .is_none_or(|since| since.elapsed() < INPUT_TIMEOUT)
            {
                continue;
            }
            let finding = Finding {
                panic: format!(
                    "hang: one input has run for more than {} s",
                    INPUT_TIMEOUT.as_secs()
                ),
                input: running.input.clone(),
                found_by: running.found_by.clone(),
                file: None,
            };
            let failure = finding.into_failure(self.target, self.settings);
            let _ = writeln!(std::io::stderr().lock(), "\n{failure}");
            std::process::exit(1);
        }
    }
}
