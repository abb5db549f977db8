//! A small path-aware walker over `serde_json::Value`.
//!
//! Validation asks the walker for a field of a given shape. When the shape is wrong the
//! walker records an error at the field's path, in the form "expected X; got Y", and returns
//! `None`; the caller carries on with the other fields. That is how one pass over a document
//! reports every problem in it, where serde's derived `Deserialize` would stop at the first.
//!
//! Conventions: a parser is `fn(&mut Walker, &Path, &Value) -> Option<T>`, and `None` always
//! comes with at least one recorded error.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::FieldError;

/// Where a value sits in the document: `jobs.train.resources.gpus.vendor`, `command[0]`.
/// Keys that are not plain names are written `["like this"]` so the path stays unambiguous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Path(String);

impl Path {
    pub fn root() -> Path {
        Path(String::new())
    }

    pub fn key(&self, key: &str) -> Path {
        let plain = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        let mut path = self.0.clone();
        if plain {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
        } else {
            path.push('[');
            path.push_str(&quote(key));
            path.push(']');
        }
        Path(path)
    }

    pub fn index(&self, index: usize) -> Path {
        Path(format!("{}[{index}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Collects errors while validation walks the document.
#[derive(Default)]
pub(crate) struct Walker {
    errors: Vec<FieldError>,
}

impl Walker {
    pub fn error(&mut self, path: &Path, message: impl Into<String>) {
        self.errors.push(FieldError::new(path.as_str(), message));
    }

    /// Records "expected {what}; got {value}" and returns `None` for the caller to pass on.
    pub fn expected<T>(&mut self, path: &Path, what: &str, got: &Value) -> Option<T> {
        self.error(path, format!("expected {what}; got {}", describe(got)));
        None
    }

    /// Like [`Walker::expected`], with the reason in parentheses.
    pub fn expected_because<T>(
        &mut self,
        path: &Path,
        what: &str,
        got: &Value,
        why: impl Display,
    ) -> Option<T> {
        self.error(
            path,
            format!("expected {what}; got {} ({why})", describe(got)),
        );
        None
    }

    pub fn into_errors(self) -> Vec<FieldError> {
        self.errors
    }

    /// Opens a mapping whose keys are field names: reports a value that is not a mapping, and
    /// each key that is not one of `fields`.
    pub fn mapping<'v>(
        &mut self,
        path: &Path,
        value: &'v Value,
        fields: &[&str],
    ) -> Option<Fields<'v>> {
        let Value::Object(map) = value else {
            let what = format!("a mapping with the fields {}", fields.join(", "));
            return self.expected(path, &what, value);
        };
        for key in map.keys() {
            if !fields.contains(&key.as_str()) {
                self.error(
                    &path.key(key),
                    format!("unknown field; expected one of {}", fields.join(", ")),
                );
            }
        }
        Some(Fields {
            path: path.clone(),
            map,
        })
    }
}

/// The fields of one mapping, opened with [`Walker::mapping`].
pub(crate) struct Fields<'v> {
    path: Path,
    map: &'v Map<String, Value>,
}

impl<'v> Fields<'v> {
    pub fn value(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key)
    }

    /// An optional field (an `Option` in the model): `Some(None)` when absent or `null`, as
    /// serde and the JSON Schema have it; `None` when present but invalid.
    pub fn optional<T>(
        &self,
        w: &mut Walker,
        key: &str,
        parse: impl FnOnce(&mut Walker, &Path, &'v Value) -> Option<T>,
    ) -> Option<Option<T>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Some(None),
            Some(value) => parse(w, &self.path.key(key), value).map(Some),
        }
    }

    /// A field with a default for when it is absent (`null` is not absent here: the model
    /// has no `Option` to hold it, so it is reported).
    pub fn or<T>(
        &self,
        w: &mut Walker,
        key: &str,
        default: T,
        parse: impl FnOnce(&mut Walker, &Path, &'v Value) -> Option<T>,
    ) -> Option<T> {
        match self.map.get(key) {
            None => Some(default),
            Some(value) => parse(w, &self.path.key(key), value),
        }
    }

    /// A field that must be there; when it is not, says what it should be.
    pub fn required<T>(
        &self,
        w: &mut Walker,
        key: &str,
        what: &str,
        parse: impl FnOnce(&mut Walker, &Path, &'v Value) -> Option<T>,
    ) -> Option<T> {
        let path = self.path.key(key);
        match self.map.get(key) {
            None => {
                w.error(&path, format!("required; expected {what}"));
                None
            }
            Some(value) => parse(w, &path, value),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsers for the shapes that recur.
// ---------------------------------------------------------------------------------------------

pub(crate) fn string<'v>(w: &mut Walker, path: &Path, value: &'v Value) -> Option<&'v str> {
    match value {
        Value::String(s) => Some(s),
        Value::Number(_) | Value::Bool(_) => {
            let hint = format!("quote it: \"{value}\"");
            w.expected_because(path, "a string", value, hint)
        }
        _ => w.expected(path, "a string", value),
    }
}

/// A string that is not empty.
pub(crate) fn text(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    let s = string(w, path, value)?;
    if s.is_empty() {
        return w.expected(path, "a non-empty string", value);
    }
    Some(s.to_string())
}

/// A string, number or boolean, taken as its text (`1` → `"1"`, `true` → `"true"`).
pub(crate) fn scalar_text(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => w.expected(path, "a string, number or boolean", value),
    }
}

pub(crate) fn boolean(w: &mut Walker, path: &Path, value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        _ => w.expected(path, "true or false", value),
    }
}

