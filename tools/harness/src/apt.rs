//! Installing Debian packages, for the machines where they are the only way to get a tool.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};

use crate::cmd::{self, note, step};

/// `apt-get update` is slow and only needed once per run, however many installs follow.
static UPDATED: AtomicBool = AtomicBool::new(false);

/// Installs `packages` with apt-get (as root, or through sudo).
pub fn install(packages: &[&str]) -> Result<()> {
    step(format!("installing Debian packages {}", packages.join(" ")));
    if cmd::which("apt-get").is_none() {
        bail!(
            "apt-get not found: install {} by hand (or another way to build for wasm32)",
            packages.join(" ")
        );
    }
    if !UPDATED.swap(true, Ordering::SeqCst) {
        cmd::run(apt_get().arg("update")).context("apt-get update")?;
    } else {
        note("apt-get update already ran");
    }
    cmd::run(apt_get().args(["install", "-y"]).args(packages))
        .with_context(|| format!("installing {}", packages.join(" ")))
}

fn apt_get() -> Command {
    let is_root = cmd::probe(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0");
    let mut command = if is_root {
        Command::new("apt-get")
    } else {
        // Non-interactive so that CI without a terminal fails fast instead of waiting for a
        // password.
        let mut sudo = Command::new("sudo");
        sudo.args(["-n", "apt-get"]);
        sudo
    };
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}
