//! The OCI images in `target/dist/oci/`, written by `cargo xtask build` after the
//! deliverables they package (the layouts themselves are `sluice-oci`'s):
//!
//! * `sluice-filter/`: the filter in the compat variant (Istio, Envoy Gateway),
//! * `sluice-filter-artifact/`: the filter in the wasm-artifact variant,
//! * `sluice/`: the `sluice` server, statically linked against musl, on no base image.
//!
//! The static build uses the same two routes as the wasm32 one (`toolchain.rs`): rustup's
//! `x86_64-unknown-linux-musl` target where rustup can add it, else Debian's `rustc-web`
//! building std itself. Either way Debian's `musl-tools` gives `musl-gcc` for the C parts
//! (ring, SQLite). `SLUICE_STATIC_ROUTE=rustup|debian` forces a route.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_harness::apt;
use sluice_harness::cmd::{self, Outcome, note, step};
use sluice_oci::{Provenance, WrittenLayout};

use crate::dist::{self, Dist, Profile};
use crate::toolchain;

pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
const ROUTE_ENV: &str = "SLUICE_STATIC_ROUTE";
/// The C compiler `musl-tools` installs: compiles the C in ring and SQLite against musl.
const MUSL_GCC: &str = "musl-gcc";
/// How long the built binary may take to print its version.
const VERSION_LIMIT: Duration = Duration::from_secs(30);

/// The written image layouts.
#[derive(Debug, Clone)]
pub struct Images {
    pub filter_compat: WrittenLayout,
    pub filter_artifact: WrittenLayout,
    pub server: WrittenLayout,
}

/// `target/dist/oci/`.
pub fn oci_dir() -> PathBuf {
    dist::dist_dir().join("oci")
}

/// Builds the static `sluice` binary (in `profile`) and writes the three image layouts.
/// `dist` must be built first: the filter image packages `dist.filter_wasm`, and a release
/// binary embeds the dashboard that `dist::build` put in `dashboard/dist/`.
pub fn build(dist: &Dist, profile: Profile) -> Result<Images> {
    let binary = static_server_binary(profile)?;
    let root = cmd::project_root();
    let provenance = Provenance::for_checkout(&root)?;
    step(format!(
        "writing OCI image layouts into {} (version {}, revision {}, time {})",
        oci_dir().display(),
        provenance.version,
        provenance.revision.as_deref().unwrap_or("unknown"),
        provenance
            .created
            .map_or_else(|| "none".to_owned(), |secs| secs.to_string()),
    ));
    let wasm = std::fs::read(&dist.filter_wasm)
        .with_context(|| format!("reading {}", dist.filter_wasm.display()))?;
    let binary_bytes =
        std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let tag = provenance.version.clone();
    let images = Images {
        filter_compat: sluice_oci::filter_compat(&wasm, &provenance)?
            .write_layout(&oci_dir().join("sluice-filter"), &tag)?,
        filter_artifact: sluice_oci::filter_artifact(&wasm, &provenance)?
            .write_layout(&oci_dir().join("sluice-filter-artifact"), &tag)?,
        server: sluice_oci::server(&binary_bytes, &provenance)?
            .write_layout(&oci_dir().join("sluice"), &tag)?,
    };
    Ok(images)
}

