//! Slurm batch scripts: the `#SBATCH` directives become one job's resources, array and
//! environment; the script's body becomes its command, run by the script's own
//! interpreter after a short prelude that sets the `SLURM_*` variables scripts read
//! from Meridian's (where Slurm does not set them itself).
//!
//! Every option sbatch documents is in [`OPTIONS`]: mapped, ignored with its reason, or
//! refused with its reason. `docs/import.md` is checked against that table.

use std::collections::BTreeMap;

use meridian_spec::{
    GpuVendor, Gpus, Image, Job, Placement, Resources, Size, SlurmOptions, SpecVersion, TaskArray,
    Walltime, Workflow,
};

use crate::gpu::gpu_type;
use crate::shell::words;
use crate::{file_stem, spec_name, validated, ImportError, ImportErrors, Imported, Note, NoteKind};
use meridian_adapter_core::batch::shell_quote;

/// What an option takes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    Nothing,
    Value,
    /// `--opt` or `--opt=value`, never `--opt value`.
    Optional,
}

/// What the import does with an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Carried into the workflow (`docs/import.md` says where).
    Mapped,
    /// Read and left out, with the reason, reported as a note.
    Ignored(&'static str),
    /// The script is not imported, with the reason.
    Refused(&'static str),
}

/// One sbatch option.
#[derive(Debug, Clone, Copy)]
pub struct SbatchOption {
    pub long: &'static str,
    pub short: Option<char>,
    pub takes: Takes,
    pub treatment: Treatment,
}

const fn opt(
    long: &'static str,
    short: Option<char>,
    takes: Takes,
    treatment: Treatment,
) -> SbatchOption {
    SbatchOption {
        long,
        short,
        takes,
        treatment,
    }
}

use Takes::{Nothing, Optional, Value};
use Treatment::{Ignored, Mapped, Refused};

const PLACEMENT: &str = "Meridian places the work by cost, data and accelerators; a Slurm site's own settings choose this at the site";
const NODE_CHOICE: &str =
    "Meridian chooses the site; which nodes run the work is the site's choice";
const TUNING: &str =
    "a node-level tuning of Slurm's; Meridian's sites do not take it, so it is dropped";
const SBATCH_OUTPUT: &str =
    "changes what sbatch prints when it submits; meridian submit prints its own";
const MAIL: &str =
    "Meridian sends no mail; follow the work with meridian submit --wait or meridian status";
const OUTPUT_FILES: &str =
    "Meridian keeps each task's stdout and stderr itself: read them with meridian logs";
const ONE_SCRIPT: &str = "meridian import takes one script: write the jobs it depends on into one workflow and join them with `requires`";

/// Every option of sbatch's manual page (Slurm 22.05 to 25.11, and the aliases sbatch
/// still takes), with what the import does with it.
pub const OPTIONS: &[SbatchOption] = &[
    opt("account", Some('A'), Value, Ignored("Meridian bills the workflow's tenant; a Slurm site charges the account in its own config")),
    opt("acctg-freq", None, Value, Ignored(TUNING)),
    opt("array", Some('a'), Value, Mapped),
    opt("batch", None, Value, Ignored(NODE_CHOICE)),
    opt("bb", None, Value, Refused("burst buffers are not something Meridian's sites provide; declare a volume instead")),
    opt("bbf", None, Value, Refused("burst buffers are not something Meridian's sites provide; declare a volume instead")),
    opt("begin", Some('b'), Value, Refused("Meridian starts work once it is placed; submit the workflow when it should start")),
    opt("chdir", Some('D'), Value, Mapped),
    opt("cluster-constraint", None, Value, Ignored(PLACEMENT)),
    opt("cluster", None, Value, Ignored(PLACEMENT)),
    opt("clusters", Some('M'), Value, Ignored(PLACEMENT)),
    opt("comment", None, Value, Mapped),
    opt("consolidate-segments", None, Nothing, Ignored(TUNING)),
    opt("constraint", Some('C'), Value, Ignored("node features have no equivalent across sites; ask for GPUs by model with --gres or --gpus")),
    opt("container", None, Value, Refused("an OCI bundle path is local to one cluster; give the job an image in the workflow instead")),
    opt("container-id", None, Value, Refused("an OCI bundle path is local to one cluster; give the job an image in the workflow instead")),
    opt("contiguous", None, Nothing, Ignored(NODE_CHOICE)),
    opt("core-spec", Some('S'), Value, Ignored(TUNING)),
    opt("cores-per-socket", None, Value, Ignored(TUNING)),
    opt("cpu-freq", None, Value, Ignored(TUNING)),
    opt("cpus-per-gpu", None, Value, Mapped),
    opt("cpus-per-task", Some('c'), Value, Mapped),
    opt("deadline", None, Value, Refused("Meridian has no deadline for work; the walltime (--time) bounds each task")),
    opt("delay-boot", None, Value, Ignored(TUNING)),
    opt("dependency", Some('d'), Value, Refused(ONE_SCRIPT)),
    opt("distribution", Some('m'), Value, Ignored(TUNING)),
    opt("error", Some('e'), Value, Mapped),
    opt("exclude", Some('x'), Value, Ignored(NODE_CHOICE)),
    opt("exclusive", None, Optional, Ignored("Meridian asks for the CPUs, memory and GPUs the job names; ask for a whole node's worth to have one")),
    opt("export", None, Value, Mapped),
    opt("export-file", None, Value, Refused("the file is on the submitting machine; put the variables in the job's env")),
    opt("extra", None, Value, Ignored(NODE_CHOICE)),
    opt("extra-node-info", Some('B'), Value, Ignored(TUNING)),
    opt("get-user-env", None, Optional, Ignored("the submitting user's login environment does not exist at a remote site; put what the job needs in its env")),
    opt("gid", None, Value, Refused("Meridian runs work as each site's own user; it cannot take another group")),
    opt("gpu-bind", None, Value, Ignored(TUNING)),
    opt("gpu-freq", None, Value, Ignored(TUNING)),
    opt("gpus", Some('G'), Value, Mapped),
    opt("gpus-per-node", None, Value, Mapped),
    opt("gpus-per-socket", None, Value, Refused("GPUs per socket cannot be asked for at every site; use --gpus-per-node")),
    opt("gpus-per-task", None, Value, Mapped),
    opt("gres", None, Value, Mapped),
    opt("gres-flags", None, Value, Ignored(TUNING)),
    opt("help", Some('h'), Nothing, Ignored(SBATCH_OUTPUT)),
    opt("hint", None, Value, Ignored(TUNING)),
    opt("hold", Some('H'), Nothing, Refused("a held job never starts by itself; submit the workflow when it should run")),
    opt("ignore-pbs", None, Nothing, Ignored("#PBS lines are never read by the import")),
    opt("input", Some('i'), Value, Refused("standard input from a file on the submitting machine cannot reach a remote site; read the file in the script")),
    opt("job-name", Some('J'), Value, Mapped),
    opt("kill-on-invalid-dep", None, Value, Refused(ONE_SCRIPT)),
    opt("licenses", Some('L'), Value, Ignored("licences are a cluster's own; a Slurm site may set them in its config")),
    opt("mail-type", None, Value, Ignored(MAIL)),
    opt("mail-user", None, Value, Ignored(MAIL)),
    opt("mcs-label", None, Value, Ignored(TUNING)),
    opt("mem", None, Value, Mapped),
    opt("mem-bind", None, Value, Ignored(TUNING)),
    opt("mem-per-cpu", None, Value, Mapped),
    opt("mem-per-gpu", None, Value, Mapped),
    opt("mincpus", None, Value, Mapped),
    opt("network", None, Value, Ignored(TUNING)),
    opt("nice", None, Optional, Ignored("priority among a tenant's work is not settable per job")),
    opt("no-kill", Some('k'), Optional, Ignored("a node failure is a site fault in Meridian: the work is placed again")),
    opt("no-requeue", None, Nothing, Ignored("Meridian places work again after a site fault whatever the script says")),
    opt("nodefile", Some('F'), Value, Ignored(NODE_CHOICE)),
    opt("nodelist", Some('w'), Value, Ignored(NODE_CHOICE)),
    opt("nodes", Some('N'), Value, Mapped),
    opt("ntasks", Some('n'), Value, Mapped),
    opt("ntasks-per-core", None, Value, Ignored(TUNING)),
    opt("ntasks-per-gpu", None, Value, Mapped),
    opt("ntasks-per-node", None, Value, Mapped),
    opt("ntasks-per-tres", None, Value, Refused("tasks per trackable resource are Slurm's own; ask with --ntasks-per-gpu")),
    opt("ntasks-per-socket", None, Value, Ignored(TUNING)),
    opt("oom-kill-step", None, Optional, Ignored(TUNING)),
    opt("open-mode", None, Value, Ignored(OUTPUT_FILES)),
    opt("output", Some('o'), Value, Mapped),
    opt("overcommit", Some('O'), Nothing, Ignored(TUNING)),
    opt("oversubscribe", Some('s'), Nothing, Ignored(NODE_CHOICE)),
    opt("parsable", None, Nothing, Ignored(SBATCH_OUTPUT)),
    opt("partition", Some('p'), Value, Mapped),
    opt("power", None, Value, Ignored(TUNING)),
    opt("prefer", None, Value, Ignored("node features have no equivalent across sites; ask for GPUs by model with --gres or --gpus")),
    opt("priority", None, Value, Ignored("priority among a tenant's work is not settable per job")),
    opt("profile", None, Value, Ignored(TUNING)),
    opt("propagate", None, Optional, Ignored("resource limits of the submitting shell do not exist at a remote site")),
    opt("qos", Some('q'), Value, Mapped),
    opt("quiet", Some('Q'), Nothing, Ignored(SBATCH_OUTPUT)),
    opt("reboot", None, Nothing, Ignored(NODE_CHOICE)),
    opt("requeue", None, Optional, Ignored("Meridian places work again after a site fault whatever the script says")),
    opt("resources", None, Value, Refused("hierarchical resources are a cluster's own; ask for CPUs, memory and GPUs")),
    opt("reservation", None, Value, Ignored(PLACEMENT)),
    opt("resv-ports", None, Optional, Ignored(TUNING)),
    opt("segment", None, Value, Ignored(TUNING)),
    opt("signal", None, Value, Ignored("Meridian ends a task at its walltime without an early signal")),
    opt("sockets-per-node", None, Value, Ignored(TUNING)),
    opt("spread-segments", None, Nothing, Ignored(TUNING)),
    opt("spread-job", None, Nothing, Ignored(NODE_CHOICE)),
    opt("stepmgr", None, Nothing, Ignored(TUNING)),
    opt("tasks-per-node", None, Value, Mapped),
    opt("switches", None, Value, Ignored(NODE_CHOICE)),
    opt("test-only", None, Nothing, Refused("nothing would run; use meridian quote to see where it would run and at what price")),
    opt("thread-spec", None, Value, Ignored(TUNING)),
    opt("threads-per-core", None, Value, Ignored(TUNING)),
    opt("time", Some('t'), Value, Mapped),
    opt("time-min", None, Value, Ignored("Meridian gives each task its whole walltime (--time)")),
    opt("tmp", None, Value, Ignored("scratch space is the site's; declare a volume of the size needed instead")),
    opt("tres-bind", None, Value, Ignored(TUNING)),
    opt("tres-per-task", None, Value, Refused("trackable resources per task are Slurm's own; ask with --cpus-per-task and --gpus-per-task")),
    opt("uid", None, Value, Refused("Meridian runs work as each site's own user; it cannot take another user")),
    opt("usage", None, Nothing, Ignored(SBATCH_OUTPUT)),
    opt("use-min-nodes", None, Nothing, Ignored(NODE_CHOICE)),
    opt("verbose", Some('v'), Nothing, Ignored(SBATCH_OUTPUT)),
    opt("version", Some('V'), Nothing, Ignored(SBATCH_OUTPUT)),
    opt("wait", Some('W'), Nothing, Ignored("use meridian submit --wait")),
    opt("wait-all-nodes", None, Value, Ignored(TUNING)),
    opt("wckey", None, Value, Ignored("Meridian bills the workflow's tenant; a Slurm site charges the account in its own config")),
    opt("wrap", None, Value, Refused("--wrap replaces the script; in a script it has nothing to wrap")),
];

/// One option as a directive wrote it.
#[derive(Debug, Clone)]
struct Given {
    line: usize,
    /// As written, for messages: `--gres=gpu:a10o:2`, `-t 10`.
    written: String,
    option: &'static SbatchOption,
    value: Option<String>,
}

/// Finds a long option by its name or an unambiguous prefix of it, as sbatch does.
fn long_option(name: &str) -> Result<&'static SbatchOption, String> {
    if let Some(o) = OPTIONS.iter().find(|o| o.long == name) {
        return Ok(o);
    }
    let matches: Vec<_> = OPTIONS
        .iter()
        .filter(|o| o.long.starts_with(name))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("--{name} is not an sbatch option")),
        many => Err(format!(
            "--{name} is ambiguous: it may be {}",
            many.iter()
                .map(|o| format!("--{}", o.long))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The value of `option`, written as `word` with nothing attached: the next word when
/// the option needs one (and the two as written), else none.
fn following(
    option: &SbatchOption,
    word: &str,
    words: &mut impl Iterator<Item = String>,
) -> Result<(Option<String>, String), String> {
    match option.takes {
        Nothing | Optional => Ok((None, word.to_string())),
        Value => {
            let value = words
                .next()
                .ok_or_else(|| format!("{word} needs a value"))?;
            let written = format!("{word} {value}");
            Ok((Some(value), written))
        }
    }
}

/// The options on one `#SBATCH` line.
fn directive(line: usize, rest: &str) -> Result<Vec<Given>, ImportError> {
    let error = |subject: &str, message: String| ImportError {
        line: Some(line),
        subject: subject.to_string(),
        message,
    };
    let words = words(rest).map_err(|e| error(rest.trim(), e))?;
    let mut given = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        // The option, how it is named in messages, and a value written onto it.
        let (option, named, attached) = if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            if name.is_empty() {
                return Err(error(&word, "expected an option name after --".into()));
            }
            let option = long_option(name).map_err(|e| error(&word, e))?;
            (option, format!("--{}", option.long), inline)
        } else if let Some(short) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            let letter = short.chars().next().expect("not empty");
            let option = OPTIONS
                .iter()
                .find(|o| o.short == Some(letter))
                .ok_or_else(|| error(&word, format!("-{letter} is not an sbatch option")))?;
            let attached = &short[letter.len_utf8()..];
            (
                option,
                format!("-{letter}"),
                (!attached.is_empty()).then(|| attached.to_string()),
            )
        } else {
            return Err(error(
                &word,
                "expected an option such as --time=1:00:00 after #SBATCH".into(),
            ));
        };
        let (value, written) = match (option.takes, attached) {
            (Nothing, Some(_)) => return Err(error(&word, format!("{named} takes no value"))),
            (_, Some(value)) => (Some(value), word.clone()),
            (_, None) => {
                following(option, &word, &mut words).map_err(|message| error(&word, message))?
            }
        };
        given.push(Given {
            line,
            written,
            option,
            value,
        });
    }
    Ok(given)
}

