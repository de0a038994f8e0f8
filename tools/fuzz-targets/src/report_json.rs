use sluice_core::report::Report;

/// The JSON body of `POST /api/v1/reports`, as the core defines it (`Report`, the
/// contract the admin API's `ReportBody` mirrors field for field; the admin crate's test
/// `the_mirror_matches_the_core_encoding` pins the two together).
///
/// The admin API's own reading of that body (`ReportBody` and its `validate`) lives in
/// `admin-api/src/api/reports.rs`, among axum handlers, and cannot be compiled without the
/// whole admin crate (axum, sqlx, Redis, reqwest: about ten times the crates of the core
/// under sanitizer instrumentation), so this target fuzzes the shared contract.
///
/// Asserts: parsing never panics, and a parsed report survives a round trip through the
/// proxy's encoder (`Report::to_json`) unchanged.
pub fn report_json(bytes: &[u8]) {
    let Ok(report) = serde_json::from_slice::<Report>(bytes) else {
        return;
    };
    let again: Report =
        serde_json::from_slice(&report.to_json()).expect("an encoded report parses");
    assert_eq!(again, report);
}
