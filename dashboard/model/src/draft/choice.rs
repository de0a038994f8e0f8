//! The form's `<select>`s: each choice a typed value, each with the `<option value>` that
//! stands for it in the page.

use sluice_core::spec::{FailureMode, Mode};

/// A value picked from a fixed list. The list's order and labels are the form's; the
/// option values are these, and for choices the wire also has they are the wire's names.
/// (`Send + Sync` so the form can keep a choice in a signal.)
pub trait Choice: Copy + PartialEq + Send + Sync + 'static {
    /// Every choice, each once.
    const ALL: &'static [Self];

    /// The `<option value>` that stands for this choice.
    fn value(self) -> &'static str;

    /// The choice an `<option value>` stands for.
    fn from_value(value: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.value() == value)
    }
}

/// A rule's failure mode: the proxy's default (`None`), or the rule's own.
impl Choice for Option<FailureMode> {
    const ALL: &'static [Self] = &[None, Some(FailureMode::Open), Some(FailureMode::Closed)];

    fn value(self) -> &'static str {
        match self {
            None => "",
            Some(FailureMode::Open) => "open",
            Some(FailureMode::Closed) => "closed",
        }
    }
}

/// A rule's mode: enforce, shadow (count what it would deny) or warn (tell the client).
impl Choice for Mode {
    const ALL: &'static [Self] = &[Mode::Enforce, Mode::Shadow, Mode::Warn];

    fn value(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Warn => "warn",
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Every choice of `C` reads back from its option value, and no two share one.
    pub(crate) fn options_round_trip<C: Choice + std::fmt::Debug>() {
        for (i, c) in C::ALL.iter().enumerate() {
            assert_eq!(C::from_value(c.value()), Some(*c), "{c:?}");
            assert!(
                C::ALL[..i]
                    .iter()
                    .all(|earlier| earlier.value() != c.value()),
                "{c:?} shares its option value"
            );
        }
        assert_eq!(C::from_value("no such option"), None);
    }

    #[test]
    fn rule_modes_are_named_as_on_the_wire() {
        options_round_trip::<Mode>();
        for mode in Mode::ALL {
            assert_eq!(
                serde_json::to_value(mode).unwrap(),
                mode.value(),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn failure_modes_are_named_as_on_the_wire() {
        options_round_trip::<Option<FailureMode>>();
        for mode in [FailureMode::Open, FailureMode::Closed] {
            assert_eq!(
                serde_json::to_value(mode).unwrap(),
                Some(mode).value(),
                "{mode:?}"
            );
        }
        assert_eq!(None::<FailureMode>.value(), "", "the proxy's default");
    }
}
