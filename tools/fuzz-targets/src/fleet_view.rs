use sluice_core::global::lease::FleetView;

/// `FleetView::decode`: the fleet view the control service publishes in shared data, read
/// by every worker on each tick.
///
/// Asserts: decoding never panics; only 13-byte values decode; a decoded view has a
/// non-zero sync interval (workers divide by it and multiply it into lease lifetimes),
/// and it is canonical: re-encoding it and decoding again gives the same view.
pub fn fleet_view(bytes: &[u8]) {
    let Some(view) = FleetView::decode(bytes) else {
        return;
    };
    assert_eq!(bytes.len(), 13, "only the fixed layout decodes");
    assert!(view.sync_interval_ns > 0);
    let _ = view.lease_ttl_ns();
    assert_eq!(FleetView::decode(&view.encode()), Some(view));
}