/// A script split into its parts.
struct Script<'a> {
    /// The interpreter line's words (`/bin/bash`, or `/usr/bin/env`, `python3`).
    interpreter: Vec<String>,
    /// The directives in the order given.
    given: Vec<Given>,
    /// Everything after the interpreter line, with `#SBATCH` lines as they were.
    body: String,
    /// `#SBATCH` lines after the first command, which sbatch does not read.
    late: Vec<(usize, &'a str)>,
    /// Whether lines end in CR LF.
    crlf: bool,
    /// Directives that could not be read; reported with the rest.
    errors: Vec<ImportError>,
}

fn split(text: &str) -> Result<Script<'_>, Vec<ImportError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let first = lines.first().copied().unwrap_or_default();
    let Some(interpreter) = first.strip_prefix("#!") else {
        return Err(vec![ImportError {
            line: Some(1),
            subject: String::new(),
            message: "a batch script starts with #! and its interpreter, such as #!/bin/bash"
                .into(),
        }]);
    };
    let interpreter: Vec<String> = interpreter.split_whitespace().map(String::from).collect();
    if interpreter.is_empty() {
        return Err(vec![ImportError {
            line: Some(1),
            subject: "#!".into(),
            message: "no interpreter follows #!".into(),
        }]);
    }
    let mut given = Vec::new();
    let mut errors = Vec::new();
    let mut late = Vec::new();
    let mut in_header = true;
    for (index, line) in lines.iter().enumerate().skip(1) {
        let number = index + 1;
        // As sbatch reads them: `#SBATCH` in the first column, up to the first command.
        if let Some(rest) = line.strip_prefix("#SBATCH") {
            if !in_header {
                late.push((number, *line));
                continue;
            }
            if matches!(rest.trim(), "hetjob" | "packjob") {
                errors.push(ImportError {
                    line: Some(number),
                    subject: line.to_string(),
                    message: "heterogeneous jobs are not supported: write each component as a job of one workflow".into(),
                });
                continue;
            }
            match directive(number, rest) {
                Ok(mut options) => given.append(&mut options),
                Err(e) => errors.push(e),
            }
        } else {
            let trimmed = line.trim_start();
            if !(trimmed.is_empty() || trimmed.starts_with('#')) {
                in_header = false;
            }
        }
    }
    let body = lines[1..].join("\n");
    Ok(Script {
        interpreter,
        given,
        body,
        late,
        crlf: text.contains("\r\n"),
        errors,
    })
}

