//! Blobs, image manifests and the OCI image-layout directory that holds them.
//!
//! The layout is the one the image-layout specification describes: an `oci-layout` file,
//! an `index.json` naming the image's manifest (with its tag in
//! `org.opencontainers.image.ref.name`, so `oci:DIR:TAG` finds it), and every blob under
//! `blobs/sha256/<hex digest>`.
//!
//! Every JSON document is written compactly with its object keys sorted. `oci-spec`'s types
//! keep annotations and labels in hash maps, whose order changes from one process to the
//! next; sorting makes the bytes, and so the digests, depend only on the content.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use oci_spec::image::{
    Descriptor, Digest, ImageIndexBuilder, ImageManifestBuilder, MediaType, SCHEMA_VERSION,
    Sha256Digest,
};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The annotation of an `index.json` entry that names its tag.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// The image-layout version this crate writes.
const LAYOUT_VERSION: &str = "1.0.0";

/// Some bytes and the descriptor that points at them.
#[derive(Debug, Clone)]
pub struct Blob {
    descriptor: Descriptor,
    bytes: Vec<u8>,
}

impl Blob {
    pub fn new(media_type: MediaType, bytes: Vec<u8>) -> Blob {
        let descriptor = Descriptor::new(media_type, bytes.len() as u64, sha256(&bytes));
        Blob { descriptor, bytes }
    }

    /// `value` as canonical JSON (compact, keys sorted).
    pub fn json(media_type: MediaType, value: &impl Serialize) -> Result<Blob> {
        Ok(Blob::new(media_type, canonical_json(value)?))
    }

    /// The same blob whose descriptor carries `annotations`.
    pub fn annotated(mut self, annotations: &BTreeMap<String, String>) -> Blob {
        if !annotations.is_empty() {
            self.descriptor.set_annotations(Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ));
        }
        self
    }

    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    pub fn digest(&self) -> &Digest {
        self.descriptor.digest()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// An image: its configuration blob, its layers in order, and the manifest's annotations.
#[derive(Debug, Clone)]
pub struct Image {
    pub config: Blob,
    pub layers: Vec<Blob>,
    pub annotations: BTreeMap<String, String>,
}

impl Image {
    /// The image manifest (`application/vnd.oci.image.manifest.v1+json`, stated in the
    /// document too, as the specification recommends and registries check).
    pub fn manifest(&self) -> Result<Blob> {
        let mut builder = ImageManifestBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageManifest)
            .config(self.config.descriptor.clone())
            .layers(
                self.layers
                    .iter()
                    .map(|layer| layer.descriptor.clone())
                    .collect::<Vec<_>>(),
            );
        if !self.annotations.is_empty() {
            builder = builder.annotations(
                self.annotations
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::HashMap<_, _>>(),
            );
        }
        let manifest = builder.build().context("building the image manifest")?;
        Blob::json(MediaType::ImageManifest, &manifest)
    }

    /// Writes the image as an OCI image layout at `dir`, its manifest tagged `tag`. What was
    /// at `dir` before is replaced whole (it must be an image layout or empty), so no blob of
    /// an earlier build lingers; the new layout is written beside it and renamed into place.
    pub fn write_layout(&self, dir: &Path, tag: &str) -> Result<WrittenLayout> {
        let manifest = self.manifest()?;
        let mut ref_name = std::collections::HashMap::new();
        ref_name.insert(REF_NAME_ANNOTATION.to_owned(), tag.to_owned());
        let mut entry = manifest.descriptor.clone();
        entry.set_annotations(Some(ref_name));
        let index = ImageIndexBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![entry])
            .build()
            .context("building index.json")?;

        let partial = sibling(dir, ".part")?;
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .with_context(|| format!("removing {}", partial.display()))?;
        }
        let blobs_dir = partial.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs_dir)
            .with_context(|| format!("creating {}", blobs_dir.display()))?;
        for blob in std::iter::once(&manifest)
            .chain(std::iter::once(&self.config))
            .chain(&self.layers)
        {
            // A blob named twice (the wasm-artifact variant's configuration is also a
            // layer) is written twice with the same bytes.
            let path = blobs_dir.join(blob.digest().digest());
            std::fs::write(&path, &blob.bytes)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        write(
            &partial.join("oci-layout"),
            &canonical_json(&serde_json::json!({ "imageLayoutVersion": LAYOUT_VERSION }))?,
        )?;
        write(&partial.join("index.json"), &canonical_json(&index)?)?;

        clear_layout(dir)?;
        std::fs::rename(&partial, dir)
            .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
        Ok(WrittenLayout {
            dir: dir.to_path_buf(),
            tag: tag.to_owned(),
            manifest: manifest.descriptor,
        })
    }
}

/// An image layout on disk.
#[derive(Debug, Clone)]
pub struct WrittenLayout {
    pub dir: PathBuf,
    pub tag: String,
    /// The manifest's descriptor: its digest is the image's digest in any registry.
    pub manifest: Descriptor,
}

