//! Image layers as tar archives whose bytes depend only on the entries given.
//!
//! Nothing is read from the file system: every entry's path, kind, mode, owner and content is
//! stated by the caller, every entry gets the same modification time, and entries are written
//! in path order. Gzip output carries no file name and a zero time in its header, so the
//! compressed bytes are as fixed as the tar's (for one version of the compressor).

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{Context, Result, bail};
use flate2::{Compression, GzBuilder};
use tar::{EntryType, Header};

/// What one path in a layer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    File(Vec<u8>),
}

/// One entry of a layer: its kind, permission bits and numeric owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
}

impl Entry {
    /// A regular file owned by root.
    pub fn file(content: impl Into<Vec<u8>>, mode: u32) -> Entry {
        Entry {
            kind: EntryKind::File(content.into()),
            mode,
            uid: 0,
            gid: 0,
        }
    }

    /// A directory owned by root.
    pub fn dir(mode: u32) -> Entry {
        Entry {
            kind: EntryKind::Directory,
            mode,
            uid: 0,
            gid: 0,
        }
    }

    /// The same entry owned by `uid:gid`.
    pub fn owned_by(self, uid: u64, gid: u64) -> Entry {
        Entry { uid, gid, ..self }
    }
}

/// A layer's entries by relative path (`etc/passwd`, no leading slash). A map, so the
/// archive lists them in one order whatever order they were added in; a directory sorts
/// before what it holds.
#[derive(Debug, Clone, Default)]
pub struct LayerContents {
    entries: BTreeMap<String, Entry>,
    /// Seconds since the Unix epoch, given to every entry.
    mtime: u64,
}

impl LayerContents {
    /// An empty layer whose entries will all carry `mtime` (seconds since the epoch).
    pub fn new(mtime: u64) -> LayerContents {
        LayerContents {
            entries: BTreeMap::new(),
            mtime,
        }
    }

    /// Adds (or replaces) the entry at `path`.
    pub fn insert(&mut self, path: &str, entry: Entry) -> Result<&mut LayerContents> {
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|part| part == "..") {
            bail!("layer path {path:?} must be relative and stay inside the layer");
        }
        self.entries
            .insert(path.trim_end_matches('/').to_owned(), entry);
        Ok(self)
    }

    /// The paths, in archive order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The uncompressed tar archive (ustar headers, ending with the two zero blocks).
    pub fn tar(&self) -> Result<Vec<u8>> {
        let mut archive = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = Header::new_ustar();
            header.set_mode(entry.mode);
            header.set_uid(entry.uid);
            header.set_gid(entry.gid);
            header.set_mtime(self.mtime);
            match &entry.kind {
                EntryKind::Directory => {
                    header.set_entry_type(EntryType::Directory);
                    header.set_size(0);
                    archive
                        .append_data(&mut header, format!("{path}/"), std::io::empty())
                        .with_context(|| format!("adding directory {path}"))?;
                }
                EntryKind::File(content) => {
                    header.set_entry_type(EntryType::Regular);
                    header.set_size(content.len() as u64);
                    archive
                        .append_data(&mut header, path, content.as_slice())
                        .with_context(|| format!("adding file {path}"))?;
                }
            }
        }
        archive.into_inner().context("finishing the tar archive")
    }
}

/// `bytes` gzipped at the best compression, with a header that holds no name and no time.
pub fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = GzBuilder::new()
        .mtime(0)
        // 255: "unknown" operating system, so the header does not say where it was built.
        .operating_system(255)
        .write(Vec::new(), Compression::best());
    encoder.write_all(bytes).context("gzipping a layer")?;
    encoder.finish().context("gzipping a layer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(order: &[&str]) -> LayerContents {
        let mut layer = LayerContents::new(1_700_000_000);
        for path in order {
            let entry = if path.ends_with('/') {
                Entry::dir(0o755)
            } else {
                Entry::file(path.as_bytes().to_vec(), 0o644).owned_by(65532, 65532)
            };
            layer.insert(path, entry).expect("valid path");
        }
        layer
    }

    #[test]
    fn the_order_entries_are_added_in_does_not_change_the_bytes() {
        let one = sample(&["etc/", "etc/passwd", "usr/bin/x"])
            .tar()
            .expect("tar");
        let other = sample(&["usr/bin/x", "etc/passwd", "etc/"])
            .tar()
            .expect("tar");
        assert_eq!(one, other);
        assert_eq!(gzip(&one).expect("gzip"), gzip(&other).expect("gzip"));
    }

    #[test]
    fn entries_keep_their_stated_metadata() {
        let bytes = sample(&["etc/", "etc/passwd"]).tar().expect("tar");
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().expect("entries") {
            let entry = entry.expect("entry");
            let header = entry.header();
            seen.push((
                entry.path().expect("path").display().to_string(),
                header.mode().expect("mode"),
                header.uid().expect("uid"),
                header.mtime().expect("mtime"),
            ));
        }
        assert_eq!(
            seen,
            [
                ("etc/".to_owned(), 0o755, 0, 1_700_000_000),
                ("etc/passwd".to_owned(), 0o644, 65532, 1_700_000_000),
            ]
        );
    }

    #[test]
    fn gzip_headers_carry_no_time_or_host() {
        let gz = gzip(b"plugin").expect("gzip");
        // Magic, deflate, no flags, MTIME 0, then XFL and OS 255 (unknown).
        assert_eq!(&gz[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&gz[4..8], &[0, 0, 0, 0]);
        assert_eq!(gz[9], 255);
        let mut decoded = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(gz.as_slice()),
            &mut decoded,
        )
        .expect("gunzip");
        assert_eq!(decoded, b"plugin");
    }

    #[test]
    fn paths_outside_the_layer_are_refused() {
        let mut layer = LayerContents::new(0);
        for bad in ["", "/etc/passwd", "../x", "a/../../b"] {
            assert!(layer.insert(bad, Entry::dir(0o755)).is_err(), "{bad:?}");
        }
    }
}