/// What the directives ask for, before it becomes a job.
#[derive(Default)]
struct Asked {
    job_name: Option<String>,
    array: Option<Indices>,
    array_given: Option<Given>,
    time: Option<u64>,
    nodes: Option<u32>,
    ntasks: Option<u32>,
    ntasks_per_node: Option<u32>,
    ntasks_per_gpu: Option<(u32, Given)>,
    cpus_per_task: Option<u32>,
    cpus_per_gpu: Option<(u32, Given)>,
    mincpus: Option<u32>,
    /// MiB.
    mem: Option<(u64, Given)>,
    mem_per_cpu: Option<(u64, Given)>,
    mem_per_gpu: Option<(u64, Given)>,
    /// How the GPUs were asked for, and the type.
    gpus: Vec<(GpuAsk, Given)>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    comment: Option<String>,
    partition: Option<String>,
    qos: Option<String>,
}

#[derive(Debug, Clone)]
/// GPUs as a directive counts them: per node, for the whole job, or per task; with
/// their type when named.
enum GpuAsk {
    Node(u32, Option<String>),
    Job(u32, Option<String>),
    Task(u32, Option<String>),
}

/// The array's indices, ascending, and its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Indices {
    indices: Vec<u32>,
    cap: Option<u32>,
}

/// Imports an sbatch script; `file` names the workflow when no `--job-name` does.
pub fn import(text: &str, file: &str) -> Result<Imported, ImportErrors> {
    let mut script = split(text).map_err(ImportErrors)?;
    let mut notes = Vec::new();
    let mut errors = std::mem::take(&mut script.errors);
    let mut asked = Asked::default();
    if script.crlf {
        notes.push(Note {
            line: None,
            subject: "line endings".into(),
            kind: NoteKind::Warning,
            text: "the script has Windows line endings (CR LF), which sbatch refuses; the job runs it with plain LF".into(),
        });
    }
    for (line, text) in &script.late {
        notes.push(Note {
            line: Some(*line),
            subject: text.trim().to_string(),
            kind: NoteKind::Ignored,
            text: "after the script's first command: sbatch does not read it either".into(),
        });
    }
    for given in &script.given {
        match given.option.treatment {
            Ignored(why) => notes.push(Note {
                line: Some(given.line),
                subject: given.written.clone(),
                kind: NoteKind::Ignored,
                text: why.into(),
            }),
            Refused(why) => errors.push(ImportError {
                line: Some(given.line),
                subject: given.written.clone(),
                message: why.into(),
            }),
            Mapped => {
                if let Err(message) = apply(&mut asked, &mut notes, given) {
                    errors.push(ImportError {
                        line: Some(given.line),
                        subject: given.written.clone(),
                        message,
                    });
                }
            }
        }
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.line);
        return Err(ImportErrors(errors));
    }
    let workflow = build(&script, asked, file, &mut notes).map_err(ImportErrors)?;
    Ok(Imported {
        workflow: validated(&workflow)?,
        notes,
    })
}

fn count(value: &str, what: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "expected {what}, a whole number of at least 1; got {value:?}"
        )),
    }
}

