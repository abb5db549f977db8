//! The v1 rules: walks a document's value with [`crate::walk`], checks every field and every
//! reference between fields, and builds the typed [`Workflow`] when nothing is wrong.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::types::*;
use crate::units::{Money, Size, Walltime};
use crate::walk::{
    boolean, describe, integer, list, map, one_of, parsed, quote, scalar_text, string, text,
    Fields, Path, Walker,
};
use crate::{graph, FieldError, SpecErrors, MAX_ARRAY_TASKS};

const TOP_FIELDS: [&str; 7] = [
    "version",
    "name",
    "labels",
    "placement",
    "volumes",
    "jobs",
    "services",
];
const PLACEMENT_FIELDS: [&str; 7] = [
    "prefer",
    "sites",
    "regions",
    "residency",
    "budget",
    "spot",
    "split",
];
const VOLUME_FIELDS: [&str; 3] = ["size", "ingress", "egress"];
const DATA_STEP_FIELDS: [&str; 3] = ["source", "destination", "credentials"];
const JOB_FIELDS: [&str; 9] = [
    "requires",
    "image",
    "command",
    "env",
    "cwd",
    "mounts",
    "resources",
    "array",
    "slurm",
];
const SLURM_FIELDS: [&str; 2] = ["partition", "qos"];
const SERVICE_FIELDS: [&str; 9] = [
    "requires",
    "image",
    "command",
    "env",
    "cwd",
    "mounts",
    "port",
    "replicas",
    "resources",
];
const RESOURCE_FIELDS: [&str; 5] = ["nodes", "cpus", "memory", "walltime", "gpus"];
const GPU_FIELDS: [&str; 4] = ["count", "vendor", "model", "memory"];
const ARRAY_FIELDS: [&str; 3] = ["start", "end", "parallelism"];
const REPLICA_FIELDS: [&str; 2] = ["min", "max"];

/// URI schemes a volume's data steps may copy from or to.
pub const DATA_SCHEMES: [&str; 7] = [
    "s3://", "gs://", "az://", "hf://", "https://", "http://", "file://",
];

// What each kind of value should be, as said in "expected …" and "required; expected …".
const VERSION: &str = "\"v1\"";
const WORKFLOW_NAME: &str = "1 to 63 letters, digits, \".\", \"-\" or \"_\"";
const STEP_NAME: &str = "a name of 1 to 63 letters, digits, \"-\" or \"_\"";
const IMAGE: &str =
    "\"host\", an image reference such as docker://python:3.12, or an absolute path to a .sif file";
const COMMAND: &str = "a list of strings such as [python, train.py]";
const SIZE: &str = "a size such as 16GiB or 500MB";
const WALLTIME: &str = "a duration such as 30m, 2h30m or 1d";
const MONEY: &str = "an amount and a currency such as \"500 USD\"";
const ABSOLUTE_PATH: &str = "an absolute path such as /data";
const COUNT_MIN: u64 = 1;

/// Longest label value; labels travel on every event and bill line.
const MAX_LABEL_VALUE: usize = 255;
/// How many names an "unknown job" message lists before it says "and N more".
const LISTED_NAMES: usize = 20;

/// Validates a whole document's value and builds the workflow, or returns every error.
pub(crate) fn workflow(doc: &Value) -> Result<Workflow, SpecErrors> {
    if !doc.is_object() {
        let message = if doc.is_null() {
            "document is empty".to_string()
        } else {
            format!("expected a mapping at the top level; got {}", describe(doc))
        };
        return Err(SpecErrors::from(vec![FieldError::document(message)]));
    }
    let mut w = Walker::default();
    let built = build(&mut w, doc);
    let errors = w.into_errors();
    match built {
        Some(workflow) if errors.is_empty() => Ok(workflow),
        _ if !errors.is_empty() => Err(SpecErrors::from(errors)),
        // Every parser records an error before giving up; reaching this is a bug here.
        _ => Err(SpecErrors::from(vec![FieldError::document(
            "internal error: the document was rejected without a reason; please report it",
        )])),
    }
}

