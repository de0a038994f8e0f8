//! Rules files as operators write them: a JSON or YAML list of rules, or the same list under
//! a `rules` key (the shape of the filter's plugin configuration and of the admin API).
//!
//! Read by `sluice rules apply` and `sluice envoy-config`, by the admin API for its rules
//! bodies (which it also reads through [`strict_json`] and [`integral_floats_to_integers`]),
//! and by the `rules_file` fuzz target; none of them needs the others' dependencies.
//!
//! This crate only checks shape. Whether the rules make sense is decided by
//! `sluice_core` validation, which reports every problem with a field path; shape errors
//! here use the same `rules[i].field` paths so both kinds of message read alike.

pub mod envoy_ratelimit;
pub mod nesting;
pub mod strict_json;

pub use nesting::MAX_NESTING;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_core::spec::RuleSpec;

/// The syntax of a rules file, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulesFormat {
    Json,
    Yaml,
}

impl RulesFormat {
    /// `.json` is JSON, `.yaml`/`.yml` are YAML; anything else is refused rather than
    /// guessed, so a typo'd path does not produce a confusing syntax error.
    pub fn from_path(path: &Path) -> Option<RulesFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "json" => Some(RulesFormat::Json),
            "yaml" | "yml" => Some(RulesFormat::Yaml),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            RulesFormat::Json => "JSON",
            RulesFormat::Yaml => "YAML",
        }
    }
}

/// Why a rules file could not be read as a list of rules.
#[derive(Debug, thiserror::Error)]
pub enum RulesFileError {
    #[error("{}: expected a .json, .yaml or .yml file", path.display())]
    UnknownFormat { path: PathBuf },
    #[error("{}: cannot read the file", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid {format}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error(
        "{}: the document nests {depth} levels deep; a rules file may nest at most {limit}",
        path.display()
    )]
    TooDeep {
        path: PathBuf,
        /// The depth found (an upper estimate: see [`nesting::nesting_depth`]).
        depth: usize,
        limit: usize,
    },
    #[error("{}: {field}: {message}", path.display())]
    Shape {
        path: PathBuf,
        /// Where the problem is, e.g. `rules[0].limits[1].period`.
        field: String,
        message: String,
    },
}

/// Reads and parses a rules file; the format follows the extension.
pub fn read_rules_file(path: &Path) -> Result<Vec<RuleSpec>, RulesFileError> {
    let format = RulesFormat::from_path(path).ok_or_else(|| RulesFileError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let text = std::fs::read_to_string(path).map_err(|source| RulesFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_rules(&text, format, path)
}

/// Replaces every number with a zero fraction that fits an `i64` or `u64` by that
/// integer, so that serde's integer fields take it.
pub fn integral_floats_to_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            let Some(f) = n.as_f64() else { return };
            // The casts saturate; the range checks make sure nothing was cut.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let integer = if f.fract() != 0.0 {
                None
            } else if f >= 0.0 && f < u64::MAX as f64 {
                Some(serde_json::Number::from(f as u64))
            } else if f < 0.0 && f >= i64::MIN as f64 {
                Some(serde_json::Number::from(f as i64))
            } else {
                None
            };
            if let Some(integer) = integer {
                *n = integer;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        serde_json::Value::Object(fields) => {
            fields.values_mut().for_each(integral_floats_to_integers)
        }
        _ => {}
    }
}

/// Parses rules from text: a list of rules, or `{rules: [...]}`, in JSON or YAML. `origin`
/// only names the source in error messages. Numbers with a zero fraction (`5.0`) are read
/// as integers, as JSON Schema counts them.
pub fn parse_rules(
    text: &str,
    format: RulesFormat,
    origin: &Path,
) -> Result<Vec<RuleSpec>, RulesFileError> {
    let syntax = |message: String| RulesFileError::Syntax {
        path: origin.to_path_buf(),
        format: format.name(),
        message,
    };
    // Refused before parsing: a parser spends seconds on a document of thousands of nested
    // sequences before it refuses it.
    let depth = nesting::nesting_depth(text);
    if depth > MAX_NESTING {
        return Err(RulesFileError::TooDeep {
            path: origin.to_path_buf(),
            depth,
            limit: MAX_NESTING,
        });
    }
    // Going through one JSON value lets both syntaxes share the shape check below, and so
    // report identical field paths.
    let value: serde_json::Value = match format {
        RulesFormat::Json => serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?,
        RulesFormat::Yaml => serde_norway::from_str(text).map_err(|e| syntax(e.to_string()))?,
    };
    let mut value = value;
    integral_floats_to_integers(&mut value);
    let shape = |field: &str, message: &str| RulesFileError::Shape {
        path: origin.to_path_buf(),
        field: field.to_string(),
        message: message.to_string(),
    };
    let wrapped = match value {
        list @ serde_json::Value::Array(_) => serde_json::json!({ "rules": list }),
        object @ serde_json::Value::Object(_) => object,
        // An empty YAML document is null: an empty rules file means no rules.
        serde_json::Value::Null => serde_json::json!({ "rules": [] }),
        _ => {
            return Err(shape(
                "(top level)",
                "expected a list of rules, or an object with a `rules` list",
            ));
        }
    };

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RulesDocument {
        rules: Vec<RuleSpec>,
    }
    serde_path_to_error::deserialize::<_, RulesDocument>(strict_json::Strict(wrapped))
        .map(|doc| doc.rules)
        .map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." {
                "(top level)".to_string()
            } else {
                field
            };
            shape(&field, &explain(e.inner().to_string()))
        })
}

