//! The images Sluice ships, as [`Image`]s ready to be written as layouts.
//!
//! Two formats of the filter, because the control planes that pull wasm filters from
//! registries read these two (Istio's `WasmPlugin` and Envoy Gateway's
//! `EnvoyExtensionPolicy` share one puller, which implements Solo's "Wasm Image
//! Specification"):
//!
//! * **compat** ([`filter_compat`]): an ordinary image whose last (here: only) layer is an
//!   `application/vnd.oci.image.layer.v1.tar+gzip` holding `plugin.wasm`, with the manifest
//!   annotation `module.wasm.image/variant: compat`. The pullers gunzip that layer, so it
//!   must be gzipped: a plain tar is refused.
//! * **wasm artifact** ([`filter_artifact`]): configuration of media type
//!   `application/vnd.module.wasm.config.v1+json` and the module itself, unwrapped, as a
//!   layer of media type `application/vnd.module.wasm.content.layer.v1+wasm`. The pullers
//!   require exactly two layers and pick the content layer by its media type; the image
//!   tools that wrote this variant listed the runtime configuration as the other layer, so
//!   it is both the manifest's configuration and its first layer here.
//!
//! And the admin API ([`server`]): one layer with the statically linked `sluice` binary, the
//! `/etc/passwd` and `/etc/group` entries of the non-root account it runs as, a data folder
//! that account owns (the SQLite file goes there) and a `/tmp`, on no base image.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use oci_spec::image::{
    Arch, ConfigBuilder, Digest, ImageConfiguration, ImageConfigurationBuilder, MediaType, Os,
    RootFsBuilder,
};
use serde_json::json;
use sluice_envoy_config::{CONTROL_ROOT_ID, PLUGIN_NAME};

use crate::layer::{Entry, LayerContents, gzip};
use crate::layout::{Blob, Image, sha256};

/// The file name the compat variant's layer must hold the module under.
pub const PLUGIN_FILE: &str = "plugin.wasm";
/// The file name the wasm-artifact variant's configuration layer carries as its title.
pub const RUNTIME_CONFIG_FILE: &str = "runtime-config.json";
/// The manifest annotation that marks the compat variant.
pub const VARIANT_ANNOTATION: &str = "module.wasm.image/variant";
/// The wasm-artifact variant's configuration media type.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.module.wasm.config.v1+json";
/// The wasm-artifact variant's content layer media type: the module's bytes as they are.
pub const WASM_CONTENT_MEDIA_TYPE: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// The proxy-wasm ABI the filter exports (`proxy_abi_version_0_2_1`, from the Rust SDK 0.2).
pub const PROXY_WASM_ABI: &str = "proxy_abi_version_0_2_1";

/// Where the server image puts the binary.
pub const SERVER_BINARY_PATH: &str = "/usr/local/bin/sluice";
/// The server image's data folder, owned by [`SERVER_UID`]; the SQLite file lives here.
pub const SERVER_DATA_DIR: &str = "/var/lib/sluice";
/// The port `sluice serve` listens on in the image (on every address).
pub const SERVER_PORT: u16 = 8080;
/// The server's account: the number distroless images use for `nonroot`, so volume
/// permissions prepared for those fit this one.
pub const SERVER_UID: u64 = 65532;
const SERVER_ACCOUNT: &str = "sluice";

const OCI_ANNOTATION: &str = "org.opencontainers.image";

/// The reproducible-builds convention for the time a build claims.
pub const SOURCE_DATE_EPOCH_ENV: &str = "SOURCE_DATE_EPOCH";

/// One line of `git`'s output in `root`, or `None` where git or the repository is missing.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let line = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !line.is_empty()).then_some(line)
}