/// The names the document declares, read before validation so that references can be
/// checked wherever they appear.
struct Names<'v> {
    jobs: Vec<&'v str>,
    services: Vec<&'v str>,
    volumes: Vec<&'v str>,
}

impl<'v> Names<'v> {
    fn of(top: &Fields<'v>) -> Names<'v> {
        let keys = |field: &str| -> Vec<&'v str> {
            match top.value(field) {
                Some(Value::Object(m)) => m.keys().map(String::as_str).collect::<BTreeSet<_>>(),
                _ => BTreeSet::new(),
            }
            .into_iter()
            .collect()
        };
        Names {
            jobs: keys("jobs"),
            services: keys("services"),
            volumes: keys("volumes"),
        }
    }

    fn is_step(&self, name: &str) -> bool {
        self.jobs.binary_search(&name).is_ok() || self.services.binary_search(&name).is_ok()
    }

    fn unknown_step(&self, name: &str) -> String {
        let (kind, known) = match (self.jobs.is_empty(), self.services.is_empty()) {
            (false, true) => ("job", format!("jobs are: {}", listing(&self.jobs))),
            (true, false) => (
                "service",
                format!("services are: {}", listing(&self.services)),
            ),
            (false, false) => (
                "job or service",
                format!(
                    "jobs are: {}; services are: {}",
                    listing(&self.jobs),
                    listing(&self.services)
                ),
            ),
            (true, true) => (
                "job or service",
                "the workflow has no jobs or services".to_string(),
            ),
        };
        format!("unknown {kind} {}; {known}", quote(name))
    }
}

fn listing(names: &[&str]) -> String {
    let mut out = names
        .iter()
        .take(LISTED_NAMES)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > LISTED_NAMES {
        out.push_str(&format!(" and {} more", names.len() - LISTED_NAMES));
    }
    out
}

fn build(w: &mut Walker, doc: &Value) -> Option<Workflow> {
    let root = Path::root();
    let top = w.mapping(&root, doc, &TOP_FIELDS)?;
    let names = Names::of(&top);

    let version = top.required(w, "version", VERSION, version);
    let name = top.required(w, "name", WORKFLOW_NAME, workflow_name);
    let labels = top.or(w, "labels", BTreeMap::new(), labels);
    let placement = top.or(w, "placement", Placement::default(), placement);
    let volumes = top.or(w, "volumes", BTreeMap::new(), |w, p, v| {
        named(w, p, v, "a mapping of volume names to volumes", volume)
    });
    let jobs = top.or(w, "jobs", BTreeMap::new(), |w, p, v| {
        named(w, p, v, "a mapping of job names to jobs", |w, p, v| {
            job(w, p, v, &names)
        })
    });
    let services = top.or(w, "services", BTreeMap::new(), |w, p, v| {
        named(
            w,
            p,
            v,
            "a mapping of service names to services",
            |w, p, v| service(w, p, v, &names),
        )
    });

    let empty = |field: &str| match top.value(field) {
        None => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(_) => false,
    };
    if empty("jobs") && empty("services") {
        w.error(
            &root.key("jobs"),
            "a workflow needs at least one job or service; found none",
        );
    }
    for name in &names.services {
        if names.jobs.binary_search(name).is_ok() {
            w.error(
                &root.key("services").key(name),
                format!(
                    "{} is already the name of a job; jobs and services share one namespace",
                    quote(name)
                ),
            );
        }
    }
    report_cycles(w, &top, &names);

    Some(Workflow {
        version: version?,
        name: name?,
        labels: labels?,
        placement: placement?,
        volumes: volumes?,
        jobs: jobs?,
        services: services?,
    })
}

