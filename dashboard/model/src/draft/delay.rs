//! What an over-limit request gets (`on_limit`) and, when it waits, the delay queue's
//! inputs (the rule's `delay` section: `max_delay_ms`, `queue_per_key`,
//! `queue_per_worker`). The section is written only while the rule delays; its inputs
//! keep what was typed while it refuses, as the token budget's do.

use sluice_core::spec::{DelaySpec, OnLimit};

use super::choice::Choice;
use super::number::{Number, Numbers};

/// The queue bounds' placeholders: the defaults the core applies to an empty input
/// (`queue_per_key` follows a smaller `queue_per_worker` down, which the hint says).
/// Text, because a placeholder is; a test pins them to the core's numbers
/// (`sluice_core::rule::DEFAULT_QUEUE_PER_KEY`, `DEFAULT_QUEUE_PER_WORKER`).
pub const QUEUE_PER_KEY_DEFAULT: &str = "16";
pub const QUEUE_PER_WORKER_DEFAULT: &str = "1024";

/// The "when over the limit" `<select>`: the wire's names.
impl Choice for OnLimit {
    const ALL: &'static [Self] = &[OnLimit::Refuse, OnLimit::Delay];

    fn value(self) -> &'static str {
        match self {
            OnLimit::Refuse => "refuse",
            OnLimit::Delay => "delay",
        }
    }
}

/// The inputs for what an over-limit request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayDraft {
    pub on_limit: OnLimit,
    /// Required while the rule delays: the API has no default for it.
    pub max_delay_ms: Number<u64>,
    /// Empty: the core's default ([`QUEUE_PER_KEY_DEFAULT`], or `queue_per_worker` if
    /// smaller). Left out of the spec when empty, so a loaded rule keeps its absence.
    pub queue_per_key: Number<u32>,
    /// Empty: the core's default ([`QUEUE_PER_WORKER_DEFAULT`]).
    pub queue_per_worker: Number<u32>,
}

impl Default for DelayDraft {
    fn default() -> DelayDraft {
        DelayDraft::from_spec(OnLimit::Refuse, None)
    }
}

impl DelayDraft {
    /// The inputs that show a rule's `on_limit` and `delay`.
    pub fn from_spec(on_limit: OnLimit, delay: Option<&DelaySpec>) -> DelayDraft {
        DelayDraft {
            on_limit,
            max_delay_ms: delay.map_or_else(Number::empty, |d| Number::from(d.max_delay_ms)),
            queue_per_key: delay
                .and_then(|d| d.queue_per_key)
                .map_or_else(Number::empty, Number::from),
            queue_per_worker: delay
                .and_then(|d| d.queue_per_worker)
                .map_or_else(Number::empty, Number::from),
        }
    }

    pub fn delays(&self) -> bool {
        self.on_limit == OnLimit::Delay
    }

    /// `on_limit` and the `delay` section the inputs describe: no section while the rule
    /// refuses (the core refuses one there), whatever the inputs still hold. A missing
    /// `max_delay_ms` stands in as 0 with its problem, which the core refuses anyway.
    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> (OnLimit, Option<DelaySpec>) {
        if !self.delays() {
            return (OnLimit::Refuse, None);
        }
        let max_delay_ms = numbers
            .required(&self.max_delay_ms, "delay.max_delay_ms")
            .unwrap_or(0);
        let queue_per_key = numbers.optional(&self.queue_per_key, "delay.queue_per_key");
        let queue_per_worker = numbers.optional(&self.queue_per_worker, "delay.queue_per_worker");
        let delay = DelaySpec {
            max_delay_ms,
            queue_per_key,
            queue_per_worker,
        };
        (OnLimit::Delay, Some(delay))
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::rule::{DEFAULT_QUEUE_PER_KEY, DEFAULT_QUEUE_PER_WORKER};

    use super::super::choice::tests::options_round_trip;
    use super::*;

    fn read(draft: &DelayDraft) -> ((OnLimit, Option<DelaySpec>), Vec<String>) {
        let mut numbers = Numbers::default();
        let spec = draft.to_spec(&mut numbers);
        let problems = numbers
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect();
        (spec, problems)
    }

    #[test]
    fn on_limit_options_are_the_wire_names() {
        options_round_trip::<OnLimit>();
        for choice in OnLimit::ALL {
            assert_eq!(serde_json::to_value(choice).unwrap(), choice.value());
        }
    }

    #[test]
    fn the_placeholders_are_the_cores_defaults() {
        assert_eq!(QUEUE_PER_KEY_DEFAULT, DEFAULT_QUEUE_PER_KEY.to_string());
        assert_eq!(
            QUEUE_PER_WORKER_DEFAULT,
            DEFAULT_QUEUE_PER_WORKER.to_string()
        );
    }

    #[test]
    fn every_delay_section_survives_the_inputs() {
        for json in [
            r#"{"max_delay_ms":500}"#,
            r#"{"max_delay_ms":60000,"queue_per_key":4}"#,
            r#"{"max_delay_ms":1,"queue_per_worker":64}"#,
            r#"{"max_delay_ms":250,"queue_per_key":8,"queue_per_worker":10000}"#,
        ] {
            let delay: DelaySpec = serde_json::from_str(json).unwrap();
            let draft = DelayDraft::from_spec(OnLimit::Delay, Some(&delay));
            assert_eq!(
                read(&draft),
                ((OnLimit::Delay, Some(delay)), vec![]),
                "{json}"
            );
        }
    }

    #[test]
    fn refusing_writes_no_section_and_keeps_the_inputs() {
        let delay: DelaySpec =
            serde_json::from_str(r#"{"max_delay_ms":500,"queue_per_key":4}"#).unwrap();
        let mut draft = DelayDraft::from_spec(OnLimit::Delay, Some(&delay));
        draft.on_limit = OnLimit::Refuse;
        assert_eq!(read(&draft), ((OnLimit::Refuse, None), vec![]));
        assert_eq!(
            draft.max_delay_ms.text(),
            "500",
            "kept for when it delays again"
        );
        // Even an input that is not a number is no problem while it does not apply.
        draft.queue_per_worker = Number::parse("many");
        assert_eq!(read(&draft), ((OnLimit::Refuse, None), vec![]));
        let blank = DelayDraft::default();
        assert!(!blank.delays());
        assert_eq!(blank.max_delay_ms.text(), "");
    }

    #[test]
    fn delaying_needs_a_maximum_and_names_each_input_that_is_not_a_number() {
        let mut draft = DelayDraft {
            on_limit: OnLimit::Delay,
            ..DelayDraft::default()
        };
        let ((on_limit, delay), problems) = read(&draft);
        assert_eq!(on_limit, OnLimit::Delay);
        assert_eq!(
            delay,
            Some(DelaySpec {
                max_delay_ms: 0,
                queue_per_key: None,
                queue_per_worker: None
            }),
            "empty queue bounds are the defaults"
        );
        assert_eq!(problems, ["delay.max_delay_ms: is required"]);
        draft.max_delay_ms = Number::parse("1,000");
        draft.queue_per_key = Number::parse("four");
        draft.queue_per_worker = Number::parse("1.5");
        let ((_, delay), problems) = read(&draft);
        assert_eq!(delay.map(|d| d.max_delay_ms), Some(1_000));
        assert_eq!(
            problems,
            [
                "delay.queue_per_key: must be a whole number",
                "delay.queue_per_worker: must be a whole number",
            ]
        );
    }
}