fn apply(asked: &mut Asked, notes: &mut Vec<Note>, given: &Given) -> Result<(), String> {
    let value = given.value.as_deref().unwrap_or_default();
    let note = |notes: &mut Vec<Note>, kind, text: String| {
        notes.push(Note {
            line: Some(given.line),
            subject: given.written.clone(),
            kind,
            text,
        })
    };
    match given.option.long {
        "job-name" => asked.job_name = Some(value.to_string()),
        "array" => {
            asked.array = Some(array(value)?);
            asked.array_given = Some(given.clone());
        }
        "time" => asked.time = Some(time(value)?),
        "nodes" => {
            let (min, max) = value.split_once('-').unwrap_or((value, value));
            let min = count(min, "a number of nodes")?;
            if max != value.split_once('-').map_or(value, |(m, _)| m) {
                let max = count(max, "a number of nodes")?;
                if max < min {
                    return Err(format!("the range {min}-{max} ends before it starts"));
                }
                note(
                    notes,
                    NoteKind::Warning,
                    format!(
                        "Meridian asks for a fixed number of nodes: {min}, the least of the range"
                    ),
                );
            }
            asked.nodes = Some(min);
        }
        "ntasks" => asked.ntasks = Some(count(value, "a number of tasks")?),
        "ntasks-per-node" | "tasks-per-node" => {
            asked.ntasks_per_node = Some(count(value, "tasks per node")?)
        }
        "ntasks-per-gpu" => {
            asked.ntasks_per_gpu = Some((count(value, "tasks per GPU")?, given.clone()))
        }
        "cpus-per-task" => asked.cpus_per_task = Some(count(value, "CPUs per task")?),
        "cpus-per-gpu" => asked.cpus_per_gpu = Some((count(value, "CPUs per GPU")?, given.clone())),
        "mincpus" => asked.mincpus = Some(count(value, "CPUs per node")?),
        "mem" => asked.mem = Some((megabytes(value)?, given.clone())),
        "mem-per-cpu" => asked.mem_per_cpu = Some((megabytes(value)?, given.clone())),
        "mem-per-gpu" => asked.mem_per_gpu = Some((megabytes(value)?, given.clone())),
        "gres" => {
            if let Some(ask) = gres(value)? {
                asked.gpus.push((ask, given.clone()));
            }
            for other in value.split(',').filter(|g| !is_gpu_gres(g) && *g != "none") {
                note(
                    notes,
                    NoteKind::Ignored,
                    format!("the generic resource {other:?} is a cluster's own; only GPUs are carried over"),
                );
            }
        }
        "gpus" => {
            let (n, kind) = gpus(value)?;
            asked.gpus.push((GpuAsk::Job(n, kind), given.clone()));
        }
        "gpus-per-node" => {
            let (n, kind) = gpus(value)?;
            asked.gpus.push((GpuAsk::Node(n, kind), given.clone()));
        }
        "gpus-per-task" => {
            let (n, kind) = gpus(value)?;
            asked.gpus.push((GpuAsk::Task(n, kind), given.clone()));
        }
        "output" | "error" => {
            file_pattern(value)?;
            note(notes, NoteKind::Ignored, OUTPUT_FILES.into());
        }
        "export" => export(asked, notes, given, value)?,
        "chdir" => {
            if !value.starts_with('/') {
                return Err(format!(
                    "expected an absolute path; {value:?} is relative to the submitting directory, which a remote site does not have"
                ));
            }
            asked.cwd = Some(value.to_string());
        }
        "comment" => asked.comment = Some(value.to_string()),
        "partition" | "qos" => {
            if value.contains(',') {
                note(
                    notes,
                    NoteKind::Warning,
                    "Slurm tries each listed in turn; the job asks for the first".into(),
                );
            }
            let first = value.split(',').next().unwrap_or_default().to_string();
            note(
                notes,
                NoteKind::Warning,
                "kept for Slurm sites (jobs.NAME.slurm); placement does not choose by it and other sites ignore it".into(),
            );
            if given.option.long == "partition" {
                asked.partition = Some(first);
            } else {
                asked.qos = Some(first);
            }
        }
        other => unreachable!("--{other} is marked mapped but has no mapping"),
    }
    Ok(())
}

/// `--time`: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`, in seconds.
fn time(value: &str) -> Result<u64, String> {
    let expected = || {
        format!(
            "expected a time limit as minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; got {value:?}"
        )
    };
    let too_long = || format!("{value:?} is longer than Meridian counts");
    if matches!(
        value.to_ascii_lowercase().as_str(),
        "unlimited" | "infinite" | "-1"
    ) {
        return Err(format!(
            "{value:?} is no limit; Meridian needs a walltime to place and price the work"
        ));
    }
    let number = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(expected());
        }
        s.parse::<u64>().map_err(|_| expected())
    };
    let secs = match value.split_once('-') {
        Some((days, rest)) => {
            let days = number(days)?;
            let parts: Vec<&str> = rest.split(':').collect();
            let (h, m, s) = match parts.as_slice() {
                [h] => (number(h)?, 0, 0),
                [h, m] => (number(h)?, number(m)?, 0),
                [h, m, s] => (number(h)?, number(m)?, number(s)?),
                _ => return Err(expected()),
            };
            days.checked_mul(86_400)
                .and_then(|d| h.checked_mul(3_600).and_then(|h| d.checked_add(h)))
                .and_then(|t| m.checked_mul(60).and_then(|m| t.checked_add(m)))
                .and_then(|t| t.checked_add(s))
                .ok_or_else(too_long)?
        }
        None => {
            let parts: Vec<&str> = value.split(':').collect();
            let (h, m, s) = match parts.as_slice() {
                [m] => (0, number(m)?, 0),
                [m, s] => (0, number(m)?, number(s)?),
                [h, m, s] => (number(h)?, number(m)?, number(s)?),
                _ => return Err(expected()),
            };
            h.checked_mul(3_600)
                .and_then(|t| m.checked_mul(60).and_then(|m| t.checked_add(m)))
                .and_then(|t| t.checked_add(s))
                .ok_or_else(too_long)?
        }
    };
    if secs == 0 {
        return Err(format!(
            "{value:?} is no limit to Slurm; Meridian needs a walltime to place and price the work"
        ));
    }
    Ok(secs)
}

/// `--mem` and its kin: a whole number with `K`, `M` (the default), `G` or `T`, a `B`
/// after it or not, in MiB (rounded up, as Slurm does).
fn megabytes(value: &str) -> Result<u64, String> {
    let expected = || {
        format!("expected an amount such as 4G or 500M (K, M, G or T, B after it or not; M when none); got {value:?}")
    };
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => value.split_at(at),
        None => (value, "M"),
    };
    let n: u64 = digits.parse().map_err(|_| expected())?;
    let unit = unit.to_ascii_uppercase();
    let unit = unit
        .strip_suffix('B')
        .filter(|u| !u.is_empty())
        .unwrap_or(&unit);
    let multiplier: u64 = match unit {
        "K" => 1,
        "M" => 1 << 10,
        "G" => 1 << 20,
        "T" => 1 << 30,
        _ => return Err(expected()),
    };
    let kib = n
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{value:?} is more memory than Meridian counts"))?;
    if n == 0 {
        return Err(format!(
            "{value:?} asks Slurm for all of a node's memory; Meridian needs an amount to place the work"
        ));
    }
    Ok(kib.div_ceil(1024))
}

