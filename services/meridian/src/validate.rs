//! `meridian validate` and `meridian schema`: checking documents without a server.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use crate::Output;

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

pub fn validate(files: &[PathBuf], output: Output) -> ExitCode {
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
        Output::Table => {
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