/// What the images say about where they come from. Every field is an input of the image's
/// digest, so nothing here may come from the clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// The version, also the tag the layouts name (`0.1.0`).
    pub version: String,
    /// The source repository's URL.
    pub source: String,
    /// The commit the images were built from, when known.
    pub revision: Option<String>,
    /// Seconds since the epoch: `SOURCE_DATE_EPOCH`, else the commit's time. Used as every
    /// file's modification time and as the `created` time; without it both are the epoch
    /// and `created` is left out.
    pub created: Option<u64>,
    /// The licence's SPDX expression.
    pub licenses: String,
}

impl Provenance {
    /// For the checkout at `root`: the workspace's version, repository and licence, the
    /// commit from git, and the time from `SOURCE_DATE_EPOCH` or else the commit's time.
    /// Without git (a source archive) there is no revision, and no time unless
    /// `SOURCE_DATE_EPOCH` gives one.
    pub fn for_checkout(root: &Path) -> Result<Provenance> {
        let created = match std::env::var(SOURCE_DATE_EPOCH_ENV) {
            Ok(value) if !value.trim().is_empty() => {
                Some(value.trim().parse().with_context(|| {
                    format!("{SOURCE_DATE_EPOCH_ENV}={value:?} is not a number of seconds")
                })?)
            }
            _ => git(root, &["log", "-1", "--format=%ct"]).and_then(|secs| secs.parse().ok()),
        };
        Ok(Provenance {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            source: env!("CARGO_PKG_REPOSITORY").to_owned(),
            revision: git(root, &["rev-parse", "HEAD"]),
            created,
            licenses: env!("CARGO_PKG_LICENSE").to_owned(),
        })
    }

    fn mtime(&self) -> u64 {
        self.created.unwrap_or(0)
    }

    fn created_rfc3339(&self) -> Option<String> {
        self.created.map(|secs| {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
        })
    }

    /// The `org.opencontainers.image.*` annotations (and labels) for an image titled `title`.
    fn annotations(&self, title: &str, description: &str) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            if !value.is_empty() {
                annotations.insert(format!("{OCI_ANNOTATION}.{key}"), value);
            }
        };
        put("title", title.to_owned());
        put("description", description.to_owned());
        put("version", self.version.clone());
        put("source", self.source.clone());
        put("url", self.source.clone());
        put("licenses", self.licenses.clone());
        if let Some(revision) = &self.revision {
            put("revision", revision.clone());
        }
        if let Some(created) = self.created_rfc3339() {
            put("created", created);
        }
        annotations
    }
}

/// An image's annotations as its configuration's labels (the same key/value pairs).
fn as_labels(annotations: &BTreeMap<String, String>) -> HashMap<String, String> {
    annotations.clone().into_iter().collect()
}

/// Finishes an image configuration of one layer whose uncompressed digest is `diff_id`,
/// created when the provenance says; `what` names the image in errors.
fn with_layer(
    config: ImageConfigurationBuilder,
    diff_id: &Digest,
    provenance: &Provenance,
    what: &str,
) -> Result<ImageConfiguration> {
    let rootfs = RootFsBuilder::default()
        .typ("layers")
        .diff_ids(vec![diff_id.to_string()])
        .build()
        .with_context(|| format!("building the {what} image's rootfs"))?;
    let mut config = config.rootfs(rootfs);
    if let Some(created) = provenance.created_rfc3339() {
        config = config.created(created);
    }
    config
        .build()
        .with_context(|| format!("building the {what} image's configuration"))
}

/// `contents` as one gzipped tar layer, with the digest of the uncompressed tar (the
/// image configuration's `diff_id`).
fn gzip_layer(contents: &LayerContents) -> Result<(Blob, Digest)> {
    let tar = contents.tar()?;
    Ok((
        Blob::new(MediaType::ImageLayerGzip, gzip(&tar)?),
        sha256(&tar),
    ))
}