impl WrittenLayout {
    pub fn digest(&self) -> &Digest {
        self.manifest.digest()
    }

    /// The image as skopeo and other containers/image tools name it: `oci:DIR:TAG`.
    pub fn skopeo_name(&self) -> String {
        format!("oci:{}:{}", self.dir.display(), self.tag)
    }
}

impl fmt::Display for WrittenLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.skopeo_name(), self.digest())
    }
}

/// The sha256 digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> Digest {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Sha256Digest::from_str(&hex)
        .map(Digest::from)
        // 64 lowercase hexadecimal digits are what `Sha256Digest` accepts.
        .unwrap_or_else(|err| unreachable!("a sha256 in hex is a valid digest: {err}"))
}

/// `value` as compact JSON with every object's keys sorted.
pub fn canonical_json(value: &impl Serialize) -> Result<Vec<u8>> {
    let value = serde_json::to_value(value).context("serialising JSON")?;
    serde_json::to_vec(&sorted(value)).context("serialising JSON")
}

/// Rebuilds every object with its keys inserted in sorted order. With serde_json's default
/// map that is a no-op; with `preserve_order` (which another crate in the build may turn on)
/// it fixes the order too.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let entries: BTreeMap<String, Value> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(entries.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// `dir` with `suffix` added to its last component.
fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no final component", dir.display()))?;
    let mut name = name.to_owned();
    name.push(suffix);
    Ok(dir.with_file_name(name))
}

/// Removes an earlier image layout at `dir`; refuses to remove anything else.
fn clear_layout(dir: &Path) -> Result<()> {
    if !dir.exists() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        return Ok(());
    }
    let empty = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .next()
        .is_none();
    if !empty && !dir.join("oci-layout").is_file() {
        bail!(
            "{} exists and is not an OCI image layout: not replacing it",
            dir.display()
        );
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(annotations: &[(&str, &str)]) -> Image {
        let config = Blob::new(MediaType::ImageConfig, b"{}".to_vec());
        let layer = Blob::new(MediaType::ImageLayer, b"layer bytes".to_vec());
        Image {
            config,
            layers: vec![layer],
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn digests_are_the_sha256_of_the_bytes() {
        // The sha256 of the empty string, as `sha256sum` prints it.
        assert_eq!(
            sha256(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let blob = Blob::new(MediaType::ImageLayer, b"abc".to_vec());
        assert_eq!(blob.descriptor().size(), 3);
        assert_eq!(
            blob.digest().digest(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn json_keys_are_sorted_at_every_depth() {
        let value = serde_json::json!({"b": 1, "a": {"d": [{"z": 0, "y": 1}], "c": 2}});
        assert_eq!(
            String::from_utf8(canonical_json(&value).expect("json")).expect("utf-8"),
            r#"{"a":{"c":2,"d":[{"y":1,"z":0}]},"b":1}"#
        );
    }

    #[test]
    fn a_layout_holds_the_marker_the_index_and_every_blob() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("image");
        let written = image(&[("x", "y")])
            .write_layout(&target, "1.0")
            .expect("written");
        assert_eq!(
            std::fs::read_to_string(target.join("oci-layout")).expect("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#
        );
        let index: Value =
            serde_json::from_slice(&std::fs::read(target.join("index.json")).expect("index.json"))
                .expect("JSON");
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(
            index["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        assert_eq!(
            index["manifests"][0]["annotations"][REF_NAME_ANNOTATION],
            "1.0"
        );
        assert_eq!(
            index["manifests"][0]["digest"],
            written.digest().to_string()
        );
        let blobs: Vec<String> = std::fs::read_dir(target.join("blobs/sha256"))
            .expect("blobs")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(blobs.len(), 3, "manifest, config, layer: {blobs:?}");
        for name in blobs {
            let bytes = std::fs::read(target.join("blobs/sha256").join(&name)).expect("blob");
            assert_eq!(
                sha256(&bytes).digest(),
                name,
                "a blob is named by its digest"
            );
        }
        assert_eq!(
            written.skopeo_name(),
            format!("oci:{}:1.0", target.display())
        );
    }

    #[test]
    fn writing_again_replaces_the_layout_with_the_same_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("image");
        let first = image(&[("b", "2"), ("a", "1")])
            .write_layout(&target, "t")
            .expect("first");
        let index = std::fs::read(target.join("index.json")).expect("index");
        let second = image(&[("a", "1"), ("b", "2")])
            .write_layout(&target, "t")
            .expect("second");
        assert_eq!(first.digest(), second.digest());
        assert_eq!(
            index,
            std::fs::read(target.join("index.json")).expect("index")
        );
        assert!(!dir.path().join("image.part").exists());
    }

    #[test]
    fn a_folder_that_is_not_a_layout_is_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("precious"), b"keep").expect("write");
        let refused = image(&[]).write_layout(dir.path(), "t");
        assert!(refused.is_err());
        assert!(dir.path().join("precious").is_file());
    }
}
