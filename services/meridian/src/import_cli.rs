//! `meridian import` and what `meridian submit` does with a script that is not a
//! workflow: sbatch scripts and Fuzzfiles, turned into v1 workflows by
//! `meridian-import`, with what was not carried over said on standard error.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use meridian_import::{Format, Imported};

#[derive(Subcommand)]
pub enum ImportCommand {
    /// Print the workflow an sbatch script becomes.
    ///
    /// Every #SBATCH directive is mapped, or reported as ignored (with why) on standard
    /// error, or refused with its line, and then nothing is printed; docs/import.md has
    /// the table. `meridian submit SCRIPT` imports the same way before it submits.
    Sbatch {
        /// The script; `-` reads standard input.
        script: std::path::PathBuf,
        #[arg(long, short, value_enum, default_value_t = Printed::Yaml)]
        output: Printed,
    },
    /// Print the workflow a CIQ Fuzzball Fuzzfile (version: v1) becomes.
    ///
    /// What has no equivalent is reported on standard error, naming its field; what
    /// cannot be imported is refused, and then nothing is printed.
    Fuzzfile {
        /// The Fuzzfile; `-` reads standard input.
        file: std::path::PathBuf,
        #[arg(long, short, value_enum, default_value_t = Printed::Yaml)]
        output: Printed,
    },
}

/// How an imported workflow is printed.
#[derive(Clone, Copy, ValueEnum)]
pub enum Printed {
    Yaml,
    Json,
}

fn read(path: &Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Imports `text` (from `file`) as `format`, printing the notes on standard error, or
/// every error with its line or field.
pub fn imported(format: Format, text: &str, file: &Path) -> anyhow::Result<Imported> {
    let name = file.display().to_string();
    match meridian_import::import(format, text, &name) {
        Ok(imported) => {
            for note in &imported.notes {
                eprintln!("{}", located(&name, note.line, note));
            }
            Ok(imported)
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}", located(&name, e.line, e));
            }
            anyhow::bail!("{name} cannot be imported as {format}; nothing was submitted")
        }
    }
}

/// `file:LINE: what` for a line, `file: what` without one.
fn located(file: &str, line: Option<usize>, what: &dyn std::fmt::Display) -> String {
    match line {
        Some(_) => format!("{file}:{what}"),
        None => format!("{file}: {what}"),
    }
}

pub fn run(command: ImportCommand) -> ExitCode {
    let (format, path, output) = match command {
        ImportCommand::Sbatch { script, output } => (Format::Sbatch, script, output),
        ImportCommand::Fuzzfile { file, output } => (Format::Fuzzfile, file, output),
    };
    let result = read(&path).and_then(|text| imported(format, &text, &path));
    match result {
        Ok(imported) => {
            match output {
                Printed::Yaml => print!(
                    "{}",
                    serde_saphyr::to_string(&imported.workflow).expect("a workflow prints")
                ),
                Printed::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&imported.workflow).expect("a workflow prints")
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The document `meridian submit` sends for `text`: a workflow as it is; an sbatch
/// script or a Fuzzfile imported, saying so.
pub fn submitted(text: String, file: &Path) -> anyhow::Result<String> {
    let Some(format) = meridian_import::detect(&text) else {
        return Ok(text);
    };
    let imported = imported(format, &text, file)?;
    let verb = match format {
        Format::Sbatch => "sbatch",
        Format::Fuzzfile => "fuzzfile",
    };
    eprintln!(
        "{}: {format}, imported (meridian import {verb} {} prints the workflow)",
        file.display(),
        file.display()
    );
    Ok(serde_json::to_string(&imported.workflow).expect("a workflow serializes"))
}
