//! The workflow spec v1: parse a workflow document (YAML, or JSON), validate it with errors
//! that name the field path and what was expected, and generate its JSON Schema.
//!
//! ```
//! let doc = "
//! version: v1
//! name: hello
//! jobs:
//!   hello:
//!     image: host
//!     command: [echo, hello]
//! ";
//! let workflow = meridian_spec::parse(doc).unwrap();
//! assert_eq!(workflow.job_order(), ["hello"]);
//!
//! let broken = doc.replace("image: host", "image: python:3.12");
//! let errors = meridian_spec::parse(&broken).unwrap_err();
//! assert_eq!(errors.errors[0].path, "jobs.hello.image");
//! ```
//!
//! [`parse`] reads the text into a generic value within fixed limits ([`MAX_DOCUMENT_BYTES`],
//! [`MAX_DEPTH`], duplicate keys, a YAML alias budget), then walks that value by hand and
//! collects every problem in the document, not just the first, before it builds the typed
//! [`Workflow`]. The typed model lives in [`types`]; sizes, durations and money in [`units`].

mod graph;
mod read;
pub mod types;
pub mod units;
mod validate;
mod walk;

use std::fmt;

use serde::Serialize;

pub use types::*;
pub use units::*;
pub use validate::DATA_SCHEMES;

/// Largest document [`parse`] reads: 1 MiB. A workflow is a description, not data; anything
/// bigger is a mistake or an attack, and refusing it early bounds the parser's memory.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Deepest nesting of lists and mappings [`parse`] accepts, the top-level mapping being
/// level 1. The v1 shape needs 6; the margin leaves room for new fields while keeping
/// hostile inputs such as `[[[[…` from exhausting the stack.
pub const MAX_DEPTH: usize = 64;

/// Most tasks in one job's array (`end - start + 1`).
pub const MAX_ARRAY_TASKS: u32 = 1_000_000;

/// Parses and validates a workflow document.
///
/// A document whose first non-space character is `{` is read as JSON; anything else as YAML
/// (a single document; YAML 1.2 booleans, so `yes` stays a string). On failure every problem
/// found is returned, in document order where the fields allow, with cycles and other
/// cross-field problems last. This function never panics, whatever the input.
pub fn parse(doc: &str) -> Result<Workflow, SpecErrors> {
    let value = read::document(doc).map_err(|e| SpecErrors::from(vec![e]))?;
    validate::workflow(&value)
}

/// Reads a YAML or JSON document into a value under the limits [`parse`] keeps (size,
/// nesting, aliases), without checking it against the v1 shape: for readers of other
/// formats written in YAML (a Fuzzfile).
pub fn read_document(doc: &str) -> Result<serde_json::Value, FieldError> {
    read::document(doc)
}

/// Validates a document that is already a JSON value (for example an HTTP request body).
///
/// The same rules as [`parse`], without the text-level limits; the walk only descends as far
/// as the v1 shape goes, so any value is safe to pass.
pub fn from_value(value: &serde_json::Value) -> Result<Workflow, SpecErrors> {
    validate::workflow(value)
}

/// The JSON Schema (draft 2020-12) of a v1 document, generated from [`Workflow`]. The
/// checked-in copy is `schemas/workflow.schema.json`; a test keeps the two equal.
///
/// The schema describes the shape for editors and other tools; [`parse`] is the authority
/// and checks more (references between fields, cycles, array bounds).
pub fn json_schema() -> serde_json::Value {
    schemars::schema_for!(Workflow).to_value()
}

/// One problem in a document.
///
/// `path` locates the field with dots and `[i]` for list items, such as
/// `jobs.train.resources.gpus.vendor` or `jobs.prep.command[0]`; keys that are not plain
/// names are written `["like this"]`. Problems with the document as a whole (it is not YAML,
/// it is too large or too deep, it is empty) have an empty `path`, and then `Display` shows
/// the message alone. Otherwise `Display` shows `path: message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}", self.render())]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A problem with the document as a whole (empty path).
    pub fn document(message: impl Into<String>) -> Self {
        FieldError::new("", message)
    }

    fn render(&self) -> String {
        if self.path.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.path, self.message)
        }
    }
}

/// Every problem [`parse`] found in one document; never empty when returned by it.
/// `Display` writes one problem per line. Serializes as `{"errors": [{"path", "message"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}", Lines(&self.errors))]
pub struct SpecErrors {
    pub errors: Vec<FieldError>,
}

impl SpecErrors {
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, FieldError> {
        self.errors.iter()
    }
}

impl From<Vec<FieldError>> for SpecErrors {
    fn from(errors: Vec<FieldError>) -> Self {
        SpecErrors { errors }
    }
}

impl<'a> IntoIterator for &'a SpecErrors {
    type Item = &'a FieldError;
    type IntoIter = std::slice::Iter<'a, FieldError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl IntoIterator for SpecErrors {
    type Item = FieldError;
    type IntoIter = std::vec::IntoIter<FieldError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

struct Lines<'a>(&'a [FieldError]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}
