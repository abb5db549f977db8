//! `meridian`: the one binary. Today it validates workflow documents and prints the
//! workflow JSON Schema; the servers and the rest of the CLI grow here.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: submit a workflow once; run it on the best site; get one exact bill.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow documents (YAML or JSON, `version: v1`) without submitting them.
    ///
    /// Prints every error with its field path. Exits 0 when every file is valid, 1 when
    /// any is not, 2 when a file cannot be read.
    Validate {
        /// Files to check; `-` reads standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Print a JSON Schema Meridian generates from its own types.
    Schema {
        #[arg(value_enum, default_value_t = SchemaKind::Workflow)]
        kind: SchemaKind,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    /// One line per error, for people.
    Text,
    /// A JSON array with one object per file, for programs.
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum SchemaKind {
    /// The workflow spec v1.
    Workflow,
}

#[derive(Serialize)]
struct FileReport {
    file: String,
    valid: bool,
    /// Set when the file could not be read at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
    errors: Vec<meridian_spec::FieldError>,
}

fn read(path: &PathBuf) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
        return Ok(text);
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

fn validate(files: &[PathBuf], output: Output) -> ExitCode {
    let reports: Vec<FileReport> = files
        .iter()
        .map(|path| {
            let file = if path.as_os_str() == "-" {
                "<stdin>".to_string()
            } else {
                path.display().to_string()
            };
            match read(path) {
                Err(e) => FileReport {
                    file,
                    valid: false,
                    unreadable: Some(format!("{e:#}")),
                    errors: Vec::new(),
                },
                Ok(text) => match meridian_spec::parse(&text) {
                    Ok(_) => FileReport {
                        file,
                        valid: true,
                        unreadable: None,
                        errors: Vec::new(),
                    },
                    Err(e) => FileReport {
                        file,
                        valid: false,
                        unreadable: None,
                        errors: e.errors,
                    },
                },
            }
        })
        .collect();

    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("reports serialize")
        ),
        Output::Text => {
            for r in &reports {
                if let Some(why) = &r.unreadable {
                    eprintln!("{}: {why}", r.file);
                } else if r.valid {
                    println!("{}: ok", r.file);
                } else {
                    for e in &r.errors {
                        println!("{}: {e}", r.file);
                    }
                }
            }
            let bad = reports.iter().filter(|r| !r.valid).count();
            if reports.len() > 1 || bad > 0 {
                let errors: usize = reports.iter().map(|r| r.errors.len()).sum();
                eprintln!(
                    "{} of {} file(s) valid; {errors} error(s)",
                    reports.len() - bad,
                    reports.len()
                );
            }
        }
    }
    if reports.iter().any(|r| r.unreadable.is_some()) {
        ExitCode::from(2)
    } else if reports.iter().any(|r| !r.valid) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { files, output } => validate(&files, output),
        Command::Schema { kind } => {
            let schema = match kind {
                SchemaKind::Workflow => meridian_spec::json_schema(),
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).expect("schema serializes")
            );
            ExitCode::SUCCESS
        }
    }
}