/// `--array`: indices (`7`), ranges (`1-10`), ranges with a step (`1-10:3`), comma
/// lists of these, and `%N` for the most at once.
fn array(value: &str) -> Result<Indices, String> {
    let (list, cap) = match value.split_once('%') {
        Some((list, cap)) => (list, Some(count(cap, "the most tasks at once after %")?)),
        None => (value, None),
    };
    let index = |s: &str| -> Result<u32, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "expected indices such as 1-100%10, 0-30:3 or 1,4,9; {s:?} is not an index"
            ));
        }
        s.parse().map_err(|_| format!("the index {s} is too large"))
    };
    let mut indices = Vec::new();
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((range, step)) => (range, count(step, "a step after :")?),
            None => (part, 1),
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (index(a)?, index(b)?),
            None => {
                let i = index(range)?;
                (i, i)
            }
        };
        if last < first {
            return Err(format!("the range {range} ends before it starts"));
        }
        let tasks = u64::from(last - first) / u64::from(step) + 1;
        if indices.len() as u64 + tasks > u64::from(meridian_spec::MAX_ARRAY_TASKS) {
            return Err(format!(
                "more than {} tasks; Meridian's arrays hold at most that many",
                meridian_spec::MAX_ARRAY_TASKS
            ));
        }
        indices.extend((first..=last).step_by(step as usize));
    }
    indices.sort_unstable();
    indices.dedup();
    Ok(Indices { indices, cap })
}

fn is_gpu_gres(gres: &str) -> bool {
    gres == "gpu" || gres.starts_with("gpu:")
}

/// The GPU part of `--gres` (`gpu`, `gpu:2`, `gpu:a100:2`), if any; per node.
fn gres(value: &str) -> Result<Option<GpuAsk>, String> {
    let mut found = None;
    for item in value.split(',') {
        if !is_gpu_gres(item) {
            continue;
        }
        if found.is_some() {
            return Err("GPUs are asked for twice; give one gpu entry".into());
        }
        let parts: Vec<&str> = item.split(':').collect();
        let (kind, n) = match parts.as_slice() {
            ["gpu"] => (None, 1),
            ["gpu", n] if n.bytes().all(|b| b.is_ascii_digit()) => {
                (None, count(n, "a number of GPUs")?)
            }
            ["gpu", kind] => (Some(kind.to_string()), 1),
            ["gpu", kind, n] => (Some(kind.to_string()), count(n, "a number of GPUs")?),
            _ => return Err(format!("expected gpu, gpu:N or gpu:TYPE:N; got {item:?}")),
        };
        if let Some(kind) = &kind {
            gpu_type(kind)?;
        }
        found = Some(GpuAsk::Node(n, kind));
    }
    Ok(found)
}

/// `--gpus` and its kin: `N` or `TYPE:N`.
fn gpus(value: &str) -> Result<(u32, Option<String>), String> {
    if value.contains(',') {
        return Err("GPUs of several types in one job are not supported; ask for one type".into());
    }
    match value.split_once(':') {
        Some((kind, n)) => {
            gpu_type(kind)?;
            Ok((count(n, "a number of GPUs")?, Some(kind.to_string())))
        }
        None => Ok((count(value, "a number of GPUs")?, None)),
    }
}

/// Checks an `--output`/`--error` file name pattern's `%` letters.
fn file_pattern(value: &str) -> Result<(), String> {
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        while chars.peek().is_some_and(char::is_ascii_digit) {
            chars.next();
        }
        match chars.next() {
            Some(
                '%' | 'A' | 'a' | 'b' | 'J' | 'j' | 'N' | 'n' | 'r' | 'S' | 's' | 't' | 'u' | 'x',
            ) => {}
            Some(other) => {
                return Err(format!(
                "%{other} is not a file name pattern (%A %a %b %J %j %N %n %r %S %s %t %u %x %%)"
            ))
            }
            None => return Err("the pattern ends with a lone %".into()),
        }
    }
    Ok(())
}

fn export(
    asked: &mut Asked,
    notes: &mut Vec<Note>,
    given: &Given,
    value: &str,
) -> Result<(), String> {
    for item in value.split(',') {
        match item {
            "ALL" | "NONE" | "NIL" => notes.push(Note {
                line: Some(given.line),
                subject: given.written.clone(),
                kind: NoteKind::Ignored,
                text: format!(
                    "{item}: the submitting shell's environment is never sent to a site; the job has the variables its env names"
                ),
            }),
            _ => match item.split_once('=') {
                Some((name, val)) => {
                    let valid = name
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !valid {
                        return Err(format!("{name:?} is not a variable name"));
                    }
                    asked.env.insert(name.to_string(), val.to_string());
                }
                None => notes.push(Note {
                    line: Some(given.line),
                    subject: given.written.clone(),
                    kind: NoteKind::Ignored,
                    text: format!(
                        "{item}: a variable of the submitting shell is never sent to a site; write {item}=VALUE"
                    ),
                }),
            },
        }
    }
    Ok(())
}

