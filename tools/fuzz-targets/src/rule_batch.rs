use std::collections::BTreeMap;

use sluice_core::control::reports::ReportSender;
use sluice_core::report::{MAX_RULES, Report, RuleBatch, RuleCounts, TOP_CLIENTS};
use sluice_core::time::Nanos;

const SECOND: Nanos = Nanos::from_secs(1);

/// `RuleBatch::decode`: a worker's decision statistics on the `sluice.reports` shared
/// queue, which the control service merges into its next report.
///
/// Asserts: decoding never panics; a decoded batch round-trips through `encode`; and the
/// control service's path for it (merge the batch, twice, as two workers' batches would
/// be, close the interval into a report, send it) never panics, keeps every rule's counts
/// exact (saturating at `u64::MAX`, never wrapping), and sends JSON that parses back into
/// the report it describes.
pub fn rule_batch(bytes: &[u8]) {
    let Some(batch) = RuleBatch::decode(bytes) else {
        return;
    };
    assert_eq!(RuleBatch::decode(&batch.encode()).as_ref(), Some(&batch));

    let mut sender = ReportSender::new("fuzz-proxy".into(), SECOND, Nanos::ZERO);
    sender.merge(&batch);
    sender.merge(&batch);
    sender.tick(SECOND, 1);
    let Some(json) = sender.next_to_send() else {
        // Nothing to report only when the batch carried nothing at all.
        assert!(batch.rules.is_empty() && batch.overflow == 0);
        return;
    };
    let report: Report = serde_json::from_slice(&json).expect("a sent report parses");

    let mut expected: BTreeMap<&str, RuleCounts> = BTreeMap::new();
    for rule in batch.rules.iter().chain(&batch.rules) {
        let sum = expected.entry(&rule.rule).or_default();
        add(sum, &rule.counts);
    }
    if expected.len() <= MAX_RULES {
        assert_eq!(report.batch.rules.len(), expected.len());
        for rule in &report.batch.rules {
            assert_eq!(Some(&rule.counts), expected.get(rule.rule.as_str()));
            assert!(rule.top_clients.len() <= TOP_CLIENTS);
            assert!(rule.top_requesters.len() <= TOP_CLIENTS);
        }
    }
}

/// Counts as the report must carry them: exact while they fit, then pinned at the top.
fn add(sum: &mut RuleCounts, more: &RuleCounts) {
    sum.allowed = sum.allowed.saturating_add(more.allowed);
    sum.denied = sum.denied.saturating_add(more.denied);
    sum.shadow_denied = sum.shadow_denied.saturating_add(more.shadow_denied);
    sum.near_limit = sum.near_limit.saturating_add(more.near_limit);
    sum.fail_open = sum.fail_open.saturating_add(more.fail_open);
    sum.key_missing = sum.key_missing.saturating_add(more.key_missing);
}
