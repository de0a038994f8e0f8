//! The suite's fuzz step (`cargo xtask test` runs `cargo test -p sluice-fuzz-targets` with
//! `SLUICE_FUZZ_SECONDS=2`): one test per target, which replays every committed corpus
//! file in `tools/fuzz/corpus/<target>/`, then feeds the target seeded mutations of them
//! for `SLUICE_FUZZ_SECONDS` (default 2; libtest runs the targets in parallel). A panic
//! fails the test with the target, the panic, the saved input and the command that
//! replays it under libFuzzer; longer, coverage-guided runs under AddressSanitizer are
//! `cargo xtask fuzz`.
//!
//! Each test prints one line (corpus files replayed, mutated inputs, time, seed) straight
//! to standard output, past libtest's capture, so a passing run shows what it did.

mod harness;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::{DEFAULT_SEED, Entry, FoundBy, Settings};
use sluice_fuzz_targets::TARGETS;

/// `tools/fuzz`: the libFuzzer shells and the committed corpus.
fn fuzz_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    dir.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// `target/fuzz-failures/` of the workspace's target directory (`CARGO_TARGET_TMPDIR` is
/// its `tmp/`).
fn failures_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("fuzz-failures")
}

/// Fuzzes one target of [`TARGETS`] and prints what it did, or fails with its finding.
fn check(name: &str) {
    let Some(&(_, target)) = TARGETS.iter().find(|(n, _)| *n == name) else {
        panic!("`{name}` is not in sluice_fuzz_targets::TARGETS");
    };
    let corpus = harness::read_corpus(&fuzz_dir().join("corpus").join(name));
    assert!(
        !corpus.is_empty(),
        "tools/fuzz/corpus/{name}/ has no seeds: write some with tools/fuzz/examples/seed_corpus.rs"
    );
    let settings = Settings::from_env(failures_dir());
    match harness::fuzz(name, target, &corpus, &settings) {
        Ok(run) => {
            let _ = writeln!(std::io::stdout().lock(), "{run}");
        }
        Err(failure) => panic!("{failure}"),
    }
}

/// One test per target, so libtest runs them in parallel and names the one that fails.
macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
        /// The targets with a test above.
        const TESTED: &[&str] = &[$(stringify!($name)),*];
    };
}

targets!(
    slot_value,
    lease_entry,
    control_lease,
    fleet_view,
    bucket_state,
    sync_request,
    sync_response,
    ruleset_document,
    rule_batch,
    report_json,
    filter_config,
    control_config,
    rules_file,
    decide,
    usage_reader,
    rls_decide,
    metadata_struct,
);

/// The names in a folder, without their extension `ext` (any extension when empty).
fn names_in(dir: &Path, ext: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| ext.is_empty() || path.extension().is_some_and(|e| e == ext))
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_string()))
        .collect();
    names.sort();
    names
}

#[test]
fn every_target_has_a_test_a_libfuzzer_shell_a_binary_and_a_corpus() {
    let mut listed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    let mut tested: Vec<String> = TESTED.iter().map(|n| n.to_string()).collect();
    tested.sort();
    assert_eq!(tested, listed, "a test per target in TARGETS");
    let fuzz = fuzz_dir();
    assert_eq!(
        names_in(&fuzz.join("fuzz_targets"), "rs"),
        listed,
        "a libFuzzer shell per target in tools/fuzz/fuzz_targets/"
    );
    assert_eq!(
        names_in(&fuzz.join("corpus"), ""),
        listed,
        "a corpus folder per target in tools/fuzz/corpus/"
    );
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("tools/fuzz/Cargo.toml");
    for name in &listed {
        assert!(
            manifest.contains(&format!(
                "name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\""
            )),
            "tools/fuzz/Cargo.toml has no [[bin]] for {name}"
        );
    }
}

/// The harness itself: a toy target that panics on a byte one bit flip away from its seed
/// (`sluice` → `sluyce`), found within the time box and saved.
mod harness_finds_what_it_should {
    use super::*;

    fn toy(bytes: &[u8]) {
        if bytes.get(3) == Some(&b'y') {
            panic!("the toy target's fourth byte is `y`");
        }
    }

    fn seed() -> Vec<Entry> {
        vec![Entry {
            path: PathBuf::from("toy/sluice"),
            bytes: b"sluice".to_vec(),
        }]
    }

    /// A folder of this test's own, so its findings never mix with real ones.
    fn settings(time_box: Duration) -> Settings {
        Settings {
            time_box,
            seed: DEFAULT_SEED,
            failures: Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-harness-self-test"),
        }
    }

    #[test]
    fn a_panic_one_mutation_from_a_seed_is_found_saved_and_reported() {
        let settings = settings(Duration::from_secs(20));
        let failure = harness::fuzz("toy", toy, &seed(), &settings)
            .expect_err("the toy target's panic is one bit flip from its seed");
        // Printed for whoever reads the test's output: what a failure looks like.
        println!("{failure}");

        let FoundBy::Mutation { index, .. } = failure.found_by else {
            panic!("the seed itself does not panic: {failure}");
        };
        // Deterministic with the fixed seed; the bound only says "quickly".
        assert!(index <= 10_000, "found only after {index} inputs");
        assert_eq!(failure.input.get(3), Some(&b'y'));
        assert!(
            failure
                .panic
                .contains("the toy target's fourth byte is `y`")
        );
        assert!(
            failure.panic.contains("tests/corpus.rs"),
            "{}",
            failure.panic
        );
        let saved = failure.saved.clone().expect("the input is saved");
        assert!(saved.starts_with(&settings.failures));
        assert!(
            saved
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("toy-"))
        );
        assert_eq!(
            std::fs::read(&saved).expect("the saved input"),
            failure.input
        );
        let shown = failure.to_string();
        assert!(shown.contains(&format!(
            "RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tools/fuzz toy {}",
            saved.display()
        )));

        let again = harness::fuzz("toy", toy, &seed(), &settings).expect_err("found again");
        assert_eq!(
            (again.found_by, again.input),
            (failure.found_by, failure.input),
            "one seed, one sequence of inputs"
        );
    }

    #[test]
    fn a_panicking_corpus_file_fails_before_any_mutation() {
        let corpus = vec![Entry {
            path: PathBuf::from("toy/sluyce"),
            bytes: b"sluyce".to_vec(),
        }];
        let failure = harness::fuzz("toy", toy, &corpus, &settings(Duration::from_secs(5)))
            .expect_err("the corpus file panics");
        assert_eq!(failure.found_by, FoundBy::Corpus);
        assert_eq!(failure.saved, Ok(PathBuf::from("toy/sluyce")));
    }

    #[test]
    fn a_target_that_never_panics_runs_for_its_time_box() {
        fn quiet(_: &[u8]) {}
        let time_box = Duration::from_millis(200);
        let run =
            harness::fuzz("quiet", quiet, &seed(), &settings(time_box)).expect("nothing to find");
        assert_eq!(run.replayed, 1);
        assert!(run.mutated > 100, "{run}");
        assert!(run.elapsed >= time_box, "{run}");
    }
}
