//! Following the admin API's ruleset.
//!
//! The control service long-polls `GET /api/v1/ruleset?after=VERSION&wait=SECONDS`: the
//! admin API answers at once when a newer ruleset exists and otherwise holds the request
//! until one does (or answers 304 when the wait ends). Each ruleset is validated whole
//! before it is published to the workers; one that fails is refused (the last good one
//! stays), its version is remembered so it is not fetched again in a loop, and the reason
//! goes back to the admin API on the next poll. When the admin API is unreachable or
//! answers garbage, the next poll waits with exponential backoff while the workers keep
//! enforcing what they have.

use crate::ruleset::Ruleset;
use crate::time::Nanos;
use crate::wire::{RULESET_PATH, RulesetDocument};

use super::{Answer, header_safe};

const SECOND: u64 = 1_000_000_000;
/// The first wait after a failure; doubled on each failure that follows.
pub const FIRST_BACKOFF_NS: u64 = SECOND;
/// The longest wait: short enough that a restarted admin API is followed within seconds.
pub const MAX_BACKOFF_NS: u64 = 10 * SECOND;

/// The follower's state between calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesetFollower {
    /// The version published to the workers.
    running_version: u64,
    /// The newest version seen, a refused one included.
    seen_version: u64,
    /// Why the last ruleset or poll failed, sent with the next poll.
    last_error: Option<String>,
    polling: bool,
    retry_at: Nanos,
    backoff_ns: u64,
}

/// A poll to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub path: String,
    /// The version the workers enforce, for the admin API's view of the fleet.
    pub running_version: u64,
    /// Why the previous ruleset or poll failed, if it did.
    pub last_error: Option<String>,
}

/// What an answer to a poll means.
#[derive(Debug)]
pub enum PollOutcome {
    /// A newer, valid ruleset: publish it to the workers and say how that went with
    /// [`RulesetFollower::published`].
    Publish(Box<RulesetDocument>, Box<Ruleset>),
    /// Nothing newer: poll again.
    Unchanged,
    /// A newer ruleset that does not validate: the last good one stays.
    Refused { version: u64, message: String },
    /// No usable answer: the next poll waits `retry_in_ns`.
    Failed { message: String, retry_in_ns: u64 },
}

impl RulesetFollower {
    /// A follower whose workers already run `running_version` (0: none; after a VM
    /// reload, shared data still holds what was published).
    pub fn new(running_version: u64) -> Self {
        RulesetFollower {
            running_version,
            seen_version: running_version,
            last_error: None,
            polling: false,
            retry_at: Nanos::ZERO,
            backoff_ns: FIRST_BACKOFF_NS,
        }
    }

    pub fn running_version(&self) -> u64 {
        self.running_version
    }

    /// The poll to send at `now`, if none is outstanding and no backoff runs; the
    /// follower then counts it as outstanding.
    pub fn poll(&mut self, now: Nanos, wait_seconds: u32) -> Option<Poll> {
        if self.polling || now < self.retry_at {
            return None;
        }
        self.polling = true;
        Some(Poll {
            path: format!(
                "{RULESET_PATH}?after={}&wait={wait_seconds}",
                self.seen_version
            ),
            running_version: self.running_version,
            last_error: self.last_error.clone(),
        })
    }

    /// The poll could not be sent (the host refused the call).
    pub fn not_sent(&mut self, now: Nanos, why: &str) -> PollOutcome {
        self.polling = false;
        self.fail(now, why.to_string())
    }

    /// Takes the answer to the outstanding poll.
    pub fn answered(&mut self, now: Nanos, answer: Answer<'_>) -> PollOutcome {
        self.polling = false;
        match answer.status {
            Some(200) => self.take(now, answer.body.unwrap_or_default()),
            // The wait ended with nothing newer: ask again at once.
            Some(304) => self.succeed(),
            Some(status @ (401 | 403)) => self.fail(
                now,
                format!("the admin API refused the proxy token (HTTP {status})"),
            ),
            Some(status) => self.fail(now, format!("the admin API answered HTTP {status}")),
            None => self.fail(
                now,
                "the admin API did not answer (connection failed or timed out)".to_string(),
            ),
        }
    }

