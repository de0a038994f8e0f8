//! A number typed into a text input: the text as the user typed it (an `<input>` shows
//! text, and half-typed text must survive) and, parsed once when it changes, what it means.

use std::fmt;

use super::FieldError;

/// Why an input's text does not give the number the rule needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberError {
    /// Nothing typed where a number is required.
    Missing,
    /// Text that is not a whole number (`ten`, `1.5`, `-1` where only positives fit).
    NotWhole,
}

impl NumberError {
    /// The message the form shows next to the input, worded as the core words its own.
    pub fn message(self) -> &'static str {
        match self {
            NumberError::Missing => "is required",
            NumberError::NotWhole => "must be a whole number",
        }
    }
}

impl fmt::Display for NumberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// A whole number type an input can hold, and how its text is read. (`Send + Sync` so the
/// form can keep an input in a signal.)
pub trait Whole: Copy + PartialEq + fmt::Display + Send + Sync + 'static {
    /// The number in `text` (trimmed, not empty), or `None` when it is not one.
    fn read(text: &str) -> Option<Self>;
}

/// Counts allow `,` and `_` as digit separators (`1,000`, `10_000`).
impl Whole for u64 {
    fn read(text: &str) -> Option<u64> {
        text.replace([',', '_'], "").parse().ok()
    }
}

/// Read as a `u64`, a value too large for the narrower type saturates, so the core's
/// range check (which names the range) reports it rather than "not a number".
impl Whole for u32 {
    fn read(text: &str) -> Option<u32> {
        u64::read(text).map(|n| u32::try_from(n).unwrap_or(u32::MAX))
    }
}

/// As for `u32`: an HTTP status of `70000` is out of range, not "not a number".
impl Whole for u16 {
    fn read(text: &str) -> Option<u16> {
        u64::read(text).map(|n| u16::try_from(n).unwrap_or(u16::MAX))
    }
}

/// As for `u32`: a rollout of `300` percent is out of range, not "not a number".
impl Whole for u8 {
    fn read(text: &str) -> Option<u8> {
        u64::read(text).map(|n| u8::try_from(n).unwrap_or(u8::MAX))
    }
}

/// Signed numbers (priorities) take plain digits with an optional sign.
impl Whole for i32 {
    fn read(text: &str) -> Option<i32> {
        text.parse().ok()
    }
}

/// One numeric input: its text and the number it holds (`Ok(None)` when empty).
///
/// Made only by [`Number::parse`] or from a number, so the two never disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Number<T> {
    text: String,
    value: Result<Option<T>, NumberError>,
}

impl<T: Whole> Number<T> {
    /// An input holding `text`, as typed.
    pub fn parse(text: impl Into<String>) -> Number<T> {
        let text = text.into();
        let value = match text.trim() {
            "" => Ok(None),
            t => T::read(t).map(Some).ok_or(NumberError::NotWhole),
        };
        Number { text, value }
    }

    /// An empty input.
    pub fn empty() -> Number<T> {
        Number::parse(String::new())
    }

    /// The text the input shows.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The number typed, `None` when nothing is.
    pub fn value(&self) -> Result<Option<T>, NumberError> {
        self.value
    }

    /// The number, where one is required.
    pub fn required(&self) -> Result<T, NumberError> {
        self.value?.ok_or(NumberError::Missing)
    }
}

impl<T: Whole> From<T> for Number<T> {
    fn from(n: T) -> Number<T> {
        Number {
            text: n.to_string(),
            value: Ok(Some(n)),
        }
    }
}

impl<T: Whole> Default for Number<T> {
    fn default() -> Number<T> {
        Number::empty()
    }
}

/// Reads a draft's numeric inputs into a spec, collecting each input that is missing or
/// not a number under the field path the core would use for it.
#[derive(Debug, Default)]
pub(super) struct Numbers {
    pub(super) problems: Vec<FieldError>,
}