/// Cycles in `requires`, each reported once at the `requires` of its first step by name.
fn report_cycles(w: &mut Walker, top: &Fields<'_>, names: &Names<'_>) {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for kind in ["jobs", "services"] {
        let Some(Value::Object(steps)) = top.value(kind) else {
            continue;
        };
        for (name, step) in steps {
            let requires = step
                .get("requires")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            graph.entry(name).or_default().extend(requires);
        }
    }
    for cycle in graph::cycles(&graph) {
        let first = cycle[0];
        let kind = if names.jobs.binary_search(&first).is_ok() {
            "jobs"
        } else {
            "services"
        };
        let path = Path::root().key(kind).key(first).key("requires");
        w.error(&path, format!("cycle {}", cycle.join(" → ")));
    }
}

// ---------------------------------------------------------------------------------------------
// Top-level fields
// ---------------------------------------------------------------------------------------------

fn version(w: &mut Walker, path: &Path, value: &Value) -> Option<SpecVersion> {
    match value {
        Value::String(s) if s == "v1" => Some(SpecVersion::V1),
        _ => w.expected(path, VERSION, value),
    }
}

fn is_name(s: &str, extra: &[u8]) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || extra.contains(&b))
}

fn workflow_name(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    let s = string(w, path, value)?;
    if !is_name(s, b".") {
        return w.expected(path, WORKFLOW_NAME, value);
    }
    Some(s.to_string())
}

fn labels(w: &mut Walker, path: &Path, value: &Value) -> Option<BTreeMap<String, String>> {
    map(
        w,
        path,
        value,
        "a mapping of label names to values",
        |w, p, key, v| {
            let key_ok = is_name(key, b"./");
            if !key_ok {
                w.error(
                p,
                format!(
                    "expected a label name of 1 to 63 letters, digits, \".\", \"/\", \"-\" or \"_\"; got {}",
                    quote(key)
                ),
            );
            }
            let text = scalar_text(w, p, v)?;
            if text.chars().count() > MAX_LABEL_VALUE {
                return w.expected(
                    p,
                    &format!("a value of at most {MAX_LABEL_VALUE} characters"),
                    v,
                );
            }
            key_ok.then_some(text)
        },
    )
}

/// A mapping whose keys are job, service or volume names.
fn named<'v, T>(
    w: &mut Walker,
    path: &Path,
    value: &'v Value,
    what: &str,
    mut item: impl FnMut(&mut Walker, &Path, &'v Value) -> Option<T>,
) -> Option<BTreeMap<String, T>> {
    map(w, path, value, what, |w, p, key, v| {
        let key_ok = is_name(key, b"");
        if !key_ok {
            w.error(p, format!("expected {STEP_NAME}; got {}", quote(key)));
        }
        let parsed = item(w, p, v);
        if key_ok {
            parsed
        } else {
            None
        }
    })
}

fn placement(w: &mut Walker, path: &Path, value: &Value) -> Option<Placement> {
    let f = w.mapping(path, value, &PLACEMENT_FIELDS)?;
    let prefer = f.or(w, "prefer", Preference::default(), |w, p, v| {
        let choices = Preference::ALL.map(|c| (c.as_str(), c));
        one_of(w, p, v, &choices)
    });
    let sites = f.or(w, "sites", Vec::new(), |w, p, v| {
        unique_strings(w, p, v, "a list of site names")
    });
    let regions = f.or(w, "regions", Vec::new(), |w, p, v| {
        unique_strings(w, p, v, "a list of regions")
    });
    let residency = f.optional(w, "residency", text);
    let budget = f.optional(w, "budget", |w, p, v| parsed::<Money>(w, p, v, MONEY));
    let spot = f.or(w, "spot", false, boolean);
    let split = f.or(w, "split", false, boolean);
    Some(Placement {
        prefer: prefer?,
        sites: sites?,
        regions: regions?,
        residency: residency?,
        budget: budget?,
        spot: spot?,
        split: split?,
    })
}

/// A list of non-empty strings, each at most once.
fn unique_strings(w: &mut Walker, path: &Path, value: &Value, what: &str) -> Option<Vec<String>> {
    let items = list(w, path, value, what, text)?;
    no_repeats(w, path, &items).then_some(items)
}