/// The filter in the compat variant: one gzipped tar layer holding `plugin.wasm`.
pub fn filter_compat(wasm: &[u8], provenance: &Provenance) -> Result<Image> {
    let mut contents = LayerContents::new(provenance.mtime());
    contents.insert(PLUGIN_FILE, Entry::file(wasm, 0o644))?;
    let (layer, diff_id) = gzip_layer(&contents)?;

    let labels = provenance.annotations(
        "sluice-filter",
        "Sluice's rate-limiting proxy-wasm filter for Envoy (compat variant)",
    );
    let config = ImageConfigurationBuilder::default()
        // Docker's and crun's name for WebAssembly images (`--platform wasi/wasm`).
        .architecture(Arch::Wasm)
        .os(Os::Other("wasi".to_owned()))
        .config(
            ConfigBuilder::default()
                .labels(as_labels(&labels))
                .build()
                .context("building the filter image's configuration")?,
        );
    let config = with_layer(config, &diff_id, provenance, "filter")?;

    let mut annotations = labels;
    annotations.insert(VARIANT_ANNOTATION.to_owned(), "compat".to_owned());
    Ok(Image {
        config: Blob::json(MediaType::ImageConfig, &config)?,
        layers: vec![layer],
        annotations,
    })
}

/// The filter in the wasm-artifact variant: the runtime configuration and the raw module.
pub fn filter_artifact(wasm: &[u8], provenance: &Provenance) -> Result<Image> {
    let runtime_config = Blob::json(
        MediaType::Other(WASM_CONFIG_MEDIA_TYPE.to_owned()),
        &json!({
            "type": "envoy_proxy",
            "abiVersions": [PROXY_WASM_ABI],
            "config": { "root_ids": [PLUGIN_NAME, CONTROL_ROOT_ID] },
        }),
    )?;
    let title = |file: &str| BTreeMap::from([(format!("{OCI_ANNOTATION}.title"), file.to_owned())]);
    let config_layer = runtime_config
        .clone()
        .annotated(&title(RUNTIME_CONFIG_FILE));
    let content = Blob::new(
        MediaType::Other(WASM_CONTENT_MEDIA_TYPE.to_owned()),
        wasm.to_vec(),
    )
    .annotated(&title(PLUGIN_FILE));
    Ok(Image {
        config: runtime_config,
        layers: vec![config_layer, content],
        annotations: provenance.annotations(
            "sluice-filter",
            "Sluice's rate-limiting proxy-wasm filter for Envoy (wasm artifact variant)",
        ),
    })
}