/// A whole number in `min..=max`. Accepts `4.0`, as JSON Schema's `integer` does.
pub(crate) fn integer(
    w: &mut Walker,
    path: &Path,
    value: &Value,
    min: u64,
    max: u64,
) -> Option<u64> {
    let what = if max < u64::from(u32::MAX) {
        format!("an integer from {min} to {max}")
    } else if min == 0 {
        "a whole number (0 or more)".to_string()
    } else {
        format!("an integer of at least {min}")
    };
    let whole = match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) if s.trim().parse::<f64>().is_ok() => {
            return w.expected_because(path, &what, value, "write it without quotes");
        }
        _ => None,
    };
    match whole {
        Some(n) if (min..=max).contains(&n) => Some(n),
        Some(n) if n > max => w.expected_because(
            path,
            &what,
            value,
            format_args!("the largest accepted is {max}"),
        ),
        _ => w.expected(path, &what, value),
    }
}

/// One of a fixed set of spellings, e.g. a GPU vendor.
pub(crate) fn one_of<T: Copy>(
    w: &mut Walker,
    path: &Path,
    value: &Value,
    choices: &[(&str, T)],
) -> Option<T> {
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let what = format!("one of {}", names.join(", "));
    if let Value::String(s) = value {
        if let Some((_, choice)) = choices.iter().find(|(name, _)| name == s) {
            return Some(*choice);
        }
        let lower = s.to_ascii_lowercase();
        if names.contains(&lower.as_str()) {
            return w.expected_because(path, &what, value, "names are lowercase");
        }
    }
    w.expected(path, &what, value)
}

/// A value written as a string with its own grammar (sizes, durations, money, images). A bare
/// number goes through the same grammar so that the message explains what is missing, such
/// as the unit in `memory: 16`.
pub(crate) fn parsed<T>(w: &mut Walker, path: &Path, value: &Value, what: &str) -> Option<T>
where
    T: FromStr,
    T::Err: Display,
{
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return w.expected(path, what, value),
    };
    match text.parse() {
        Ok(parsed) => Some(parsed),
        Err(why) => w.expected_because(path, what, value, why),
    }
}

/// A list whose items are each parsed; every item is checked even after one fails.
pub(crate) fn list<'v, T>(
    w: &mut Walker,
    path: &Path,
    value: &'v Value,
    what: &str,
    mut item: impl FnMut(&mut Walker, &Path, &'v Value) -> Option<T>,
) -> Option<Vec<T>> {
    let Value::Array(items) = value else {
        return w.expected(path, what, value);
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, v) in items.iter().enumerate() {
        match item(w, &path.index(i), v) {
            Some(parsed) => out.push(parsed),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// A mapping from free keys (names) to parsed values; every entry is checked.
pub(crate) fn map<'v, T>(
    w: &mut Walker,
    path: &Path,
    value: &'v Value,
    what: &str,
    mut entry: impl FnMut(&mut Walker, &Path, &'v str, &'v Value) -> Option<T>,
) -> Option<BTreeMap<String, T>> {
    let Value::Object(entries) = value else {
        return w.expected(path, what, value);
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (key, v) in entries {
        match entry(w, &path.key(key), key, v) {
            Some(parsed) => {
                out.insert(key.clone(), parsed);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

// ---------------------------------------------------------------------------------------------
// Describing what was found.
// ---------------------------------------------------------------------------------------------

/// Longest piece of the document quoted back in a message.
const QUOTE_CHARS: usize = 60;

/// How a value reads in "got …": strings quoted, numbers as written, containers by kind.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quote(s),
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "a mapping".to_string(),
    }
}

/// A string in double quotes with JSON escapes, cut short when long.
pub(crate) fn quote(s: &str) -> String {
    let cut: String = s.chars().take(QUOTE_CHARS).collect();
    let mut quoted = serde_json::to_string(&cut).unwrap_or_else(|_| "\"?\"".to_string());
    if cut.len() < s.len() {
        quoted.insert(quoted.len() - 1, '…');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_quote_keys_that_are_not_names() {
        let p = Path::root().key("jobs").key("my job").key("env").index(2);
        assert_eq!(p.as_str(), r#"jobs["my job"].env[2]"#);
        assert_eq!(Path::root().key("").as_str(), r#"[""]"#);
    }

    #[test]
    fn long_strings_are_cut_in_messages() {
        let q = quote(&"x".repeat(1000));
        assert_eq!(q.chars().count(), QUOTE_CHARS + 3);
        assert!(q.ends_with("…\""));
        assert_eq!(quote("a\nb"), r#""a\nb""#);
    }
}