/// The job the directives describe.
fn build(
    script: &Script<'_>,
    asked: Asked,
    file: &str,
    notes: &mut Vec<Note>,
) -> Result<Workflow, Vec<ImportError>> {
    let error = |given: Option<&Given>, message: String| ImportError {
        line: given.map(|g| g.line),
        subject: given.map(|g| g.written.clone()).unwrap_or_default(),
        message,
    };
    let note = |notes: &mut Vec<Note>, kind, subject: &str, text: String| {
        notes.push(Note {
            line: None,
            subject: subject.to_string(),
            kind,
            text,
        })
    };
    let name_source = asked
        .job_name
        .clone()
        .unwrap_or_else(|| file_stem(file).to_string());
    let workflow_name = spec_name(&name_source, true);
    let job_name = spec_name(&name_source, false);
    if job_name != name_source {
        note(
            notes,
            NoteKind::Warning,
            "--job-name",
            format!("{name_source:?} is named {job_name:?} in the workflow: names are letters, digits, - and _, at most 63"),
        );
    }

    // Products of directives, each bounded: a count that does not fit is an error naming
    // the directive that made it too large.
    let times =
        |a: u32, b: u32, given: Option<&Given>, what: &str| -> Result<u32, Vec<ImportError>> {
            a.checked_mul(b).ok_or_else(|| {
                vec![error(
                    given,
                    format!("{a} × {b} {what} is more than Meridian counts"),
                )]
            })
        };

    // GPUs asked for by one option, its last use standing as in sbatch.
    let gpu_asks: Vec<&(GpuAsk, Given)> = {
        let mut last: Vec<&(GpuAsk, Given)> = Vec::new();
        for ask in &asked.gpus {
            last.retain(|(_, g)| g.option.long != ask.1.option.long);
            last.push(ask);
        }
        last
    };
    // Directives that contradict each other, all reported together.
    let mut conflicts = Vec::new();
    if gpu_asks.len() > 1 {
        conflicts.push(error(
            Some(&gpu_asks[1].1),
            format!(
                "GPUs are asked for already ({}); give one of --gres, --gpus, --gpus-per-node, --gpus-per-task",
                gpu_asks[0].1.written
            ),
        ));
    }
    let memory_asks: Vec<&(u64, Given)> = [&asked.mem, &asked.mem_per_cpu, &asked.mem_per_gpu]
        .into_iter()
        .flatten()
        .collect();
    if memory_asks.len() > 1 {
        conflicts.push(error(
            Some(&memory_asks[1].1),
            format!(
                "memory is asked for already ({}); give one of --mem, --mem-per-cpu, --mem-per-gpu",
                memory_asks[0].1.written
            ),
        ));
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let gpu_ask = gpu_asks.first().copied();

    let nodes = match (asked.nodes, asked.ntasks, asked.ntasks_per_node) {
        (Some(n), _, _) => n,
        // As Slurm does: enough nodes for the tasks at the tasks per node asked for.
        (None, Some(tasks), Some(per_node)) => tasks.div_ceil(per_node),
        _ => 1,
    };
    let gpus_asked_per_node = match gpu_ask {
        Some((GpuAsk::Node(n, _), _)) => Some(*n),
        Some((GpuAsk::Job(n, _), given)) => {
            if n % nodes != 0 {
                return Err(vec![error(
                    Some(given),
                    format!(
                        "{n} GPUs do not divide evenly over {nodes} nodes; Meridian asks for GPUs per node"
                    ),
                )]);
            }
            Some(n / nodes)
        }
        _ => None,
    };
    let tasks_per_node = match (asked.ntasks_per_node, asked.ntasks, &asked.ntasks_per_gpu) {
        (Some(n), _, _) => n,
        (None, Some(n), _) => n.div_ceil(nodes),
        (None, None, Some((per_gpu, given))) => {
            let Some(gpus) = gpus_asked_per_node else {
                return Err(vec![error(
                    Some(given),
                    "needs GPUs per node (--gres, --gpus or --gpus-per-node)".into(),
                )]);
            };
            times(*per_gpu, gpus, Some(given), "tasks")?
        }
        (None, None, None) => 1,
    };
    let tasks = match asked.ntasks {
        Some(n) => n,
        None => times(nodes, tasks_per_node, None, "tasks")?,
    };

    let gpus = match gpu_ask {
        None => None,
        Some((ask, given)) => {
            let (per_node, kind) = match ask {
                GpuAsk::Task(n, kind) => (times(*n, tasks_per_node, Some(given), "GPUs")?, kind),
                GpuAsk::Node(_, kind) | GpuAsk::Job(_, kind) => {
                    (gpus_asked_per_node.expect("per node or per job"), kind)
                }
            };
            let (vendor, model, memory) = match kind {
                Some(kind) => {
                    let t = gpu_type(kind).map_err(|e| vec![error(Some(given), e)])?;
                    (t.vendor, Some(t.model), t.memory)
                }
                None => (GpuVendor::Any, None, None),
            };
            Some(Gpus {
                count: per_node,
                vendor,
                model,
                memory,
            })
        }
    };
    let gpus_per_node = gpus.as_ref().map_or(0, |g| g.count);

    let mut cpus = times(
        asked.cpus_per_task.unwrap_or(1),
        tasks_per_node,
        None,
        "CPUs",
    )?;
    if let Some((per_gpu, given)) = &asked.cpus_per_gpu {
        if gpus_per_node == 0 {
            return Err(vec![error(
                Some(given),
                "needs GPUs (--gres or --gpus)".into(),
            )]);
        }
        cpus = cpus.max(times(*per_gpu, gpus_per_node, Some(given), "CPUs")?);
    }
    if let Some(min) = asked.mincpus {
        cpus = cpus.max(min);
    }

    let memory_mib: Option<u64> = if let Some((mib, _)) = &asked.mem {
        Some(*mib)
    } else if let Some((mib, given)) = &asked.mem_per_cpu {
        Some(mib.checked_mul(u64::from(cpus)).ok_or_else(|| {
            vec![error(
                Some(given),
                "times the CPUs is more memory than Meridian counts".into(),
            )]
        })?)
    } else if let Some((mib, given)) = &asked.mem_per_gpu {
        if gpus_per_node == 0 {
            return Err(vec![error(
                Some(given),
                "--mem-per-gpu needs GPUs (--gres or --gpus)".into(),
            )]);
        }
        Some(mib.checked_mul(u64::from(gpus_per_node)).ok_or_else(|| {
            vec![error(
                Some(given),
                "times the GPUs is more memory than Meridian counts".into(),
            )]
        })?)
    } else {
        None
    };
    let memory_bytes = match memory_mib {
        Some(mib) => Some(mib.checked_mul(1 << 20).ok_or_else(|| {
            vec![error(
                None,
                format!("{mib} MiB per node is more memory than Meridian counts"),
            )]
        })?),
        None => None,
    };
    let defaults = Resources::default();
    if memory_mib.is_none() {
        note(
            notes,
            NoteKind::Warning,
            "--mem",
            format!(
                "not given: Meridian asks for its default, {} per node",
                defaults.memory
            ),
        );
    }
    if asked.time.is_none() {
        note(
            notes,
            NoteKind::Warning,
            "--time",
            format!(
                "not given: Meridian gives each task its default walltime, {}",
                defaults.walltime
            ),
        );
    }
    let resources = Resources {
        nodes,
        cpus,
        memory: memory_bytes.map_or(defaults.memory, Size::from_bytes),
        walltime: asked.time.map_or(defaults.walltime, Walltime::from_secs),
        gpus,
    };

    let array = asked.array.as_ref().map(|a| {
        let tasks = a.indices.len() as u32;
        let contiguous = a.indices.last().copied() == Some(a.indices[0] + tasks - 1);
        let parallelism = a.cap.unwrap_or(tasks).min(tasks);
        if contiguous {
            TaskArray {
                start: a.indices[0],
                end: a.indices[0] + tasks - 1,
                parallelism,
            }
        } else {
            TaskArray {
                start: 0,
                end: tasks - 1,
                parallelism,
            }
        }
    });

    let env = asked.env.clone();

    let body_uses = |word: &str| {
        script.body.lines().any(|line| {
            let line = line.trim_start();
            !line.starts_with('#')
                && line
                    .split(|c: char| {
                        c.is_whitespace() || c == ';' || c == '&' || c == '|' || c == '('
                    })
                    .any(|w| w == word)
        })
    };
    let uses_srun = body_uses("srun");
    let modules: Vec<String> = script
        .body
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["module", "load" | "add", names @ ..] | ["ml", names @ ..] => {
                    Some(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                }
                _ => None,
            }
        })
        .flatten()
        .filter(|n| {
            !n.starts_with('-')
                && !matches!(
                    n.as_str(),
                    "purge" | "list" | "avail" | "spider" | "save" | "restore" | "show" | "help"
                )
        })
        .collect();
    if uses_srun {
        note(
            notes,
            NoteKind::Warning,
            "srun",
            "kept: at a Slurm site srun runs in the job's allocation; elsewhere the import's prelude runs srun's command once, without srun's options".into(),
        );
        if nodes > 1 || tasks_per_node > 1 {
            note(
                notes,
                NoteKind::Warning,
                "srun",
                format!(
                    "the job asks for {nodes} node(s) and {tasks_per_node} task(s) per node: outside Slurm an MPI program started by srun runs as one process, and a Meridian Slurm site allocates one task per node with all its CPUs, so give srun -n and -c yourself"
                ),
            );
        }
    }
    if !modules.is_empty() {
        let suggestion = modules
            .iter()
            .find_map(|m| suggested_image(m).map(|image| format!("; for {m}, {image} is one")))
            .unwrap_or_default();
        note(
            notes,
            NoteKind::Warning,
            "module load",
            format!(
                "kept: modules load where a site has them ({}); elsewhere the line is skipped with a message. A container image makes the job portable{suggestion}",
                modules.join(", ")
            ),
        );
    }

    let memory = match (&asked.mem, &asked.mem_per_cpu, &asked.mem_per_gpu) {
        (Some((mib, _)), _, _) => Some(("SLURM_MEM_PER_NODE", *mib)),
        (_, Some((mib, _)), _) => Some(("SLURM_MEM_PER_CPU", *mib)),
        (_, _, Some((mib, _))) => Some(("SLURM_MEM_PER_GPU", *mib)),
        _ => None,
    };
    let prelude = Prelude {
        job_name: &job_name,
        nodes,
        tasks,
        tasks_per_node,
        cpus_per_task: asked.cpus_per_task,
        gpus_per_node,
        memory,
        array: asked.array.as_ref(),
        srun: uses_srun,
        modules: !modules.is_empty(),
    };
    let wrapper =
        wrapper(script, &prelude).map_err(|e| vec![error(asked.array_given.as_ref(), e)])?;
    let mut labels = BTreeMap::new();
    labels.insert("imported-from".to_string(), "sbatch".to_string());
    if let Some(comment) = &asked.comment {
        if comment.chars().count() > 255 {
            note(
                notes,
                NoteKind::Warning,
                "--comment",
                "cut to 255 characters, the most a label holds".into(),
            );
        }
        labels.insert("comment".to_string(), comment.chars().take(255).collect());
    }
    let job = Job {
        requires: Vec::new(),
        image: Image::Host,
        command: vec!["/bin/sh".into(), "-c".into(), wrapper],
        env,
        cwd: asked.cwd.clone(),
        mounts: BTreeMap::new(),
        resources,
        array,
        slurm: (asked.partition.is_some() || asked.qos.is_some()).then(|| SlurmOptions {
            partition: asked.partition.clone(),
            qos: asked.qos.clone(),
        }),
    };
    Ok(Workflow {
        version: SpecVersion::V1,
        name: workflow_name,
        labels,
        placement: Placement::default(),
        volumes: BTreeMap::new(),
        jobs: BTreeMap::from([(job_name, job)]),
        services: BTreeMap::new(),
    })
}

