//! The OCI image layouts `cargo xtask build` writes in `target/dist/oci/`, read by tools that
//! share no code with the writer: each is copied with skopeo into Debian's `docker-registry`
//! and back into a new layout, and must come back byte for byte (manifest, configuration,
//! layers); skopeo must read the media types the control planes' pullers look for; the
//! compat layer must unpack, with GNU tar, to exactly the built filter; and the server
//! image's binary must be static and serve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sluice_harness::serve::{AdminApi, Serve};
use sluice_oci::Provenance;
use sluice_tests::registry::{Registry, Skopeo};
use sluice_tests::{Artifacts, workspace_root};

/// An image layout on disk, read with nothing but JSON and file reads.
#[derive(Debug)]
struct Layout {
    tag: String,
    manifest_digest: String,
    /// Every blob, by file name (the hex digest).
    blobs: BTreeMap<String, Vec<u8>>,
}

impl Layout {
    fn read(dir: &Path) -> Layout {
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index.json"))
                .expect("index.json is JSON");
        let manifests = index["manifests"].as_array().expect("a manifests list");
        assert_eq!(manifests.len(), 1, "one image per layout: {index}");
        let entry = &manifests[0];
        assert_eq!(
            entry["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        let blobs = std::fs::read_dir(dir.join("blobs/sha256"))
            .expect("blobs/sha256")
            .map(|file| {
                let file = file.expect("a blob");
                (
                    file.file_name().to_string_lossy().into_owned(),
                    std::fs::read(file.path()).expect("blob bytes"),
                )
            })
            .collect();
        Layout {
            tag: entry["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .expect("a tag")
                .to_owned(),
            manifest_digest: entry["digest"].as_str().expect("a digest").to_owned(),
            blobs,
        }
    }

    fn blob(&self, digest: &str) -> &[u8] {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.blobs
            .get(hex)
            .unwrap_or_else(|| panic!("no blob {digest} in the layout"))
    }

    fn manifest(&self) -> Value {
        serde_json::from_slice(self.blob(&self.manifest_digest)).expect("the manifest is JSON")
    }
}

/// One image's trip through a registry: what was built, what came back, and its name there.
struct RoundTrip {
    built: Layout,
    back: Layout,
    remote: String,
    skopeo: Skopeo,
    /// Kept until the test ends: the registry is killed when it drops.
    _registry: Registry,
    _scratch: tempfile::TempDir,
}

/// Copies layout `name` into a fresh registry and back into a new layout, and checks that
/// nothing changed on the way: the manifest skopeo reads from the registry is the built
/// one byte for byte, and the layout copied back holds the same blobs under the same
/// manifest digest.
fn round_trip(name: &str) -> RoundTrip {
    let dir = Artifacts::from_env().oci_layout(name);
    let built = Layout::read(&dir);
    let registry = Registry::start();
    let skopeo = Skopeo::from_env();
    let remote = format!("docker://{}/{name}:{}", registry.addr(), built.tag);
    skopeo.copy(&format!("oci:{}:{}", dir.display(), built.tag), &remote);

    let served = skopeo.raw_manifest(&remote);
    assert!(
        served == built.blob(&built.manifest_digest),
        "the registry serves a different manifest for {name}:\n{}\nregistry log:\n{}",
        String::from_utf8_lossy(&served),
        registry.log()
    );

    let scratch = tempfile::tempdir().expect("scratch folder");
    let copy = scratch.path().join(name);
    skopeo.copy(&remote, &format!("oci:{}:{}", copy.display(), built.tag));
    let back = Layout::read(&copy);
    assert_eq!(back.tag, built.tag);
    assert_eq!(
        back.manifest_digest, built.manifest_digest,
        "{name}'s digest changed"
    );
    assert_eq!(
        back.blobs.keys().collect::<Vec<_>>(),
        built.blobs.keys().collect::<Vec<_>>(),
        "{name} came back with other blobs"
    );
    assert!(
        back.blobs == built.blobs,
        "{name}'s blobs changed on the way"
    );
    RoundTrip {
        built,
        back,
        remote,
        skopeo,
        _registry: registry,
        _scratch: scratch,
    }
}

fn media_types(manifest: &Value) -> (String, Vec<String>) {
    let text = |value: &Value| value.as_str().expect("a media type").to_owned();
    (
        text(&manifest["config"]["mediaType"]),
        manifest["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|layer| text(&layer["mediaType"]))
            .collect(),
    )
}

/// Unpacks a gzipped tar layer with GNU tar into `into`; the paths of what it made there.
fn untar(layer: &[u8], into: &Path) -> Vec<String> {
    let archive = into.with_extension("tar.gz");
    std::fs::write(&archive, layer).expect("writing the layer");
    std::fs::create_dir_all(into).expect("creating the folder");
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(into)
        .arg("--numeric-owner")
        .output()
        .expect("running tar");
    assert!(
        out.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut paths = Vec::new();
    walk(into, into, &mut paths);
    paths.sort();
    paths
}

fn walk(root: &Path, dir: &Path, paths: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("reading a folder") {
        let path = entry.expect("an entry").path();
        let relative = path
            .strip_prefix(root)
            .expect("inside")
            .display()
            .to_string();
        if path.is_dir() {
            paths.push(format!("{relative}/"));
            walk(root, &path, paths);
        } else {
            paths.push(relative);
        }
    }
}

/// The media types of an OCI image of one gzipped tar layer: its configuration's and
/// its layers', as [`media_types`] gives them.
fn one_gzipped_tar_layer() -> (String, Vec<String>) {
    (
        "application/vnd.oci.image.config.v1+json".to_owned(),
        vec!["application/vnd.oci.image.layer.v1.tar+gzip".to_owned()],
    )
}

fn filter_wasm() -> Vec<u8> {
    std::fs::read(Artifacts::from_env().filter_wasm()).expect("the built filter")
}

#[test]
fn the_compat_filter_image_round_trips_and_unpacks_to_exactly_plugin_wasm() {
    let trip = round_trip("sluice-filter");
    let manifest = trip.built.manifest();
    assert_eq!(
        media_types(&manifest),
        one_gzipped_tar_layer(),
        "Istio and Envoy Gateway read the last layer as gzipped tar of this type"
    );
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"],
        "compat"
    );
    let served: Value =
        serde_json::from_slice(&trip.skopeo.raw_manifest(&trip.remote)).expect("JSON");
    assert_eq!(
        served["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        trip.skopeo.raw_config(&trip.remote),
        trip.built
            .blob(manifest["config"]["digest"].as_str().expect("digest")),
        "skopeo reads the built configuration"
    );

    let scratch = tempfile::tempdir().expect("scratch");
    let layer = trip
        .back
        .blob(manifest["layers"][0]["digest"].as_str().expect("digest"));
    let unpacked = scratch.path().join("layer");
    assert_eq!(untar(layer, &unpacked), ["plugin.wasm"]);
    assert!(
        std::fs::read(unpacked.join("plugin.wasm")).expect("plugin.wasm") == filter_wasm(),
        "plugin.wasm is the built sluice_filter.wasm"
    );
}

#[test]
fn the_artifact_filter_image_round_trips_with_the_wasm_media_types() {
    let trip = round_trip("sluice-filter-artifact");
    let manifest = trip.built.manifest();
    let (config, layers) = media_types(&manifest);
    assert_eq!(config, "application/vnd.module.wasm.config.v1+json");
    // The pullers want exactly two layers and take the module from the content layer.
    assert_eq!(
        layers,
        [
            "application/vnd.module.wasm.config.v1+json",
            "application/vnd.module.wasm.content.layer.v1+wasm"
        ]
    );
    let served: Value =
        serde_json::from_slice(&trip.skopeo.raw_manifest(&trip.remote)).expect("JSON");
    assert_eq!(served["layers"][1]["mediaType"], layers[1]);
    let module = trip
        .back
        .blob(manifest["layers"][1]["digest"].as_str().expect("digest"));
    assert!(
        module == filter_wasm(),
        "the content layer is the built module as it is"
    );
    let runtime: Value = serde_json::from_slice(
        trip.back
            .blob(manifest["config"]["digest"].as_str().expect("digest")),
    )
    .expect("the runtime configuration is JSON");
    assert_eq!(runtime["type"], "envoy_proxy");
}

#[test]
fn the_filter_images_are_reproduced_from_the_built_filter() {
    // The same filter and the same checkout give the same digests as `cargo xtask build`
    // wrote; a commit since that build changes the images' time and revision.
    let provenance = Provenance::for_checkout(&workspace_root()).expect("provenance");
    let wasm = filter_wasm();
    for (name, image) in [
        (
            "sluice-filter",
            sluice_oci::filter_compat(&wasm, &provenance),
        ),
        (
            "sluice-filter-artifact",
            sluice_oci::filter_artifact(&wasm, &provenance),
        ),
    ] {
        let manifest = image.and_then(|image| image.manifest()).expect("the image");
        let built = Layout::read(&Artifacts::from_env().oci_layout(name));
        assert_eq!(
            manifest.digest().to_string(),
            built.manifest_digest,
            "{name} differs from what `cargo xtask build` wrote: rebuild after committing"
        );
    }
}

#[test]
fn the_server_image_round_trips_and_its_static_binary_serves() {
    let trip = round_trip("sluice");
    let manifest = trip.built.manifest();
    assert_eq!(media_types(&manifest), one_gzipped_tar_layer());
    // skopeo's own reading of the configuration.
    let inspected = trip.skopeo.inspect(&trip.remote);
    assert_eq!(inspected["Os"], "linux");
    assert_eq!(inspected["Architecture"], "amd64");
    assert_eq!(
        inspected["Labels"]["org.opencontainers.image.version"],
        trip.built.tag
    );
    let config: Value = serde_json::from_slice(&trip.skopeo.raw_config(&trip.remote))
        .expect("the configuration is JSON");
    let run = &config["config"];
    assert_eq!(run["User"], "65532:65532", "not root");
    assert_eq!(
        run["Entrypoint"],
        serde_json::json!(["/usr/local/bin/sluice"])
    );
    assert_eq!(run["Cmd"][0], "serve");
    assert!(run["ExposedPorts"]["8080/tcp"].is_object(), "{run}");

    let scratch = tempfile::tempdir().expect("scratch");
    let root = scratch.path().join("rootfs");
    let layer = trip
        .back
        .blob(manifest["layers"][0]["digest"].as_str().expect("digest"));
    let paths = untar(layer, &root);
    for expected in [
        "etc/passwd",
        "etc/group",
        "usr/local/bin/sluice",
        "var/lib/sluice/",
        "tmp/",
    ] {
        assert!(
            paths.iter().any(|path| path == expected),
            "{expected} in {paths:?}"
        );
    }
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    assert!(
        passwd
            .lines()
            .any(|line| line.starts_with("sluice:x:65532:65532:")),
        "{passwd}"
    );

    let binary = root.join("usr/local/bin/sluice");
    assert_static(&binary);
    let version = Command::new(&binary)
        .arg("--version")
        .env_clear()
        .output()
        .expect("running the static sluice");
    assert!(version.status.success());
    assert!(
        String::from_utf8_lossy(&version.stdout).contains(&trip.built.tag),
        "{}",
        String::from_utf8_lossy(&version.stdout)
    );
    // And it serves: migrations on SQLite, the listener, the API, all from the one file.
    let database = format!("sqlite://{}", scratch.path().join("sluice.db").display());
    let server = AdminApi::start(&Serve::new(PathBuf::from(&binary), database))
        .expect("the static sluice serves");
    let (status, body) = server
        .call("GET", "/api/v1/rules", "")
        .expect("an answer from the static sluice");
    assert_eq!(status, 200, "{body}");
}

/// `ldd`, from glibc, has no libraries to name for a static binary.
fn assert_static(binary: &Path) {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .expect("running ldd");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("not a dynamic executable") || said.contains("statically linked"),
        "{} is not static; ldd says: {said}",
        binary.display()
    );
}