/// Reports each item that repeats an earlier one; true when there are none.
fn no_repeats(w: &mut Walker, path: &Path, items: &[String]) -> bool {
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        if let Some(earlier) = first.get(item.as_str()) {
            let at = path.index(*earlier);
            w.error(
                &path.index(i),
                format!("{} is already listed at {}", quote(item), at.as_str()),
            );
            ok = false;
        } else {
            first.insert(item, i);
        }
    }
    ok
}

// ---------------------------------------------------------------------------------------------
// Volumes
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Direction {
    /// From a URI into the volume.
    Ingress,
    /// From the volume out to a URI.
    Egress,
}

fn volume(w: &mut Walker, path: &Path, value: &Value) -> Option<Volume> {
    let f = w.mapping(path, value, &VOLUME_FIELDS)?;
    let size = f.required(w, "size", SIZE, positive_size);
    let ingress = f.or(w, "ingress", Vec::new(), |w, p, v| {
        let what = "a list of {source, destination} copies into the volume";
        list(w, p, v, what, |w, p, v| {
            data_step(w, p, v, Direction::Ingress)
        })
    });
    let egress = f.or(w, "egress", Vec::new(), |w, p, v| {
        let what = "a list of {source, destination} copies out of the volume";
        list(w, p, v, what, |w, p, v| {
            data_step(w, p, v, Direction::Egress)
        })
    });
    Some(Volume {
        size: size?,
        ingress: ingress?,
        egress: egress?,
    })
}

fn data_step(w: &mut Walker, path: &Path, value: &Value, direction: Direction) -> Option<DataStep> {
    let f = w.mapping(path, value, &DATA_STEP_FIELDS)?;
    let (source, destination) = match direction {
        Direction::Ingress => (
            f.required(w, "source", &uri_what(), uri),
            f.required(w, "destination", ABSOLUTE_PATH, absolute_path),
        ),
        Direction::Egress => (
            f.required(w, "source", ABSOLUTE_PATH, absolute_path),
            f.required(w, "destination", &uri_what(), uri),
        ),
    };
    let credentials = f.optional(w, "credentials", secret_name);
    Some(DataStep {
        source: source?,
        destination: destination?,
        credentials: credentials?,
    })
}

const SECRET_NAME: &str = "a secret's name: 1 to 63 letters, digits, \".\", \"-\" or \"_\"";

fn secret_name(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    let s = string(w, path, value)?;
    match is_name(s, b".") {
        true => Some(s.to_string()),
        false => w.expected(path, SECRET_NAME, value),
    }
}

fn uri_what() -> String {
    let schemes = DATA_SCHEMES.join(", ");
    match schemes.rsplit_once(", ") {
        Some((head, last)) => format!("a URI starting with {head} or {last}"),
        None => format!("a URI starting with {schemes}"),
    }
}

fn uri(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    let s = string(w, path, value)?;
    let scheme = DATA_SCHEMES.iter().find(|scheme| s.starts_with(*scheme));
    match scheme {
        Some(scheme) if s.len() > scheme.len() && !s.chars().any(char::is_control) => {
            Some(s.to_string())
        }
        Some(scheme) => w.expected_because(
            path,
            &uri_what(),
            value,
            format_args!("nothing follows {scheme}"),
        ),
        None => w.expected(path, &uri_what(), value),
    }
}

fn absolute_path(w: &mut Walker, path: &Path, value: &Value) -> Option<String> {
    let s = string(w, path, value)?;
    if !s.starts_with('/') || s.chars().any(char::is_control) {
        return w.expected(path, ABSOLUTE_PATH, value);
    }
    Some(s.to_string())
}

// ---------------------------------------------------------------------------------------------
// Jobs and services
// ---------------------------------------------------------------------------------------------

/// The fields jobs and services share.
struct Common {
    requires: Vec<String>,
    image: Image,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    mounts: BTreeMap<String, String>,
    resources: Resources,
}