/// Images for software stacks a `module load` commonly names.
fn suggested_image(module: &str) -> Option<&'static str> {
    let name = module
        .split('/')
        .next()
        .unwrap_or(module)
        .to_ascii_lowercase();
    Some(match name.as_str() {
        "pytorch" | "torch" => "docker://pytorch/pytorch",
        "tensorflow" => "docker://tensorflow/tensorflow",
        "cuda" | "cudatoolkit" => "docker://nvidia/cuda:12.4.1-runtime-ubuntu22.04",
        "rocm" => "docker://rocm/dev-ubuntu-22.04",
        "python" | "python3" | "anaconda" | "anaconda3" | "miniconda" | "miniconda3" => {
            "docker://python:3.12"
        }
        "gromacs" => "docker://gromacs/gromacs",
        "julia" => "docker://julia",
        "r" => "docker://r-base",
        "openmpi" => "docker://mpioperator/openmpi",
        _ => return None,
    })
}

/// What the prelude sets up before the script runs.
struct Prelude<'a> {
    job_name: &'a str,
    nodes: u32,
    tasks: u32,
    tasks_per_node: u32,
    cpus_per_task: Option<u32>,
    gpus_per_node: u32,
    /// The variable Slurm sets for the memory asked for, and its MiB.
    memory: Option<(&'static str, u64)>,
    array: Option<&'a Indices>,
    srun: bool,
    modules: bool,
}

/// Most runs of evenly spaced indices an array's prelude maps (Slurm's own default
/// `MaxArraySize` is 1001 indices).
const MAX_ARRAY_RUNS: usize = 1_000;

/// The array's indices as runs of evenly spaced ones: (first index, step, how many).
fn runs(indices: &[u32]) -> Vec<(u32, u32, u32)> {
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    for &index in indices {
        match runs.last_mut() {
            Some((first, step, count)) if *count == 1 => {
                *step = index - *first;
                *count = 2;
            }
            Some((first, step, count))
                if u64::from(*first) + u64::from(*step) * u64::from(*count) == u64::from(index) =>
            {
                *count += 1;
            }
            _ => runs.push((index, 1, 1)),
        }
    }
    runs
}

/// The shell that runs the script: Slurm's variables from Meridian's, an `srun` where the
/// site has none, then the script itself, by its own interpreter, from a temporary file.
fn wrapper(script: &Script<'_>, p: &Prelude<'_>) -> Result<String, String> {
    let mut out = String::from(
        "# Written by meridian import: Slurm's variables from Meridian's where Slurm sets none.\n",
    );
    let mut default = |name: &str, value: &str| {
        out.push_str(&format!(": \"${{{name}:={value}}}\"; export {name}\n"));
    };
    default("SLURM_JOB_ID", "$MERIDIAN_JOB_ID");
    default("SLURM_JOBID", "$SLURM_JOB_ID");
    default("SLURM_JOB_NAME", p.job_name);
    default("SLURM_SUBMIT_DIR", "$PWD");
    default("SLURM_JOB_NUM_NODES", &p.nodes.to_string());
    default("SLURM_NNODES", &p.nodes.to_string());
    default("SLURM_NTASKS", &p.tasks.to_string());
    default("SLURM_NTASKS_PER_NODE", &p.tasks_per_node.to_string());
    if let Some(c) = p.cpus_per_task {
        default("SLURM_CPUS_PER_TASK", &c.to_string());
    }
    if let Some((name, mib)) = p.memory {
        default(name, &mib.to_string());
    }
    if p.gpus_per_node > 0 {
        default("SLURM_GPUS_ON_NODE", &p.gpus_per_node.to_string());
    }
    if let Some(a) = p.array {
        // The script's own indices, whatever numbering the site gave the tasks: Meridian's
        // tasks are the array's indices when they run without gaps, else 0..n-1.
        let tasks = a.indices.len() as u64;
        let first = a.indices[0];
        let last = *a.indices.last().expect("an array has a task");
        default("SLURM_ARRAY_JOB_ID", "$SLURM_JOB_ID");
        let runs = runs(&a.indices);
        let step = if runs.len() == 1 { runs[0].1 } else { 1 };
        if u64::from(last - first) + 1 == tasks {
            out.push_str("SLURM_ARRAY_TASK_ID=$ARRAY_INDEX\n");
        } else if runs.len() > MAX_ARRAY_RUNS {
            return Err(format!(
                "{} runs of indices; Meridian maps at most {MAX_ARRAY_RUNS}: write the indices as ranges",
                runs.len()
            ));
        } else {
            let mut offset: u64 = 0;
            for (i, (first, step, count)) in runs.iter().enumerate() {
                let keyword = if i == 0 { "if" } else { "elif" };
                offset += u64::from(*count);
                out.push_str(&format!(
                    "{keyword} [ \"$ARRAY_INDEX\" -lt {offset} ]; then SLURM_ARRAY_TASK_ID=$(({first} + (ARRAY_INDEX - {}) * {step}))\n",
                    offset - u64::from(*count)
                ));
            }
            out.push_str("fi\n");
        }
        out.push_str(&format!(
            "SLURM_ARRAY_TASK_COUNT={tasks} SLURM_ARRAY_TASK_MIN={first} SLURM_ARRAY_TASK_MAX={last} SLURM_ARRAY_TASK_STEP={step}\n\
             export SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_COUNT SLURM_ARRAY_TASK_MIN SLURM_ARRAY_TASK_MAX SLURM_ARRAY_TASK_STEP\n",
        ));
    }
    let mut cleanup = String::new();
    if p.srun {
        out.push_str(SRUN_SHIM);
        cleanup.push_str("rm -rf \"$meridian_bin\"; ");
    }
    // `module` is a function of the script's own shell, so it is set up there, on the
    // interpreter line the temporary file does not need: the script keeps its line numbers.
    let shell = script
        .interpreter
        .iter()
        .rev()
        .find(|w| !w.starts_with('-'))
        .map(|w| w.rsplit('/').next().unwrap_or(w))
        .is_some_and(|name| matches!(name, "sh" | "bash" | "dash" | "ksh" | "zsh" | "ash"));
    let first_line = if p.modules && shell {
        MODULE_SETUP.to_string()
    } else {
        format!("#!{}", script.interpreter.join(" "))
    };
    out.push_str(&run_file(
        &script.interpreter,
        &format!("{first_line}\n{}", script.body),
        &cleanup,
    ));
    Ok(out)
}