/// The `sluice` admin API server on no base image. `binary` must be statically linked:
/// nothing else in the image can load a shared library.
pub fn server(binary: &[u8], provenance: &Provenance) -> Result<Image> {
    let uid = SERVER_UID;
    let mut contents = LayerContents::new(provenance.mtime());
    let relative = |path: &str| path.trim_start_matches('/').to_owned();
    for dir in ["etc", "usr", "usr/local", "usr/local/bin", "var", "var/lib"] {
        contents.insert(dir, Entry::dir(0o755))?;
    }
    contents.insert(
        "etc/passwd",
        Entry::file(
            format!(
                "root:x:0:0:root:/root:/sbin/nologin\n\
                 {SERVER_ACCOUNT}:x:{uid}:{uid}:{SERVER_ACCOUNT}:{SERVER_DATA_DIR}:/sbin/nologin\n"
            ),
            0o644,
        ),
    )?;
    contents.insert(
        "etc/group",
        Entry::file(format!("root:x:0:\n{SERVER_ACCOUNT}:x:{uid}:\n"), 0o644),
    )?;
    contents.insert(&relative(SERVER_BINARY_PATH), Entry::file(binary, 0o755))?;
    contents.insert(
        &relative(SERVER_DATA_DIR),
        Entry::dir(0o750).owned_by(uid, uid),
    )?;
    // SQLite writes temporary files for large sorts and indexes here.
    contents.insert("tmp", Entry::dir(0o1777))?;
    let (layer, diff_id) = gzip_layer(&contents)?;

    let labels = provenance.annotations(
        "sluice",
        "Sluice's admin API and dashboard (`sluice serve`): rules, tokens and metrics for Sluice's Envoy filter",
    );
    let config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .user(format!("{uid}:{uid}"))
                .exposed_ports(vec![format!("{SERVER_PORT}/tcp")])
                // An environment variable, not a flag, so `-e SLUICE_DATABASE=postgres://...`
                // replaces it (a flag would win over the variable).
                .env(vec![format!(
                    "SLUICE_DATABASE=sqlite://{SERVER_DATA_DIR}/sluice.db"
                )])
                .entrypoint(vec![SERVER_BINARY_PATH.to_owned()])
                .cmd(vec![
                    "serve".to_owned(),
                    "--listen".to_owned(),
                    format!("0.0.0.0:{SERVER_PORT}"),
                ])
                .volumes(vec![SERVER_DATA_DIR.to_owned()])
                .working_dir(SERVER_DATA_DIR)
                .stop_signal("SIGTERM")
                .labels(as_labels(&labels))
                .build()
                .context("building the server image's configuration")?,
        );
    let config = with_layer(config, &diff_id, provenance, "server")?;
    Ok(Image {
        config: Blob::json(MediaType::ImageConfig, &config)?,
        layers: vec![layer],
        annotations: labels,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use serde_json::Value;

    use super::*;

    fn provenance() -> Provenance {
        Provenance {
            version: "0.1.0".to_owned(),
            source: "https://example.invalid/sluice".to_owned(),
            revision: Some("0123456789abcdef".to_owned()),
            created: Some(1_764_000_000),
            licenses: "Apache-2.0".to_owned(),
        }
    }

    const WASM: &[u8] = b"\0asm\x01\0\0\0 a module";

    fn json(blob: &Blob) -> Value {
        serde_json::from_slice(blob.bytes()).expect("JSON")
    }

    /// The files of a gzipped tar layer: path, mode, uid, content.
    fn files(layer: &Blob) -> Vec<(String, u32, u64, Vec<u8>)> {
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(layer.bytes())
            .read_to_end(&mut tar)
            .expect("gunzip");
        let mut archive = tar::Archive::new(tar.as_slice());
        archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let mut entry = entry.expect("entry");
                let mut content = Vec::new();
                entry.read_to_end(&mut content).expect("content");
                let header = entry.header();
                (
                    entry.path().expect("path").display().to_string(),
                    header.mode().expect("mode"),
                    header.uid().expect("uid"),
                    content,
                )
            })
            .collect()
    }

    #[test]
    fn a_checkout_gives_the_workspace_version_and_its_commit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let found = Provenance::for_checkout(&root).expect("provenance");
        assert_eq!(found.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(found.licenses, "Apache-2.0");
        if let Some(revision) = &found.revision {
            assert_eq!(revision.len(), 40, "a full commit hash: {revision}");
        }
    }

    #[test]
    fn the_compat_variant_is_one_gzipped_layer_holding_plugin_wasm() {
        let image = filter_compat(WASM, &provenance()).expect("image");
        let manifest = json(&image.manifest().expect("manifest"));
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        assert_eq!(
            manifest["config"]["mediaType"],
            "application/vnd.oci.image.config.v1+json"
        );
        assert_eq!(manifest["annotations"][VARIANT_ANNOTATION], "compat");
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1);
        assert_eq!(
            layers[0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        assert_eq!(
            files(&image.layers[0]),
            [(PLUGIN_FILE.to_owned(), 0o644, 0, WASM.to_vec())]
        );
        let config = json(&image.config);
        assert_eq!(config["created"], "2025-11-24T16:00:00Z");
        assert_eq!(config["architecture"], "wasm");
    }

    #[test]
    fn the_artifact_variant_has_the_runtime_config_and_the_raw_module() {
        let image = filter_artifact(WASM, &provenance()).expect("image");
        let manifest = json(&image.manifest().expect("manifest"));
        assert_eq!(manifest["config"]["mediaType"], WASM_CONFIG_MEDIA_TYPE);
        let layers = manifest["layers"].as_array().expect("layers");
        // The pullers insist on exactly two layers, one of the content type.
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0]["mediaType"], WASM_CONFIG_MEDIA_TYPE);
        assert_eq!(layers[0]["digest"], manifest["config"]["digest"]);
        assert_eq!(layers[1]["mediaType"], WASM_CONTENT_MEDIA_TYPE);
        assert_eq!(
            image.layers[1].bytes(),
            WASM,
            "the module as it is, not archived"
        );
        let runtime = json(&image.config);
        assert_eq!(runtime["type"], "envoy_proxy");
        assert_eq!(runtime["config"]["root_ids"][1], CONTROL_ROOT_ID);
    }

    #[test]
    fn the_server_image_runs_sluice_serve_as_a_non_root_account() {
        let image = server(b"ELF", &provenance()).expect("image");
        let config = json(&image.config);
        let run = &config["config"];
        assert_eq!(run["User"], "65532:65532");
        assert_eq!(run["Entrypoint"][0], SERVER_BINARY_PATH);
        assert_eq!(run["Cmd"][0], "serve");
        assert_eq!(run["ExposedPorts"]["8080/tcp"], json!({}));
        assert_eq!(run["Labels"]["org.opencontainers.image.version"], "0.1.0");
        assert_eq!(
            run["Labels"]["org.opencontainers.image.revision"],
            "0123456789abcdef"
        );
        assert_eq!(
            (config["os"].as_str(), config["architecture"].as_str()),
            (Some("linux"), Some("amd64"))
        );
        let files = files(&image.layers[0]);
        let paths: Vec<&str> = files.iter().map(|(path, ..)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/group",
                "etc/passwd",
                "tmp/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/sluice",
                "var/",
                "var/lib/",
                "var/lib/sluice/",
            ]
        );
        let (_, mode, uid, _) = &files[10];
        assert_eq!(
            (*mode, *uid),
            (0o750, SERVER_UID),
            "the data folder is the account's"
        );
        let passwd = String::from_utf8(files[2].3.clone()).expect("utf-8");
        assert!(passwd.contains("sluice:x:65532:65532:"), "{passwd}");
        assert_eq!(files[7].3, b"ELF");
    }

    #[test]
    fn the_same_inputs_give_the_same_digests_and_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        type Recipe = fn(&[u8], &Provenance) -> Result<Image>;
        let builds: [Recipe; 3] = [filter_compat, filter_artifact, server];
        for (n, build) in builds.into_iter().enumerate() {
            let first = dir.path().join(format!("{n}-first"));
            let second = dir.path().join(format!("{n}-second"));
            let a = build(WASM, &provenance())
                .and_then(|image| image.write_layout(&first, "0.1.0"))
                .expect("first");
            let b = build(WASM, &provenance())
                .and_then(|image| image.write_layout(&second, "0.1.0"))
                .expect("second");
            assert_eq!(a.digest(), b.digest());
            for file in ["index.json", "oci-layout"] {
                assert_eq!(
                    std::fs::read(first.join(file)).expect("first"),
                    std::fs::read(second.join(file)).expect("second"),
                );
            }
            let listing = |dir: &Path| {
                let mut names: Vec<_> = std::fs::read_dir(dir.join("blobs/sha256"))
                    .expect("blobs")
                    .map(|entry| entry.expect("entry").file_name())
                    .collect();
                names.sort();
                names
            };
            assert_eq!(listing(&first), listing(&second));

            // And any input changes the digest.
            let mut later = provenance();
            later.created = Some(1_764_000_001);
            let c = build(WASM, &later)
                .and_then(|image| {
                    image.write_layout(&dir.path().join(format!("{n}-later")), "0.1.0")
                })
                .expect("later");
            assert_ne!(a.digest(), c.digest());
            let d = build(b"\0asm other", &provenance())
                .and_then(|image| {
                    image.write_layout(&dir.path().join(format!("{n}-other")), "0.1.0")
                })
                .expect("other");
            assert_ne!(a.digest(), d.digest());
        }
    }
}