/// Whether `${ARRAY_INDEX}` means anything in a command.
#[derive(Clone, Copy)]
enum ArrayIndex {
    Available,
    JobWithoutArray,
    Service,
}

fn common(w: &mut Walker, f: &Fields<'_>, names: &Names<'_>, index: ArrayIndex) -> Option<Common> {
    let requires = f.or(w, "requires", Vec::new(), |w, p, v| {
        requires(w, p, v, names)
    });
    let image = f.required(w, "image", IMAGE, |w, p, v| parsed::<Image>(w, p, v, IMAGE));
    let command = f.required(w, "command", COMMAND, |w, p, v| command(w, p, v, index));
    let env = f.or(w, "env", BTreeMap::new(), env);
    let cwd = f.optional(w, "cwd", absolute_path);
    let mounts = f.or(w, "mounts", BTreeMap::new(), |w, p, v| {
        mounts(w, p, v, names)
    });
    let resources = f.or(w, "resources", Resources::default(), resources);
    Some(Common {
        requires: requires?,
        image: image?,
        command: command?,
        env: env?,
        cwd: cwd?,
        mounts: mounts?,
        resources: resources?,
    })
}

fn job(w: &mut Walker, path: &Path, value: &Value, names: &Names<'_>) -> Option<Job> {
    let f = w.mapping(path, value, &JOB_FIELDS)?;
    let index = if f.value("array").is_some() {
        ArrayIndex::Available
    } else {
        ArrayIndex::JobWithoutArray
    };
    let common = common(w, &f, names, index);
    let array = f.optional(w, "array", array);
    let slurm = f.optional(w, "slurm", slurm_options);
    let (c, array, slurm) = (common?, array?, slurm?);
    Some(Job {
        requires: c.requires,
        image: c.image,
        command: c.command,
        env: c.env,
        cwd: c.cwd,
        mounts: c.mounts,
        resources: c.resources,
        array,
        slurm,
    })
}

const SLURM_NAME: &str = "a Slurm name: 1 to 63 letters, digits, \".\", \"-\" or \"_\"";

fn slurm_options(w: &mut Walker, path: &Path, value: &Value) -> Option<SlurmOptions> {
    let f = w.mapping(path, value, &SLURM_FIELDS)?;
    let name = |w: &mut Walker, p: &Path, v: &Value| {
        let s = string(w, p, v)?;
        match is_name(s, b".") {
            true => Some(s.to_string()),
            false => w.expected(p, SLURM_NAME, v),
        }
    };
    let partition = f.optional(w, "partition", name);
    let qos = f.optional(w, "qos", name);
    Some(SlurmOptions {
        partition: partition?,
        qos: qos?,
    })
}

fn service(w: &mut Walker, path: &Path, value: &Value, names: &Names<'_>) -> Option<Service> {
    let f = w.mapping(path, value, &SERVICE_FIELDS)?;
    let common = common(w, &f, names, ArrayIndex::Service);
    let port = f.required(w, "port", "an integer from 1 to 65535", |w, p, v| {
        integer(w, p, v, 1, u64::from(u16::MAX)).and_then(|n| u16::try_from(n).ok())
    });
    let replicas = f.or(w, "replicas", Replicas::default(), replicas);
    let (c, port, replicas) = (common?, port?, replicas?);
    Some(Service {
        requires: c.requires,
        image: c.image,
        command: c.command,
        env: c.env,
        cwd: c.cwd,
        mounts: c.mounts,
        port,
        replicas,
        resources: c.resources,
    })
}

fn requires(w: &mut Walker, path: &Path, value: &Value, names: &Names<'_>) -> Option<Vec<String>> {
    let what = "a list of job or service names such as [prep]";
    if let Value::String(s) = value {
        let hint = format!("write it as a list: [{s}]");
        return w.expected_because(path, what, value, hint);
    }
    let items = list(w, path, value, what, |w, p, v| {
        let name = string(w, p, v)?;
        if !names.is_step(name) {
            w.error(p, names.unknown_step(name));
            return None;
        }
        Some(name.to_string())
    })?;
    no_repeats(w, path, &items).then_some(items)
}