/// Runs `body` by `interpreter` from a temporary file and exits with its status;
/// `cleanup` (shell) runs first.
pub(crate) fn run_file(interpreter: &[String], body: &str, cleanup: &str) -> String {
    let mut delimiter = "MERIDIAN_SCRIPT".to_string();
    while body.lines().any(|l| l.trim() == delimiter) {
        delimiter.push('_');
    }
    let interpreter: Vec<String> = interpreter.iter().map(|w| shell_quote(w)).collect();
    format!(
        "meridian_script=$(mktemp) || exit 1\n\
         cat > \"$meridian_script\" <<'{delimiter}'\n\
         {}\n\
         {delimiter}\n\
         {} \"$meridian_script\" \"$@\"\n\
         meridian_status=$?\n\
         {cleanup}rm -f \"$meridian_script\"\n\
         exit $meridian_status\n",
        body.trim_end_matches('\n'),
        interpreter.join(" "),
    )
}

/// An `srun` for sites without Slurm: drops srun's options and runs the command once.
/// Options without a value are listed; any other option takes the next word when it
/// has no `=`.
const SRUN_SHIM: &str = r#"if ! command -v srun >/dev/null 2>&1; then
meridian_bin=$(mktemp -d) && PATH="$meridian_bin:$PATH" && export PATH
cat > "$meridian_bin/srun" <<'MERIDIAN_SRUN'
#!/bin/sh
# meridian import: no Slurm here, so srun's options are dropped and the command runs once.
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    --*=*|-[!-]?*) shift ;;
    --exclusive|--overlap|--unbuffered|--label|--quiet|--verbose|--pty|--multi-prog|--no-kill|--kill-on-bad-exit|--disable-status|--no-allocate|--preserve-env|--whole|--exact|--overcommit|--oversubscribe|--spread-job|--use-min-nodes|--test-only|--wait-all-nodes|--propagate|--contiguous|--reboot|--immediate|--x11|--send-libs|--external-launcher|-u|-l|-Q|-v|-X|-E|-H|-k|-K|-O|-s|-Z|-I) shift ;;
    -*) shift; [ $# -gt 0 ] && shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "meridian import: srun was given no program to run" >&2; exit 2; }
exec "$@"
MERIDIAN_SRUN
chmod +x "$meridian_bin/srun"
fi
"#;

/// Line 1 of a shell script that loads modules: the site's environment modules when the
/// shell has none yet, else a `module` (and `ml`) that says what it skipped. One line, so
/// the script's own lines keep their numbers.
const MODULE_SETUP: &str = r#"if ! command -v module >/dev/null 2>&1; then for meridian_init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/sh; do [ -r "$meridian_init" ] && . "$meridian_init" && break; done; fi; if ! command -v module >/dev/null 2>&1; then module() { echo "meridian import: no environment modules at this site; skipped: module $*" >&2; }; ml() { module "$@"; }; fi"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_format_slurm_takes() {
        for (value, secs) in [
            ("30", 1_800),
            ("90", 5_400),
            ("10:30", 630),
            ("2:00:00", 7_200),
            ("1-12", 129_600),
            ("1-12:30", 131_400),
            ("2-00:00:10", 172_810),
        ] {
            assert_eq!(time(value), Ok(secs), "{value}");
        }
        for bad in ["", "1:2:3:4", "1h", "-5", "1-", "a-1", "UNLIMITED", "0"] {
            assert!(time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn memory_is_in_mebibytes_by_default() {
        assert_eq!(megabytes("500"), Ok(500));
        assert_eq!(megabytes("4G"), Ok(4096));
        assert_eq!(megabytes("1t"), Ok(1 << 20));
        assert_eq!(megabytes("1536K"), Ok(2));
        assert_eq!(megabytes("5GB"), Ok(5120));
        for bad in ["0", "4GiB", "G", "B", "1.5G", "-1"] {
            assert!(megabytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn arrays_take_ranges_steps_lists_and_a_cap() {
        let a = array("1-1000%50").unwrap();
        assert_eq!((a.indices.len(), a.indices[0], a.cap), (1000, 1, Some(50)));
        assert_eq!(array("0-15:4").unwrap().indices, [0, 4, 8, 12]);
        assert_eq!(array("7,1,3-4").unwrap().indices, [1, 3, 4, 7]);
        for bad in ["", "5-1", "1-10%0", "1-10:0", "a", "1-2-3", "1,,2"] {
            assert!(array(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_option_is_found_by_its_names_and_unique_prefixes() {
        assert_eq!(long_option("mem-per-c").unwrap().long, "mem-per-cpu");
        let e = long_option("mem-per").unwrap_err();
        assert!(e.contains("ambiguous"), "{e}");
        assert!(long_option("memory")
            .unwrap_err()
            .contains("not an sbatch option"));
        for o in OPTIONS {
            assert_eq!(long_option(o.long).unwrap().long, o.long);
        }
        let mut shorts: Vec<char> = OPTIONS.iter().filter_map(|o| o.short).collect();
        let all = shorts.len();
        shorts.sort_unstable();
        shorts.dedup();
        assert_eq!(shorts.len(), all, "a short option is given twice");
    }

    #[test]
    fn file_patterns_are_checked() {
        assert!(file_pattern("logs/%x-%A_%a.out").is_ok());
        assert!(file_pattern("%j.%4a.err").is_ok());
        assert!(file_pattern("%q.out").unwrap_err().contains("%q"));
    }
}
