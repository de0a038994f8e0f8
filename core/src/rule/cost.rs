//! Request costs: how many tokens a request takes.

use crate::request::{RequestAttributes, RequestNeeds};
use crate::spec::CostSpec;
use crate::validation::{Problems, is_header_name};

/// Largest fixed or header-given cost.
pub const MAX_COST: u64 = 1_000_000;

/// How many tokens a request takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    Header {
        name: String,
        max: u64,
        default: u64,
    },
}

impl Cost {
    pub(super) fn build(spec: &CostSpec, problems: &mut Problems) -> Option<Cost> {
        match spec {
            CostSpec::Fixed(n) if (1..=MAX_COST).contains(n) => Some(Cost::Fixed(*n)),
            CostSpec::Fixed(_) => {
                problems.add("cost.fixed", format!("must be between 1 and {MAX_COST}"));
                None
            }
            CostSpec::Header(h) => {
                let name = h.name.to_ascii_lowercase();
                let mut ok = true;
                if !is_header_name(&name) {
                    problems.add("cost.header.name", "must be a header name");
                    ok = false;
                }
                if !(1..=MAX_COST).contains(&h.max) {
                    problems.add(
                        "cost.header.max",
                        format!("must be between 1 and {MAX_COST}"),
                    );
                    ok = false;
                }
                if h.default > h.max {
                    problems.add("cost.header.default", "must not exceed max");
                    ok = false;
                }
                ok.then_some(Cost::Header {
                    name,
                    max: h.max,
                    default: h.default,
                })
            }
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut RequestNeeds) {
        if let Cost::Header { name, .. } = self {
            needs.header(name);
        }
    }

    /// The cost of this request. A header value that is not a whole number costs the
    /// default; one above `max` costs `max`.
    pub fn of(&self, request: &impl RequestAttributes) -> u64 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Header { name, max, default } => request
                .header(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(*default, |c| c.min(*max)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::rule;
    use crate::request::HttpRequest;

    #[test]
    fn header_costs_are_capped_and_default_when_unreadable() {
        let r = rule(
            r#"{"name":"c","key":"global","limits":[{"requests":10,"period":1}],"cost":{"header":{"name":"x-cost","max":5}}}"#,
        );
        assert_eq!(r.cost.of(&HttpRequest::get("/")), 1);
        assert_eq!(
            r.cost.of(&HttpRequest::get("/").with_header("x-cost", "3")),
            3
        );
        assert_eq!(
            r.cost
                .of(&HttpRequest::get("/").with_header("x-cost", "300")),
            5
        );
        assert_eq!(
            r.cost
                .of(&HttpRequest::get("/").with_header("x-cost", "-2")),
            1
        );
    }
}