fn command(w: &mut Walker, path: &Path, value: &Value, index: ArrayIndex) -> Option<Vec<String>> {
    if let Value::String(s) = value {
        return w.expected_because(path, COMMAND, value, command_hint(s));
    }
    let items = list(w, path, value, COMMAND, |w, p, v| {
        let arg = string(w, p, v)?;
        if arg.contains("${ARRAY_INDEX}") {
            let why = match index {
                ArrayIndex::Available => None,
                ArrayIndex::JobWithoutArray => {
                    Some("the job has no array; add array: {start, end, parallelism} or remove it")
                }
                ArrayIndex::Service => Some("services have no task array"),
            };
            if let Some(why) = why {
                w.error(p, format!("uses ${{ARRAY_INDEX}}, but {why}"));
                return None;
            }
        }
        Some(arg.to_string())
    })?;
    match items.first() {
        None => {
            w.error(
                path,
                "expected at least the program to run; got an empty list",
            );
            None
        }
        Some(program) if program.is_empty() => {
            w.error(&path.index(0), "the program to run cannot be empty");
            None
        }
        Some(_) => Some(items),
    }
}

/// Suggests the list form for a command written as one string.
fn command_hint(s: &str) -> String {
    let words: Vec<&str> = s.split_whitespace().collect();
    if s.len() > 80 || words.is_empty() {
        return "write it as a list of the program and its arguments".to_string();
    }
    let as_list = |items: &[&str]| {
        let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
        format!("[{}]", quoted.join(", "))
    };
    if words.len() == 1 {
        return format!("write it as a list: {}", as_list(&words));
    }
    format!(
        "write it as a list, such as {}, or {} to run it through a shell",
        as_list(&words),
        as_list(&["sh", "-c", s])
    )
}

fn env(w: &mut Walker, path: &Path, value: &Value) -> Option<BTreeMap<String, String>> {
    map(
        w,
        path,
        value,
        "a mapping of variable names to values",
        |w, p, key, v| {
            let mut chars = key.chars();
            let well_formed = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            let key_ok = if !well_formed {
                w.error(
                p,
                format!(
                    "expected a variable name of letters, digits and \"_\", not starting with a digit; got {}",
                    quote(key)
                ),
            );
                false
            } else if key.starts_with("MERIDIAN_") {
                w.error(
                p,
                "names starting with MERIDIAN_ are set by Meridian (such as MERIDIAN_ARRAY_INDEX) and cannot be set here",
            );
                false
            } else {
                true
            };
            let value = scalar_text(w, p, v)?;
            key_ok.then_some(value)
        },
    )
}

fn mounts(
    w: &mut Walker,
    path: &Path,
    value: &Value,
    names: &Names<'_>,
) -> Option<BTreeMap<String, String>> {
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    map(
        w,
        path,
        value,
        "a mapping of volume names to mount paths",
        |w, p, volume, v| {
            let known = names.volumes.binary_search(&volume).is_ok();
            if !known {
                let declared = if names.volumes.is_empty() {
                    "no volumes are declared; add it under volumes".to_string()
                } else {
                    format!("volumes are: {}", listing(&names.volumes))
                };
                w.error(p, format!("unknown volume {}; {declared}", quote(volume)));
            }
            let mount = absolute_path(w, p, v)?;
            if let Some(other) = used.get(&mount) {
                let message = format!(
                    "{} is already the mount path of volume {}",
                    quote(&mount),
                    quote(other)
                );
                w.error(p, message);
                return None;
            }
            used.insert(mount.clone(), volume.to_string());
            known.then_some(mount)
        },
    )
}