/// Writes `rules` as a rules file, `{rules: [...]}`, that [`parse_rules`] reads back.
pub fn render_rules(rules: &[RuleSpec], format: RulesFormat) -> Result<String, String> {
    #[derive(serde::Serialize)]
    struct RulesFile<'a> {
        rules: &'a [RuleSpec],
    }
    let file = RulesFile { rules };
    match format {
        RulesFormat::Json => serde_json::to_string_pretty(&file)
            .map(|json| json + "\n")
            .map_err(|e| e.to_string()),
        // Through a JSON value: serde_norway writes enums as YAML tags (`!header x`), which
        // neither people nor `parse_rules` expect; JSON's shape is the contract.
        RulesFormat::Yaml => serde_json::to_value(&file)
            .map_err(|e| e.to_string())
            .and_then(|v| serde_norway::to_string(&v).map_err(|e| e.to_string()))
            .map(|mut yaml| {
                if !yaml.ends_with('\n') {
                    yaml.push('\n');
                }
                yaml
            }),
    }
}

/// serde's message for an untagged enum names a Rust type, which means nothing to someone
/// editing a rules file; say what is accepted instead.
pub fn explain(message: String) -> String {
    if message.contains("untagged enum PeriodSpec") {
        "expected second, minute, hour, day or a number of seconds".to_string()
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> &'static Path {
        Path::new("rules.yaml")
    }

    /// What a refused rules file is told.
    fn refusal(text: &str, format: RulesFormat) -> String {
        parse_rules(text, format, origin()).unwrap_err().to_string()
    }

    #[test]
    fn format_follows_the_extension() {
        assert_eq!(
            RulesFormat::from_path(Path::new("a.json")),
            Some(RulesFormat::Json)
        );
        assert_eq!(
            RulesFormat::from_path(Path::new("a.YML")),
            Some(RulesFormat::Yaml)
        );
        assert_eq!(
            RulesFormat::from_path(Path::new("a.yaml")),
            Some(RulesFormat::Yaml)
        );
        assert_eq!(RulesFormat::from_path(Path::new("a.toml")), None);
        assert_eq!(RulesFormat::from_path(Path::new("rules")), None);
    }

    #[test]
    fn a_list_and_a_rules_object_mean_the_same() {
        let list = r#"[{"name":"a","key":"global","limits":[{"requests":1,"period":"second"}]}]"#;
        let object = format!(r#"{{"rules":{list}}}"#);
        let from_list = parse_rules(list, RulesFormat::Json, origin()).unwrap();
        let from_object = parse_rules(&object, RulesFormat::Json, origin()).unwrap();
        assert_eq!(from_list, from_object);
        assert_eq!(from_list.len(), 1);
        assert_eq!(from_list[0].name, "a");
    }

    #[test]
    fn yaml_rules_parse() {
        let yaml = "
- name: per-key
  match: {path_prefix: /api/}
  key: {header: x-api-key}
  limits:
    - {requests: 5, period: second, burst: 10}
";
        let rules = parse_rules(yaml, RulesFormat::Yaml, origin()).unwrap();
        assert_eq!(rules[0].limits[0].burst, Some(10));
    }

    #[test]
    fn an_empty_yaml_file_has_no_rules() {
        assert!(
            parse_rules("", RulesFormat::Yaml, origin())
                .unwrap()
                .is_empty()
        );
        assert!(
            parse_rules("# nothing yet\n", RulesFormat::Yaml, origin())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn shape_errors_name_the_file_and_field() {
        let yaml = "
- name: a
  key: global
  limits:
    - {requests: 5, period: second, brust: 10}
";
        let err = parse_rules(yaml, RulesFormat::Yaml, origin()).unwrap_err();
        let RulesFileError::Shape { field, message, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(field, "rules[0].limits[0].brust");
        assert!(message.contains("brust"), "{message}");
        assert!(
            err.to_string()
                .starts_with("rules.yaml: rules[0].limits[0].brust: "),
            "{err}"
        );
    }

    #[test]
    fn a_bad_period_says_what_is_accepted() {
        let yaml = "[{name: a, key: global, limits: [{requests: 1, period: fortnight}]}]";
        assert_eq!(
            refusal(yaml, RulesFormat::Yaml),
            "rules.yaml: rules[0].limits[0].period: expected second, minute, hour, day or a number of seconds"
        );
    }

    #[test]
    fn unknown_top_level_keys_are_refused() {
        let err = refusal(r#"{"rules":[],"slots":3}"#, RulesFormat::Json);
        assert!(err.contains("slots"), "{err}");
    }

    #[test]
    fn syntax_errors_say_which_syntax() {
        let err = refusal("[{", RulesFormat::Json);
        assert!(err.starts_with("rules.yaml: not valid JSON: "), "{err}");
        let err = refusal("- a: [", RulesFormat::Yaml);
        assert!(err.starts_with("rules.yaml: not valid YAML: "), "{err}");
    }

    #[test]
    fn a_scalar_is_not_a_rules_file() {
        let err = refusal("42", RulesFormat::Yaml);
        assert!(err.contains("expected a list of rules"), "{err}");
    }

    /// The README's LLM token budgets example is a valid rules file.
    #[test]
    fn the_llm_example_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/llm-rules.yaml");
        let rules = read_rules_file(&path).unwrap();
        let ruleset = sluice_core::ruleset::Ruleset::from_specs(rules).unwrap();
        assert!(ruleset.has_token_rules());
        assert_eq!(ruleset.rules().len(), 2);
    }
}
