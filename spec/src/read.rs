//! Turning document text into a `serde_json::Value`, within limits, before any validation.
//!
//! JSON (a document whose first non-space character is `{`) goes through serde_json, for
//! its precise messages; anything else through serde-saphyr as YAML. Both reject duplicate
//! keys and nesting deeper than [`MAX_DEPTH`], and YAML additionally runs under a budget so
//! that alias bombs and node floods fail fast instead of eating memory.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::granit_parser::ErrorKind;
use serde_saphyr::{
    DuplicateKeyPolicy, ExternalMessageSource, MessageFormatter, UserMessageFormatter,
};

use crate::{FieldError, MAX_DEPTH, MAX_DOCUMENT_BYTES};

/// Most values a YAML document may expand to, counting every use of an alias.
pub(crate) const MAX_NODES: usize = 100_000;
/// Most alias uses (`*name`) in a YAML document.
pub(crate) const MAX_ALIASES: usize = 1_000;

/// Reads `doc` into a value; a failure is one document-level error.
pub(crate) fn document(doc: &str) -> Result<Value, FieldError> {
    if doc.len() > MAX_DOCUMENT_BYTES {
        return Err(FieldError::document(format!(
            "document is {} bytes; the limit is {MAX_DOCUMENT_BYTES} bytes (1 MiB)",
            doc.len()
        )));
    }
    let body = doc.trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    if body.is_empty() {
        return Err(FieldError::document("document is empty"));
    }
    let value = if body.starts_with('{') {
        // The whole text, so line numbers count any blank lines before the `{`.
        json(doc.strip_prefix('\u{feff}').unwrap_or(doc))?
    } else {
        yaml(doc)?
    };
    if value.is_null() {
        // Comments only, or a bare `null`/`~`.
        return Err(FieldError::document("document is empty"));
    }
    Ok(value)
}

fn depth_message() -> String {
    format!("document is nested deeper than the limit of {MAX_DEPTH} levels")
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

fn json(doc: &str) -> Result<Value, FieldError> {
    let mut deserializer = serde_json::Deserializer::from_str(doc);
    Strict { depth: 0 }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| {
            let text = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = text.strip_suffix(&suffix).unwrap_or(&text);
            let at = format!("line {}, column {}", e.line(), e.column());
            if message == depth_message() {
                return FieldError::document(format!("{message} (at {at})"));
            }
            // A YAML flow mapping (`{version: v1, …}`) lands here too; say why it was JSON.
            let hint = match e.classify() {
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                    " (a document that starts with \"{\" is read as JSON)"
                }
                _ => "",
            };
            FieldError::document(format!("invalid JSON at {at}: {message}{hint}"))
        })
}

/// Builds a `Value` like serde_json's own, but refuses duplicate keys (serde_json keeps the
/// last one silently) and nesting deeper than [`MAX_DEPTH`].
#[derive(Clone, Copy)]
struct Strict {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Strict {
    fn deeper<E: de::Error>(&self) -> Result<Strict, E> {
        if self.depth >= MAX_DEPTH {
            Err(E::custom(depth_message()))
        } else {
            Ok(Strict {
                depth: self.depth + 1,
            })
        }
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(inner)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if out.contains_key(key.as_ref()) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let value = map.next_value_seed(inner)?;
            out.insert(key.into_owned(), value);
        }
        Ok(Value::Object(out))
    }
}

// ---------------------------------------------------------------------------------------------
// YAML
// ---------------------------------------------------------------------------------------------

fn yaml(doc: &str) -> Result<Value, FieldError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            // The parser meets deep flow nesting (`[[[[`) before the budget does; give it the
            // same limit, and its recursion error is reported as the depth limit below.
            flow_nesting_limit: MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_aliases: MAX_ALIASES,
            max_documents: 1,
        },
        duplicate_keys: DuplicateKeyPolicy::Error,
        // YAML 1.2 booleans only: `yes`, `no`, `on`, `off` stay strings.
        strict_booleans: true,
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_NODES,
        },
    };
    serde_saphyr::from_str_with_options::<Value>(doc, options).map_err(|e| yaml_error(&e))
}

fn yaml_error(error: &serde_saphyr::Error) -> FieldError {
    let mut original = error;
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = original
    {
        original = error;
    }
    let at = error
        .location()
        .map(|l| format!("line {}, column {}", l.line(), l.column()));
    let with_location = |message: String| match &at {
        Some(at) => format!("{message} (at {at})"),
        None => message,
    };
    use serde_saphyr::Error as E;
    let limit = match original {
        E::Budget { breach, .. } => Some(match breach {
            BudgetBreach::Depth { .. } => depth_message(),
            BudgetBreach::Nodes { .. } => format!(
                "document is too large: more than {MAX_NODES} values, counting each use of a YAML alias"
            ),
            BudgetBreach::Aliases { .. } => {
                format!("document uses more than {MAX_ALIASES} YAML aliases")
            }
            BudgetBreach::Documents { .. } => multiple_documents(),
            other => format!("document is too large or too complex for the YAML reader ({other:?})"),
        }),
        E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::AliasReplayCounterOverflow { .. } => Some(format!(
            "document is too large: more than {MAX_NODES} values, counting each use of a YAML alias"
        )),
        E::MultipleDocuments { .. } => Some(multiple_documents()),
        E::ExternalMessage { source, .. } => match source.as_ref() {
            ExternalMessageSource::Parser(scan)
                if matches!(scan.kind(), ErrorKind::RecursionLimitExceeded) =>
            {
                Some(depth_message())
            }
            _ => None,
        },
        _ => None,
    };
    if let Some(message) = limit {
        return FieldError::document(with_location(message));
    }
    let message = sanitize(&UserMessageFormatter.format_message(original));
    FieldError::document(match at {
        Some(at) => format!("invalid YAML at {at}: {message}"),
        None => format!("invalid YAML: {message}"),
    })
}

fn multiple_documents() -> String {
    "the file holds more than one YAML document (separated by ---); put one workflow in each file"
        .to_string()
}

/// Messages may quote the document; keep them on one line and free of control characters.
fn sanitize(message: &str) -> String {
    message
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}
