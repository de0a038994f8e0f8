//! The cost's inputs: a fixed number of tokens, or a request header's value with a cap
//! and a default.

use sluice_core::spec::{CostSpec, HeaderCostSpec};

use super::choice::Choice;
use super::number::{Number, Numbers};

/// `CostSpec` without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostKind {
    Fixed,
    Header,
}

impl Choice for CostKind {
    const ALL: &'static [Self] = &[CostKind::Fixed, CostKind::Header];

    /// The cost's name on the wire.
    fn value(self) -> &'static str {
        match self {
            CostKind::Fixed => "fixed",
            CostKind::Header => "header",
        }
    }
}

/// The cost's inputs. Both kinds keep their inputs while the other is picked, and each
/// starts from sensible values (1 token; at most 100, 1 without the header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostDraft {
    pub kind: CostKind,
    pub fixed: Number<u64>,
    /// The header's name.
    pub header: String,
    pub max: Number<u64>,
    /// Empty: 1.
    pub default: Number<u64>,
}

impl CostDraft {
    pub(super) fn from_spec(spec: &CostSpec) -> CostDraft {
        let fresh = CostDraft {
            kind: CostKind::Fixed,
            fixed: Number::from(1),
            header: String::new(),
            max: Number::from(100),
            default: Number::from(1),
        };
        match spec {
            CostSpec::Fixed(n) => CostDraft {
                fixed: Number::from(*n),
                ..fresh
            },
            CostSpec::Header(h) => CostDraft {
                kind: CostKind::Header,
                header: h.name.clone(),
                max: Number::from(h.max),
                default: Number::from(h.default),
                ..fresh
            },
        }
    }

    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> CostSpec {
        match self.kind {
            CostKind::Header => CostSpec::Header(HeaderCostSpec {
                name: self.header.trim().to_string(),
                max: numbers.required(&self.max, "cost.header.max").unwrap_or(0),
                default: numbers
                    .optional(&self.default, "cost.header.default")
                    .unwrap_or(1),
            }),
            CostKind::Fixed => {
                CostSpec::Fixed(numbers.required(&self.fixed, "cost.fixed").unwrap_or(0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::choice::tests::options_round_trip;
    use super::*;

    #[test]
    fn cost_options_are_the_wire_names() {
        options_round_trip::<CostKind>();
        let mut draft = CostDraft::from_spec(&CostSpec::default());
        for &kind in CostKind::ALL {
            draft.kind = kind;
            let json = serde_json::to_value(draft.to_spec(&mut Numbers::default())).unwrap();
            assert!(json.get(kind.value()).is_some(), "{json}");
        }
    }

    #[test]
    fn costs_read_back_with_their_defaults_and_problems() {
        let mut draft = CostDraft::from_spec(&CostSpec::default());
        assert_eq!((draft.kind, draft.fixed.text()), (CostKind::Fixed, "1"));
        assert_eq!(
            (draft.max.text(), draft.default.text()),
            ("100", "1"),
            "switching to a header cost starts from sensible bounds"
        );
        draft.kind = CostKind::Header;
        draft.header = " x-cost ".into();
        draft.default = Number::empty();
        let mut numbers = Numbers::default();
        assert_eq!(
            draft.to_spec(&mut numbers),
            CostSpec::Header(HeaderCostSpec {
                name: "x-cost".into(),
                max: 100,
                default: 1,
            })
        );
        assert!(numbers.problems.is_empty(), "{:?}", numbers.problems);
        draft.max = Number::empty();
        draft.default = Number::parse("-1");
        draft.to_spec(&mut numbers);
        draft.kind = CostKind::Fixed;
        draft.fixed = Number::parse("1.5");
        draft.to_spec(&mut numbers);
        let fields: Vec<&str> = numbers.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["cost.header.max", "cost.header.default", "cost.fixed"]
        );
    }
}
