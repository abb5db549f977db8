//! Job scripts written for other systems, turned into v1 workflows: Slurm batch
//! scripts (`sbatch`) and CIQ Fuzzball's Fuzzfiles. Pure: text in, a workflow and a
//! report of what was not carried over as it was; nothing is submitted here.
//!
//! An import never guesses silently. Each directive or field is either mapped, or
//! reported as ignored with the reason (a [`Note`]), or refused with the reason (an
//! [`ImportError`], naming its line or field); the workflow that comes out has passed
//! [`meridian_spec::from_value`], so it validates as any document would.

use std::fmt;

pub mod fuzzfile;
mod gpu;
pub mod sbatch;
mod shell;

pub use meridian_spec::Workflow;

/// The formats an import reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Slurm batch script: a `#!` line and `#SBATCH` directives.
    Sbatch,
    /// A CIQ Fuzzball Fuzzfile (`version: v1`, jobs with `image.uri`).
    Fuzzfile,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Sbatch => "an sbatch script",
            Format::Fuzzfile => "a Fuzzfile",
        })
    }
}

/// Which format `text` is written in, when it is one an import reads; `None` for
/// anything else (a v1 workflow among them). A script is an sbatch script when it
/// starts with `#!` and has an `#SBATCH` line; a YAML document is a Fuzzfile when it
/// has Fuzzball's shape: no `name`, and jobs or services whose `image` is a mapping
/// (`image: {uri: …}`), or a top-level `defaults`.
pub fn detect(text: &str) -> Option<Format> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.starts_with("#!") {
        return text
            .lines()
            .any(|line| line.starts_with("#SBATCH"))
            .then_some(Format::Sbatch);
    }
    fuzzfile::looks_like(text).then_some(Format::Fuzzfile)
}

/// Imports `text`, read as `format`; `file` names it in errors and gives a workflow
/// its name when the source has none.
pub fn import(format: Format, text: &str, file: &str) -> Result<Imported, ImportErrors> {
    match format {
        Format::Sbatch => sbatch::import(text, file),
        Format::Fuzzfile => fuzzfile::import(text, file),
    }
}

/// A workflow made from a script, and what the import has to say about it.
#[derive(Debug, Clone)]
pub struct Imported {
    pub workflow: Workflow,
    /// What was ignored, and what works differently than at home, in source order.
    pub notes: Vec<Note>,
}

/// Something the import did not carry over as it was, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The line in the source (1-based), when the note is about one.
    pub line: Option<usize>,
    /// The directive or field, as written (`--partition=gpu`, `jobs.train.policy`).
    pub subject: String,
    pub kind: NoteKind,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// Read and left out: it has no meaning where Meridian runs work.
    Ignored,
    /// Carried over, but it behaves differently, or something better is at hand.
    Warning,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "{line}: ")?;
        }
        let kind = match self.kind {
            NoteKind::Ignored => "ignored",
            NoteKind::Warning => "warning",
        };
        write!(f, "{}: {kind}: {}", self.subject, self.text)
    }
}

/// Why a source cannot be imported: its line (when it has one), the directive or field,
/// and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ImportError {
    pub line: Option<usize>,
    pub subject: String,
    pub message: String,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "{line}: ")?;
        }
        if self.subject.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.subject, self.message)
        }
    }
}

/// Every problem an import found; nothing is imported when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} problem(s), the first: {}", .0.len(), .0[0])]
pub struct ImportErrors(pub Vec<ImportError>);

/// Checks the workflow an import built as any submitted document is checked, so an
/// import never hands on what `meridian validate` would refuse.
fn validated(workflow: &Workflow) -> Result<Workflow, ImportErrors> {
    let value = serde_json::to_value(workflow).expect("a workflow serializes");
    meridian_spec::from_value(&value).map_err(|errors| {
        ImportErrors(
            errors
                .errors
                .iter()
                .map(|e| ImportError {
                    line: None,
                    subject: e.path.clone(),
                    message: format!("the imported workflow does not validate: {}", e.message),
                })
                .collect(),
        )
    })
}

/// A name the spec takes (`^[A-Za-z0-9_-]{1,63}$` for jobs, `.` too for workflows) made
/// from `raw`: other characters become `-`, and it is cut to 63.
fn spec_name(raw: &str, allow_dot: bool) -> String {
    let name: String = raw
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            '.' if allow_dot => c,
            _ => '-',
        })
        .take(63)
        .collect();
    if name.is_empty() {
        "imported".to_string()
    } else {
        name
    }
}

/// The file's name without its directory and last extension.
fn file_stem(file: &str) -> &str {
    let base = file.rsplit('/').next().unwrap_or(file);
    match base.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem,
        _ => base,
    }
}
