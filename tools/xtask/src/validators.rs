//! The schema validators the suite checks `sluice render`'s output with
//! (`tests/tests/render.rs`), from PyPI in the project's `.venv/`, as schemathesis is:
//! `kubernetes-validate`, which bundles the Kubernetes API's schemas and works offline,
//! for the core kinds; `check-jsonschema` for the custom resources (Istio, Envoy Gateway,
//! Prometheus Operator), against the schemas in `deploy/schemas/`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{CHECK_JSONSCHEMA_ENV, KUBERNETES_VALIDATE_ENV};

use crate::envoy;

/// Pinned, so that new schemas or checks arrive as a deliberate upgrade.
const TOOLS: [Tool; 2] = [
    Tool {
        command: "kubernetes-validate",
        version: "1.37.0",
        env: KUBERNETES_VALIDATE_ENV,
    },
    Tool {
        command: "check-jsonschema",
        version: "0.39.0",
        env: CHECK_JSONSCHEMA_ENV,
    },
];

struct Tool {
    command: &'static str,
    version: &'static str,
    env: &'static str,
}

/// The validators' commands, installed at their pinned versions if they are not, as
/// `(environment variable, path)` for the tests.
pub fn ensure_installed() -> Result<Vec<(&'static str, PathBuf)>> {
    step("provisioning the schema validators");
    let python = envoy::project_python()?;
    let mut found = Vec::new();
    for tool in TOOLS {
        let command = python.with_file_name(tool.command);
        let installed = cmd::probe(Command::new(&command).arg("--version"));
        if installed
            .as_deref()
            .is_some_and(|v| v.contains(tool.version))
        {
            note(format!(
                "{}=={} already installed in .venv",
                tool.command, tool.version
            ));
        } else {
            envoy::pip_install(&python, &format!("{}=={}", tool.command, tool.version))?;
            if !cmd::is_executable(&command) {
                bail!(
                    "{}=={} installed, but {} is missing",
                    tool.command,
                    tool.version,
                    command.display()
                );
            }
        }
        found.push((tool.env, command));
    }
    Ok(found)
}
