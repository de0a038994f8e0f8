//! How the fleet's syncs with the coordinator read on the overview: each proxy's pace and
//! the coordinator's answer times.

use crate::format::{self, millis};

/// How often a proxy syncs: `every 250 ms`, or, for a proxy whose ruleset has no global
/// limit (it announced a later next sync), `idle · every 4 s`.
pub fn pace(interval_ms: u64, next_sync_ms: Option<u64>) -> String {
    match next_sync_ms {
        Some(next) if next > interval_ms => format!("idle · every {}", millis(next as f64)),
        _ => format!("every {}", millis(interval_ms as f64)),
    }
}

/// The coordinator's answer times: `p99 12 ms` and `p50 3.1 ms · 240 syncs`.
pub fn answer_times(p50_ms: f64, p99_ms: f64, samples: u64) -> (String, String) {
    (
        format!("p99 {}", millis(p99_ms)),
        format!(
            "p50 {} · {} {}",
            millis(p50_ms),
            format::count(samples),
            if samples == 1 { "sync" } else { "syncs" }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_proxy_says_so() {
        assert_eq!(pace(250, None), "every 250 ms");
        assert_eq!(pace(250, Some(4_000)), "idle · every 4 s");
        assert_eq!(pace(250, Some(100)), "every 250 ms");
    }

    #[test]
    fn answer_times_give_the_tail_first() {
        assert_eq!(
            answer_times(3.12, 12.0, 240),
            (
                "p99 12 ms".to_string(),
                "p50 3.1 ms · 240 syncs".to_string()
            )
        );
        assert_eq!(answer_times(1.0, 1.0, 1).1, "p50 1 ms · 1 sync");
    }
}