impl Images {
    /// Each image's digest and the command that pushes it.
    pub fn print(&self) {
        step(format!(
            "OCI images (reproducible: the same sources, commit and {} give the same digests)",
            sluice_oci::images::SOURCE_DATE_EPOCH_ENV
        ));
        let root = cmd::project_root();
        for (layout, what) in [
            (
                &self.filter_compat,
                "the filter, compat variant (Istio WasmPlugin, Envoy Gateway EnvoyExtensionPolicy)",
            ),
            (
                &self.filter_artifact,
                "the filter, wasm-artifact variant (application/vnd.module.wasm.*)",
            ),
            (
                &self.server,
                "the admin API, `sluice serve` (static, no base image)",
            ),
        ] {
            let dir = layout.dir.strip_prefix(&root).unwrap_or(&layout.dir);
            let name = dir
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
            note(what);
            note(format!("  {}  {}", dir.display(), layout.digest()));
            note(format!(
                "  push: skopeo copy oci:{}:{} docker://REGISTRY/{name}:{}",
                dir.display(),
                layout.tag,
                layout.tag
            ));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StaticRoute {
    Rustup,
    Debian,
}

/// The statically linked `sluice` binary, built for musl in `profile`.
fn static_server_binary(profile: Profile) -> Result<PathBuf> {
    step(format!(
        "building the static `sluice` for {MUSL_TARGET} ({})",
        profile.name()
    ));
    ensure_musl_gcc()?;
    let route = select_route()?;
    note(format!(
        "static route: {}",
        match route {
            StaticRoute::Rustup => "rustup",
            StaticRoute::Debian => "debian",
        }
    ));
    let mut build = match route {
        StaticRoute::Rustup => cmd::cargo(),
        StaticRoute::Debian => toolchain::debian_cargo(),
    };
    build.arg("build").args(profile.cargo_args()).args([
        "--package",
        dist::SLUICE_PACKAGE,
        "--bin",
        dist::SLUICE_BINARY,
        "--target",
        MUSL_TARGET,
    ]);
    // cc-rs reads `CC_<target>`: ring's and SQLite's C compiled against musl, not glibc.
    build.env("CC_x86_64_unknown_linux_musl", MUSL_GCC);
    if profile == Profile::Test {
        // Only this build compiles for musl, so its settings share nothing to lose: without
        // debug information the image the suite pushes around is a tenth of the size, and
        // unoptimised dependencies compile in a fraction of the time (the image's test
        // starts the binary and asks it a few questions; speed is the release image's).
        build
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .env("CARGO_PROFILE_DEV_STRIP", "debuginfo")
            .args(["--config", "profile.dev.package.\"*\".opt-level=0"]);
    }
    if route == StaticRoute::Debian {
        // Debian ships no prebuilt std for musl: build it, with Debian's compiler in its
        // own target folder; musl-gcc links, bringing musl's start files and libc.a.
        build
            .arg("-Zbuild-std=std,panic_abort")
            .arg("--target-dir")
            .arg(Path::new("target").join("static-debian"))
            .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER", MUSL_GCC);
    }
    note("a cold build takes minutes; cargo's own progress follows");
    let started = Instant::now();
    let binary = cmd::cargo_build_artefact(&mut build, dist::SLUICE_BINARY)
        .with_context(|| format!("building {} for {MUSL_TARGET}", dist::SLUICE_PACKAGE))?;
    note(format!(
        "built {} in {:.1} s",
        binary.display(),
        started.elapsed().as_secs_f64()
    ));
    check_static(&binary)?;
    Ok(binary)
}

/// `musl-gcc` on PATH, installing Debian's `musl-tools` if needed.
fn ensure_musl_gcc() -> Result<()> {
    if let Some(found) = cmd::which(MUSL_GCC) {
        note(format!("found {}", found.display()));
        return Ok(());
    }
    note(format!("{MUSL_GCC} is not on PATH"));
    apt::install(&["musl-tools"]).context("installing musl-tools")?;
    if cmd::which(MUSL_GCC).is_none() {
        bail!("musl-tools was installed but {MUSL_GCC} is not on PATH");
    }
    Ok(())
}

fn select_route() -> Result<StaticRoute> {
    let forced = std::env::var(ROUTE_ENV);
    match forced.as_deref().map(str::trim) {
        Ok("rustup") => {
            note(format!("{ROUTE_ENV}=rustup forces the rustup route"));
            if !toolchain::rustup_target_available(MUSL_TARGET)? {
                bail!("{ROUTE_ENV}=rustup, but rustup cannot provide {MUSL_TARGET}");
            }
            Ok(StaticRoute::Rustup)
        }
        Ok("debian") => {
            note(format!("{ROUTE_ENV}=debian forces the Debian route"));
            toolchain::ensure_debian_toolchain()?;
            Ok(StaticRoute::Debian)
        }
        Ok("") | Err(std::env::VarError::NotPresent) => {
            if toolchain::rustup_target_available(MUSL_TARGET)? {
                Ok(StaticRoute::Rustup)
            } else {
                note("falling back to Debian's rustc-web with -Zbuild-std");
                toolchain::ensure_debian_toolchain()?;
                Ok(StaticRoute::Debian)
            }
        }
        Ok(other) => bail!("{ROUTE_ENV}={other:?}: expected `rustup` or `debian`"),
        Err(err) => Err(err.clone()).with_context(|| format!("reading {ROUTE_ENV}")),
    }
}

/// Fails unless `binary` is an ELF file with no program interpreter (so the kernel runs
/// it without a dynamic loader, as on an image with no base) that prints its version.
fn check_static(binary: &Path) -> Result<()> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    match elf_interpreter(&bytes) {
        Some(Some(interpreter)) => bail!(
            "{} is dynamically linked (interpreter {interpreter}): it would not start on an \
             image with no base",
            binary.display()
        ),
        Some(None) => note("statically linked: no program interpreter"),
        None => bail!(
            "{} is not a 64-bit little-endian ELF file",
            binary.display()
        ),
    }
    let mut version = Command::new(binary);
    version.arg("--version").env_clear();
    match cmd::run_with_timeout(&mut version, VERSION_LIMIT)? {
        Outcome::Succeeded => Ok(()),
        Outcome::Failed => bail!("{} --version failed", binary.display()),
        Outcome::TimedOut => bail!(
            "{} --version printed nothing within {} s",
            binary.display(),
            VERSION_LIMIT.as_secs()
        ),
    }
}

/// The program interpreter (`PT_INTERP`) a 64-bit little-endian ELF file asks for:
/// `Some(None)` when it asks for none (static), `None` when the bytes are not such a file.
fn elf_interpreter(elf: &[u8]) -> Option<Option<String>> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| {
        let value = u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?);
        usize::try_from(value).ok()
    };
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let table = u64_at(0x20)?;
    let entry_size = usize::from(u16_at(0x36)?);
    let entries = usize::from(u16_at(0x38)?);
    for n in 0..entries {
        let header = table.checked_add(n.checked_mul(entry_size)?)?;
        if u32_at(header)? == PT_INTERP {
            let offset = u64_at(header + 0x08)?;
            let size = u64_at(header + 0x20)?;
            let path = elf.get(offset..offset.checked_add(size)?)?;
            return Some(Some(
                String::from_utf8_lossy(path)
                    .trim_end_matches('\0')
                    .to_owned(),
            ));
        }
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_program_names_its_interpreter() {
        // This test binary is linked against glibc, so it asks for ld-linux.
        let exe = std::fs::read("/proc/self/exe").expect("own executable");
        let interpreter = elf_interpreter(&exe).expect("an ELF file");
        assert!(
            interpreter
                .as_deref()
                .is_some_and(|path| path.contains("ld-linux")),
            "{interpreter:?}"
        );
    }

    #[test]
    fn other_bytes_are_not_elf() {
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(b"\x7fELF\x02\x01"), None, "truncated");
    }
}