    /// Records how publishing the ruleset of a [`PollOutcome::Publish`] went.
    pub fn published(
        &mut self,
        now: Nanos,
        version: u64,
        result: Result<(), String>,
    ) -> PollOutcome {
        match result {
            Ok(()) => {
                self.running_version = version;
                self.seen_version = version;
                self.last_error = None;
                self.succeed()
            }
            Err(message) => self.fail(now, message),
        }
    }

    fn take(&mut self, now: Nanos, body: &[u8]) -> PollOutcome {
        let doc = match RulesetDocument::from_json(body) {
            Ok(doc) => doc,
            Err(e) => {
                return self.fail(
                    now,
                    format!("the admin API sent an unreadable ruleset: {e}"),
                );
            }
        };
        if doc.version <= self.running_version {
            // An answer to an older question; nothing to do.
            return self.succeed();
        }
        match doc.compile() {
            Ok(ruleset) => PollOutcome::Publish(Box::new(doc), Box::new(ruleset)),
            Err(errors) => {
                // Keep the last good ruleset; tell the admin API why on the next poll and
                // wait for a newer version instead of fetching this one again.
                self.seen_version = doc.version;
                let message = format!("refused ruleset version {}: {errors}", doc.version);
                self.last_error = Some(header_safe(&message));
                self.backoff_ns = FIRST_BACKOFF_NS;
                self.retry_at = Nanos::ZERO;
                PollOutcome::Refused {
                    version: doc.version,
                    message,
                }
            }
        }
    }

    fn succeed(&mut self) -> PollOutcome {
        self.backoff_ns = FIRST_BACKOFF_NS;
        self.retry_at = Nanos::ZERO;
        PollOutcome::Unchanged
    }

