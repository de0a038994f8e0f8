//! Rebuilds the `sluice` binary when the dashboard bundle changes: rust-embed includes the
//! files that exist at compile time, but cannot tell cargo about files added later.

fn main() {
    let dist = std::path::Path::new("../dashboard/dist");
    // A missing path would make cargo rerun this script (and rebuild the crate) on every
    // build; an empty folder is what "not built yet" looks like to rust-embed anyway.
    let _ = std::fs::create_dir_all(dist);
    println!("cargo:rerun-if-changed=../dashboard/dist");
    println!("cargo:rerun-if-changed=build.rs");
}