fn resources(w: &mut Walker, path: &Path, value: &Value) -> Option<Resources> {
    let f = w.mapping(path, value, &RESOURCE_FIELDS)?;
    let defaults = Resources::default();
    let nodes = f.or(w, "nodes", defaults.nodes, count);
    let cpus = f.or(w, "cpus", defaults.cpus, count);
    let memory = f.or(w, "memory", defaults.memory, positive_size);
    let walltime = f.or(w, "walltime", defaults.walltime, positive_walltime);
    let gpus = f.optional(w, "gpus", gpus);
    Some(Resources {
        nodes: nodes?,
        cpus: cpus?,
        memory: memory?,
        walltime: walltime?,
        gpus: gpus?,
    })
}

fn gpus(w: &mut Walker, path: &Path, value: &Value) -> Option<Gpus> {
    let f = w.mapping(path, value, &GPU_FIELDS)?;
    let count = f.required(w, "count", "an integer of at least 1", count);
    let vendor = f.or(w, "vendor", GpuVendor::default(), |w, p, v| {
        let choices = GpuVendor::ALL.map(|c| (c.as_str(), c));
        one_of(w, p, v, &choices)
    });
    let model = f.optional(w, "model", text);
    let memory = f.optional(w, "memory", positive_size);
    Some(Gpus {
        count: count?,
        vendor: vendor?,
        model: model?,
        memory: memory?,
    })
}

fn array(w: &mut Walker, path: &Path, value: &Value) -> Option<TaskArray> {
    let f = w.mapping(path, value, &ARRAY_FIELDS)?;
    let index = |w: &mut Walker, p: &Path, v: &Value| {
        integer(w, p, v, 0, u64::from(u32::MAX)).and_then(|n| u32::try_from(n).ok())
    };
    let start = f.required(w, "start", "a whole number (0 or more)", index);
    let end = f.required(w, "end", "a whole number (0 or more)", index);
    let parallelism = f.required(w, "parallelism", "an integer of at least 1", count);
    let (start, end, parallelism) = (start?, end?, parallelism?);
    if end < start {
        w.error(
            &path.key("end"),
            format!("expected an integer of at least start ({start}); got {end}"),
        );
        return None;
    }
    let tasks = u64::from(end) - u64::from(start) + 1;
    if tasks > u64::from(MAX_ARRAY_TASKS) {
        w.error(
            path,
            format!("an array has at most {MAX_ARRAY_TASKS} tasks; {start} to {end} is {tasks}"),
        );
        return None;
    }
    Some(TaskArray {
        start,
        end,
        parallelism,
    })
}

fn replicas(w: &mut Walker, path: &Path, value: &Value) -> Option<Replicas> {
    let f = w.mapping(path, value, &REPLICA_FIELDS)?;
    let min = f.required(w, "min", "an integer of at least 1", count);
    let max = f.required(w, "max", "an integer of at least 1", count);
    let (min, max) = (min?, max?);
    if max < min {
        w.error(
            &path.key("max"),
            format!("expected an integer of at least min ({min}); got {max}"),
        );
        return None;
    }
    Some(Replicas { min, max })
}

// ---------------------------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------------------------

/// An integer of at least 1 that fits in a `u32`: nodes, CPUs, GPUs, replicas.
fn count(w: &mut Walker, path: &Path, value: &Value) -> Option<u32> {
    integer(w, path, value, COUNT_MIN, u64::from(u32::MAX)).and_then(|n| u32::try_from(n).ok())
}

fn positive_size(w: &mut Walker, path: &Path, value: &Value) -> Option<Size> {
    let size: Size = parsed(w, path, value, SIZE)?;
    if size.bytes() == 0 {
        return w.expected_because(path, SIZE, value, "it must be greater than zero");
    }
    Some(size)
}

fn positive_walltime(w: &mut Walker, path: &Path, value: &Value) -> Option<Walltime> {
    let walltime: Walltime = parsed(w, path, value, WALLTIME)?;
    if walltime.secs() == 0 {
        return w.expected_because(path, WALLTIME, value, "it must be longer than zero");
    }
    Some(walltime)
}
