//! `sluice envoy-config --admin-url ...` output is accepted by a real Envoy
//! (`envoy --mode validate`), which also loads the real filter module for both the HTTP
//! filter and the control service.
//!
//! Needs an Envoy binary and the built filter (`cargo xtask test` builds and provisions
//! both before this runs). Without them the test passes with a notice, so that plain
//! `cargo test` works on a machine without Envoy; the Envoy end-to-end tests in `tests/`
//! cover propagation itself.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn find_envoy() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLUICE_ENVOY") {
        return Some(PathBuf::from(path));
    }
    let lib = workspace_root().join(".venv").join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|p| p.is_file())
}

fn find_filter() -> Option<PathBuf> {
    let path = std::env::var_os("SLUICE_FILTER_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/dist/sluice_filter.wasm"));
    path.is_file().then_some(path)
}

#[test]
fn envoy_accepts_the_config_with_the_control_service() {
    let (Some(envoy), Some(filter)) = (find_envoy(), find_filter()) else {
        eprintln!(
            "note: no Envoy or no built filter (target/dist/sluice_filter.wasm): skipping \
             `envoy --mode validate`; `cargo xtask test` provides both"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("envoy.yaml");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "- {name: static, key: global, limits: [{requests: 5, period: second}]}\n",
    )
    .unwrap();
    // One admin API by address or by name, and replicas (health-checked, with outlier
    // detection) by address and by name; the control service as a singleton (default)
    // or run by an elected worker (no bootstrap extension).
    for (admin_url, control) in [
        ("http://127.0.0.1:8080", "singleton"),
        ("http://localhost:8080", "singleton"),
        ("http://127.0.0.1:8080,http://127.0.0.2:8080", "singleton"),
        ("http://localhost:8080,http://127.0.0.1:8081", "singleton"),
        ("http://127.0.0.1:8080", "worker"),
    ] {
        let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "envoy-config",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:8081",
            ])
            .arg("--filter")
            .arg(&filter)
            .arg("--rules")
            .arg(&rules)
            .args([
                "--admin-url",
                admin_url,
                "--proxy-token",
                "slc_example",
                "--proxy-id",
                "envoy-1",
                "--control",
                control,
            ])
            .arg("--output")
            .arg(&config)
            .status()
            .unwrap();
        assert!(status.success());
        let output = Command::new(&envoy)
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(&config)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("OK"),
            "{admin_url} ({control}): envoy refused the config:\n{stdout}\n{stderr}\n{}",
            std::fs::read_to_string(&config).unwrap()
        );
    }
}