    fn fail(&mut self, now: Nanos, message: String) -> PollOutcome {
        self.last_error = Some(header_safe(&message));
        let retry_in_ns = self.backoff_ns;
        self.retry_at = now.saturating_add(Nanos::new(retry_in_ns));
        self.backoff_ns = (self.backoff_ns.saturating_mul(2)).min(MAX_BACKOFF_NS);
        PollOutcome::Failed {
            message,
            retry_in_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000 * SECOND;

    /// A ruleset of one rule allowing `requests` a second (0 does not validate).
    fn ruleset(version: u64, requests: u64) -> Vec<u8> {
        format!(
            r#"{{"version":{version},"rules":[{{"name":"api","key":"global",
            "limits":[{{"requests":{requests},"period":"second"}}]}}]}}"#
        )
        .into_bytes()
    }

    fn ok(body: &[u8]) -> Answer<'_> {
        Answer::new(Some(200), Some(body))
    }

    #[test]
    fn a_valid_newer_ruleset_is_published_and_followed_from() {
        let mut follower = RulesetFollower::new(0);
        let poll = follower.poll(Nanos::new(NOW), 30).unwrap();
        assert_eq!(poll.path, "/api/v1/ruleset?after=0&wait=30");
        assert!(
            follower.poll(Nanos::new(NOW), 30).is_none(),
            "one poll at a time"
        );
        let body = ruleset(3, 10);
        let PollOutcome::Publish(doc, compiled) = follower.answered(Nanos::new(NOW), ok(&body))
        else {
            panic!("a valid ruleset is published");
        };
        assert_eq!((doc.version, compiled.rules().len()), (3, 1));
        follower.published(Nanos::new(NOW), doc.version, Ok(()));
        assert_eq!(follower.running_version(), 3);
        let next = follower.poll(Nanos::new(NOW), 30).unwrap();
        assert_eq!(next.path, "/api/v1/ruleset?after=3&wait=30");
        assert_eq!((next.running_version, next.last_error), (3, None));
    }

    #[test]
    fn an_invalid_ruleset_is_refused_once_and_its_reason_sent_back() {
        let mut follower = RulesetFollower::new(2);
        follower.poll(Nanos::new(NOW), 30);
        let body = ruleset(5, 0);
        let outcome = follower.answered(Nanos::new(NOW), ok(&body));
        assert!(
            matches!(&outcome, PollOutcome::Refused { version: 5, message } if message.contains("requests")),
            "{outcome:?}"
        );
        let next = follower
            .poll(Nanos::new(NOW), 30)
            .expect("polls again at once");
        assert_eq!(
            next.path, "/api/v1/ruleset?after=5&wait=30",
            "not fetched again"
        );
        assert_eq!(next.running_version, 2, "the last good ruleset stays");
        assert!(
            next.last_error
                .unwrap()
                .starts_with("refused ruleset version 5")
        );
    }

    #[test]
    fn failures_back_off_exponentially_up_to_a_ceiling_and_success_resets() {
        let mut follower = RulesetFollower::new(0);
        let mut now = NOW;
        let mut waits = Vec::new();
        for _ in 0..6 {
            follower.poll(Nanos::new(now), 30).expect("due");
            let PollOutcome::Failed { retry_in_ns, .. } =
                follower.answered(Nanos::new(now), Answer::NONE)
            else {
                panic!("no answer is a failure");
            };
            assert!(
                follower
                    .poll(Nanos::new(now + retry_in_ns - 1), 30)
                    .is_none()
            );
            waits.push(retry_in_ns / SECOND);
            now += retry_in_ns;
        }
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        let poll = follower.poll(Nanos::new(now), 30).unwrap();
        assert!(poll.last_error.unwrap().contains("did not answer"));
        assert!(matches!(
            follower.answered(Nanos::new(now), Answer::new(Some(304), None)),
            PollOutcome::Unchanged
        ));
        follower
            .poll(Nanos::new(now), 30)
            .expect("at once after an answer");
        let outcome = follower.answered(Nanos::new(now), Answer::new(Some(503), None));
        assert!(matches!(
            outcome,
            PollOutcome::Failed {
                retry_in_ns: FIRST_BACKOFF_NS,
                ..
            }
        ));
    }

    #[test]
    fn garbage_a_refused_token_and_an_old_version_are_told_apart() {
        let mut follower = RulesetFollower::new(4);
        follower.poll(Nanos::new(NOW), 30);
        let outcome = follower.answered(Nanos::new(NOW), ok(b"{not json"));
        assert!(
            matches!(&outcome, PollOutcome::Failed { message, .. } if message.contains("unreadable"))
        );
        follower.poll(Nanos::new(NOW + MAX_BACKOFF_NS), 30);
        let outcome = follower.answered(Nanos::new(NOW), Answer::new(Some(401), None));
        assert!(
            matches!(&outcome, PollOutcome::Failed { message, .. } if message.contains("token (HTTP 401)"))
        );
        follower.poll(Nanos::new(NOW + 2 * MAX_BACKOFF_NS), 30);
        let body = ruleset(4, 10);
        assert!(matches!(
            follower.answered(Nanos::new(NOW), ok(&body)),
            PollOutcome::Unchanged
        ));
        assert_eq!(follower.running_version(), 4);
    }

    #[test]
    fn a_ruleset_that_cannot_be_published_is_a_failure() {
        let mut follower = RulesetFollower::new(0);
        follower.poll(Nanos::new(NOW), 30);
        let body = ruleset(1, 10);
        let PollOutcome::Publish(doc, _) = follower.answered(Nanos::new(NOW), ok(&body)) else {
            panic!("valid");
        };
        let outcome =
            follower.published(Nanos::new(NOW), doc.version, Err("shared data full".into()));
        assert!(matches!(outcome, PollOutcome::Failed { .. }));
        assert_eq!(follower.running_version(), 0);
        assert!(follower.poll(Nanos::new(NOW), 30).is_none(), "backs off");
    }

    #[test]
    fn a_poll_the_host_would_not_send_backs_off() {
        let mut follower = RulesetFollower::new(0);
        follower.poll(Nanos::new(NOW), 30);
        let outcome = follower.not_sent(
            Nanos::new(NOW),
            "cannot call cluster sluice_admin: BadArgument",
        );
        assert!(matches!(
            outcome,
            PollOutcome::Failed {
                retry_in_ns: FIRST_BACKOFF_NS,
                ..
            }
        ));
        assert!(
            follower
                .poll(Nanos::new(NOW + FIRST_BACKOFF_NS), 30)
                .is_some()
        );
    }
}
