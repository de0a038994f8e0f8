//! OCI image layouts of Sluice's deliverables, written so that the same inputs always give
//! the same bytes, and so the same digests.
//!
//! * [`layer`]: a tar layer (optionally gzipped) built from an explicit list of entries,
//!   with fixed owners, modes, times and order.
//! * [`layout`]: blobs, an image manifest and the image-layout directory around them
//!   (`oci-layout`, `index.json`, `blobs/sha256/...`), all JSON written with sorted keys.
//! * [`images`]: the three images `cargo xtask build` writes: the filter in the "compat"
//!   variant and in the wasm-artifact variant that Istio's and Envoy Gateway's pullers read,
//!   and the statically linked `sluice` server on no base image.
//!
//! `skopeo` copies the written layouts to any registry (`skopeo copy oci:DIR:TAG
//! docker://REGISTRY/NAME:TAG`); the end-to-end test `tests/tests/oci.rs` does exactly that
//! against Debian's `docker-registry` and checks that nothing changes on the way.

pub mod images;
pub mod layer;
pub mod layout;

pub use images::{Provenance, filter_artifact, filter_compat, server};
pub use layout::{Blob, Image, WrittenLayout};