impl Numbers {
    fn problem(&mut self, field: &str, error: NumberError) {
        self.problems.push(FieldError {
            field: field.to_string(),
            message: error.message().to_string(),
        });
    }

    /// The number in `input`; `None` (and a problem) when it is missing or not a number.
    pub(super) fn required<T: Whole>(&mut self, input: &Number<T>, field: &str) -> Option<T> {
        input.required().map_err(|e| self.problem(field, e)).ok()
    }

    /// The number in `input`, `None` when empty; `None` and a problem when not a number.
    pub(super) fn optional<T: Whole>(&mut self, input: &Number<T>, field: &str) -> Option<T> {
        input
            .value()
            .map_err(|e| self.problem(field, e))
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_with_digit_separators_and_keep_their_text() {
        let n = Number::<u64>::parse(" 1,000_000 ");
        assert_eq!(n.value(), Ok(Some(1_000_000)));
        assert_eq!(n.text(), " 1,000_000 ", "shown as typed");
        assert_eq!(Number::<u64>::parse("0").required(), Ok(0));
        for bad in ["ten", "1.5", "-1", "1e3", "99999999999999999999"] {
            assert_eq!(
                Number::<u64>::parse(bad).value(),
                Err(NumberError::NotWhole),
                "{bad}"
            );
        }
    }

    #[test]
    fn empty_is_no_number_and_missing_where_one_is_required() {
        for empty in ["", "   "] {
            let n = Number::<u64>::parse(empty);
            assert_eq!(n.value(), Ok(None));
            assert_eq!(n.required(), Err(NumberError::Missing));
        }
        assert_eq!(Number::<u64>::default(), Number::parse(""));
        assert_eq!(
            Number::<u64>::parse("x").required(),
            Err(NumberError::NotWhole),
            "not a number outranks missing"
        );
        assert_eq!(NumberError::Missing.message(), "is required");
        assert_eq!(NumberError::NotWhole.to_string(), "must be a whole number");
    }

    #[test]
    fn narrow_types_saturate_so_the_core_reports_the_range() {
        assert_eq!(Number::<u16>::parse("70000").value(), Ok(Some(u16::MAX)));
        assert_eq!(Number::<u16>::parse("429").value(), Ok(Some(429)));
        assert_eq!(
            Number::<u32>::parse("99,999,999,999").value(),
            Ok(Some(u32::MAX))
        );
        assert_eq!(
            Number::<u32>::parse("-1").value(),
            Err(NumberError::NotWhole)
        );
    }

    #[test]
    fn priorities_are_signed_without_separators() {
        assert_eq!(Number::<i32>::parse(" -5 ").value(), Ok(Some(-5)));
        assert_eq!(Number::<i32>::parse("+7").value(), Ok(Some(7)));
        assert_eq!(
            Number::<i32>::parse("1,000").value(),
            Err(NumberError::NotWhole)
        );
    }

    #[test]
    fn a_number_made_from_a_value_reads_back_as_that_value() {
        for n in [0, 1, 429, u64::MAX] {
            let input = Number::from(n);
            assert_eq!(input.text(), n.to_string());
            assert_eq!(input, Number::parse(n.to_string()));
        }
        for n in [i32::MIN, -1, 0, i32::MAX] {
            assert_eq!(Number::from(n), Number::parse(n.to_string()));
        }
    }

    #[test]
    fn numbers_name_each_problem_by_its_field() {
        let mut numbers = Numbers::default();
        assert_eq!(numbers.required(&Number::<u64>::parse("3"), "a"), Some(3));
        assert_eq!(numbers.optional(&Number::<u64>::empty(), "b"), None);
        assert_eq!(numbers.required(&Number::<u64>::empty(), "c"), None);
        assert_eq!(numbers.optional(&Number::<u64>::parse("x"), "d"), None);
        let problems: Vec<(&str, &str)> = numbers
            .problems
            .iter()
            .map(|p| (p.field.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            problems,
            [("c", "is required"), ("d", "must be a whole number")]
        );
    }
}
