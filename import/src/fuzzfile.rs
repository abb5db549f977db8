//! CIQ Fuzzball's Fuzzfiles (`version: v1`): volumes with their ingress and egress, jobs
//! and services, `defaults.job`, task arrays, devices and policies, mapped onto the v1
//! workflow. Errors and notes name the field (`jobs.train.resource.devices`).

use std::collections::BTreeMap;

use meridian_spec::{
    DataStep, GpuVendor, Gpus, Image, Job, Placement, Replicas, Resources, Service, Size,
    SpecVersion, TaskArray, Volume, Walltime, Workflow,
};
use serde_json::{Map, Value};

use crate::{file_stem, spec_name, validated, ImportError, ImportErrors, Imported, Note, NoteKind};

/// Size a volume gets when the Fuzzfile gives none (v1 volumes have no size).
pub const DEFAULT_VOLUME_SIZE: Size = Size::from_bytes(100 << 30);

/// Whether `text` reads as a Fuzzfile: a YAML mapping with no `name`, whose jobs or
/// services have `image` as a mapping, or which has `defaults` or volumes with a
/// `reference`.
pub(crate) fn looks_like(text: &str) -> bool {
    let Ok(Value::Object(top)) = meridian_spec::read_document(text) else {
        return false;
    };
    if top.contains_key("name") {
        return false;
    }
    let image_mapping = ["jobs", "services"].iter().any(|section| {
        top.get(*section)
            .and_then(Value::as_object)
            .is_some_and(|steps| {
                steps
                    .values()
                    .any(|step| step.get("image").is_some_and(Value::is_object))
            })
    });
    let references = top
        .get("volumes")
        .and_then(Value::as_object)
        .is_some_and(|v| v.values().any(|v| v.get("reference").is_some()));
    image_mapping || references || top.contains_key("defaults")
}

/// What reading the document collects: the notes, and the errors with their fields.
struct Reader {
    notes: Vec<Note>,
    errors: Vec<ImportError>,
}

impl Reader {
    fn error(&mut self, field: &str, message: impl Into<String>) {
        self.errors.push(ImportError {
            line: None,
            subject: field.to_string(),
            message: message.into(),
        });
    }

    fn note(&mut self, field: &str, kind: NoteKind, text: impl Into<String>) {
        self.notes.push(Note {
            line: None,
            subject: field.to_string(),
            kind,
            text: text.into(),
        });
    }

    fn ignored(&mut self, field: &str, why: &str) {
        self.note(field, NoteKind::Ignored, why);
    }

    /// Notes `key` of `map` (at `field`) as ignored, for `why`, when it is there.
    fn ignore_key(&mut self, map: &Map<String, Value>, field: &str, key: &str, why: &str) {
        if map.contains_key(key) {
            self.ignored(&join(field, key), why);
        }
    }

    /// The mapping at `field`, or an error naming it.
    fn mapping<'v>(&mut self, value: &'v Value, field: &str) -> Option<&'v Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => {
                self.error(field, "expected a mapping");
                None
            }
        }
    }

    fn text<'v>(&mut self, value: &'v Value, field: &str) -> Option<&'v str> {
        match value {
            Value::String(s) => Some(s),
            _ => {
                self.error(field, "expected text");
                None
            }
        }
    }

    fn whole(&mut self, value: &Value, field: &str, least: u64) -> Option<u32> {
        match value.as_u64().filter(|n| *n >= least) {
            Some(n) => match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.error(field, format!("{n} is too large"));
                    None
                }
            },
            None => {
                self.error(
                    field,
                    format!("expected a whole number of at least {least}"),
                );
                None
            }
        }
    }

    /// Reports every key of `map` not in `known`, as not carried over.
    fn unknown(&mut self, map: &Map<String, Value>, field: &str, known: &[&str]) {
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            self.error(
                &join(field, key),
                format!(
                    "not a Fuzzfile v1 field here (expected one of: {})",
                    known.join(", ")
                ),
            );
        }
    }
}

fn join(field: &str, key: &str) -> String {
    if field.is_empty() {
        key.to_string()
    } else {
        format!("{field}.{key}")
    }
}

/// Imports a Fuzzfile; `file` names the workflow.
pub fn import(text: &str, file: &str) -> Result<Imported, ImportErrors> {
    let value = meridian_spec::read_document(text).map_err(|e| {
        ImportErrors(vec![ImportError {
            line: None,
            subject: e.path.clone(),
            message: e.message.clone(),
        }])
    })?;
    let mut r = Reader {
        notes: Vec::new(),
        errors: Vec::new(),
    };
    let workflow = read(&mut r, &value, file);
    if !r.errors.is_empty() {
        return Err(ImportErrors(r.errors));
    }
    let workflow = workflow.expect("a workflow when nothing was wrong");
    Ok(Imported {
        workflow: validated(&workflow)?,
        notes: r.notes,
    })
}

/// Names as the spec takes them, each Fuzzfile step's name to its own.
struct Names(BTreeMap<String, String>);

impl Names {
    fn get(&self, name: &str) -> Option<&String> {
        self.0.get(name)
    }
}

fn read(r: &mut Reader, value: &Value, file: &str) -> Option<Workflow> {
    let top = r.mapping(value, "")?;
    r.unknown(
        top,
        "",
        &[
            "version",
            "files",
            "defaults",
            "annotations",
            "volumes",
            "jobs",
            "services",
        ],
    );
    match top.get("version").and_then(Value::as_str) {
        Some("v1") => {}
        Some(other) => r.error(
            "version",
            format!("Fuzzfile version {other:?} is not supported; the import reads v1"),
        ),
        None => r.error("version", "expected v1"),
    }
    if top.contains_key("files") {
        r.error(
            "files",
            "inline files have no equivalent in a workflow: put each file in object storage and copy it in with a volume's ingress",
        );
    }
    let mut labels = BTreeMap::new();
    labels.insert("imported-from".to_string(), "fuzzfile".to_string());
    if let Some(annotations) = top.get("annotations") {
        if let Some(map) = r.mapping(annotations, "annotations") {
            for (k, v) in map {
                match v.as_str() {
                    Some(v) => {
                        labels.insert(k.clone(), v.chars().take(255).collect());
                    }
                    None => r.error(&join("annotations", k), "expected text"),
                }
            }
            r.note(
                "annotations",
                NoteKind::Warning,
                "kept as labels; they do not steer placement",
            );
        }
    }
    let defaults = match top.get("defaults") {
        None => Map::new(),
        Some(d) => {
            let d = r.mapping(d, "defaults").cloned().unwrap_or_default();
            r.unknown(&d, "defaults", &["job"]);
            match d.get("job") {
                None => Map::new(),
                Some(job) => {
                    let job = r.mapping(job, "defaults.job").cloned().unwrap_or_default();
                    r.unknown(
                        &job,
                        "defaults.job",
                        &["env", "mounts", "policy", "resource"],
                    );
                    job
                }
            }
        }
    };
    let volumes = match top.get("volumes") {
        None => BTreeMap::new(),
        Some(v) => volumes(r, v),
    };

    // Names first, so `requires` can be rewritten to them.
    let mut names = BTreeMap::new();
    for section in ["jobs", "services"] {
        if let Some(Value::Object(steps)) = top.get(section) {
            for name in steps.keys() {
                let spec = spec_name(name, false);
                if &spec != name {
                    r.note(
                        &join(section, name),
                        NoteKind::Warning,
                        format!(
                            "renamed {spec:?}: workflow step names are letters, digits, - and _"
                        ),
                    );
                }
                if let Some((other, _)) = names.iter().find(|(_, s)| **s == spec) {
                    r.error(
                        &join(section, name),
                        format!("{name:?} and {other:?} are both {spec:?} as workflow names: rename one"),
                    );
                }
                names.insert(name.clone(), spec);
            }
        }
    }
    let names = Names(names);
    let services_named: Vec<String> = match top.get("services") {
        Some(Value::Object(s)) => s.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let mut jobs = BTreeMap::new();
    if let Some(v) = top.get("jobs") {
        if let Some(map) = r.mapping(v, "jobs") {
            for (name, job) in map {
                let field = join("jobs", name);
                if let Some(Step::Job(job)) =
                    step(r, job, &field, &defaults, &names, &services_named, false)
                {
                    jobs.insert(names.get(name).cloned().unwrap_or_default(), job);
                }
            }
        }
    }
    let mut services = BTreeMap::new();
    if let Some(v) = top.get("services") {
        if let Some(map) = r.mapping(v, "services") {
            for (name, service) in map {
                let field = join("services", name);
                if let Some(Step::Service(s)) = step(
                    r,
                    service,
                    &field,
                    &Map::new(),
                    &names,
                    &services_named,
                    true,
                ) {
                    services.insert(names.get(name).cloned().unwrap_or_default(), s);
                }
            }
        }
    }
    if jobs.is_empty() && services.is_empty() && r.errors.is_empty() {
        r.error("jobs", "a Fuzzfile needs at least one job or service");
    }
    if !r.errors.is_empty() {
        return None;
    }
    Some(Workflow {
        version: SpecVersion::V1,
        name: spec_name(file_stem(file), true),
        labels,
        placement: Placement::default(),
        volumes,
        jobs,
        services,
    })
}

fn volumes(r: &mut Reader, value: &Value) -> BTreeMap<String, Volume> {
    let mut out = BTreeMap::new();
    let Some(map) = r.mapping(value, "volumes") else {
        return out;
    };
    for (name, volume) in map {
        let field = join("volumes", name);
        let Some(v) = r.mapping(volume, &field) else {
            continue;
        };
        r.unknown(v, &field, &["reference", "name", "ingress", "egress"]);
        r.ignore_key(
            v,
            &field,
            "name",
            "the volume's key names it, as in Fuzzball",
        );
        if spec_name(name, false) != *name {
            r.error(
                &field,
                "volume names are letters, digits, - and _ in a workflow",
            );
            continue;
        }
        match v.get("reference").and_then(Value::as_str) {
            Some(reference) if reference.starts_with("volume://") => {
                let kind = reference.trim_start_matches("volume://").split('/').nth(1);
                if kind == Some("persistent") {
                    r.note(
                        &join(&field, "reference"),
                        NoteKind::Warning,
                        format!(
                            "{reference} outlives a Fuzzball workflow; a workflow's volume does not: copy what must stay out with egress"
                        ),
                    );
                }
            }
            Some(other) => r.error(
                &join(&field, "reference"),
                format!("expected volume://user/ephemeral or volume://user/persistent/NAME; got {other:?}"),
            ),
            None => r.error(&join(&field, "reference"), "expected a volume:// reference"),
        }
        r.note(
            &field,
            NoteKind::Warning,
            format!(
                "a Fuzzfile v1 volume has no size; the workflow asks for {DEFAULT_VOLUME_SIZE}: change it to what the data needs"
            ),
        );
        let ingress = steps(r, v.get("ingress"), &join(&field, "ingress"), true);
        let egress = steps(r, v.get("egress"), &join(&field, "egress"), false);
        out.insert(
            name.clone(),
            Volume {
                size: DEFAULT_VOLUME_SIZE,
                ingress,
                egress,
            },
        );
    }
    out
}

/// A volume's copies in (`into_volume`) or out.
fn steps(r: &mut Reader, value: Option<&Value>, field: &str, into_volume: bool) -> Vec<DataStep> {
    let Some(value) = value else {
        return Vec::new();
    };
    let Some(list) = value.as_array() else {
        r.error(field, "expected a list");
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let Some(map) = r.mapping(item, &field) else {
            continue;
        };
        r.unknown(map, &field, &["source", "destination", "policy"]);
        r.ignore_key(
            map,
            &field,
            "policy",
            "the data mover retries a copy itself and has no per-copy timeout",
        );
        let source = uri(r, map.get("source"), &join(&field, "source"));
        let destination = uri(r, map.get("destination"), &join(&field, "destination"));
        let (Some(source), Some(destination)) = (source, destination) else {
            continue;
        };
        // The volume's end of a copy is a `file://` path inside it; the other end is a URI.
        let (inside, outside, inside_field) = if into_volume {
            (&destination, &source, "destination")
        } else {
            (&source, &destination, "source")
        };
        let Some(path) = inside.0.strip_prefix("file://") else {
            r.error(
                &join(&field, &format!("{inside_field}.uri")),
                "expected file://PATH, a path inside the volume",
            );
            continue;
        };
        if outside.0.starts_with("file://") {
            r.error(
                &join(&field, &format!("{}.uri", if into_volume { "source" } else { "destination" })),
                "file:// names a file from the Fuzzfile's files, which a workflow has no equivalent of",
            );
            continue;
        }
        if inside.1.is_some() {
            r.ignored(
                &join(&field, &format!("{inside_field}.secret")),
                "the volume's end of a copy needs no credentials",
            );
        }
        let path = format!("/{}", path.trim_start_matches('/'));
        let (source, destination) = if into_volume {
            (outside.0.clone(), path)
        } else {
            (path, outside.0.clone())
        };
        out.push(DataStep {
            source,
            destination,
            credentials: outside.1.clone(),
        });
    }
    out
}

/// A `{uri, secret}`: the URI and the secret's name (`secret://user/NAME` → `NAME`).
fn uri(r: &mut Reader, value: Option<&Value>, field: &str) -> Option<(String, Option<String>)> {
    let Some(value) = value else {
        r.error(field, "expected {uri: …}");
        return None;
    };
    let map = r.mapping(value, field)?;
    r.unknown(map, field, &["uri", "secret"]);
    let uri = r
        .text(map.get("uri").unwrap_or(&Value::Null), &join(field, "uri"))?
        .to_string();
    let secret = match map.get("secret") {
        None => None,
        Some(s) => {
            let s = r.text(s, &join(field, "secret"))?;
            let name = s
                .strip_prefix("secret://")
                .and_then(|rest| rest.split('/').nth(1));
            match name {
                Some(name) if !name.is_empty() => {
                    r.note(
                        &join(field, "secret"),
                        NoteKind::Warning,
                        format!("the copy uses the data mover's secret {name:?}: add it to the secrets file of meridian up --secrets"),
                    );
                    Some(name.to_string())
                }
                _ => {
                    r.error(
                        &join(field, "secret"),
                        format!("expected secret://user/NAME or secret://account/NAME; got {s:?}"),
                    );
                    return None;
                }
            }
        }
    };
    Some((uri, secret))
}

/// The fields jobs and services share.
const STEP_FIELDS: [&str; 12] = [
    "name",
    "image",
    "command",
    "script",
    "args",
    "env",
    "cwd",
    "mounts",
    "requires",
    "depends-on",
    "resource",
    "multinode",
];

enum Step {
    Job(Job),
    Service(Service),
}

/// A job (or a service), with `defaults.job` under what it says itself.
#[allow(clippy::too_many_arguments)]
fn step(
    r: &mut Reader,
    value: &Value,
    field: &str,
    defaults: &Map<String, Value>,
    names: &Names,
    services: &[String],
    is_service: bool,
) -> Option<Step> {
    let own = r.mapping(value, field)?;
    let own_fields: &[&str] = if is_service {
        &["persist", "network", "readiness-probe"]
    } else {
        &["task-array", "policy"]
    };
    let known: Vec<&str> = STEP_FIELDS.iter().chain(own_fields).copied().collect();
    r.unknown(own, field, &known);
    let mut step = defaults.clone();
    for (k, v) in own {
        let merged = match (step.get(k), v) {
            (Some(default), own) => merged(k, default, own),
            (None, own) => own.clone(),
        };
        step.insert(k.clone(), merged);
    }
    r.ignore_key(
        own,
        field,
        "name",
        "the step's key names it, as in Fuzzball",
    );

    let image = match step.get("image") {
        Some(Value::Object(image)) => {
            r.unknown(image, &join(field, "image"), &["uri", "secret"]);
            r.ignore_key(
                image,
                &join(field, "image"),
                "secret",
                "registry credentials are each site's own: give the site a pull secret",
            );
            let uri = r.text(
                image.get("uri").unwrap_or(&Value::Null),
                &join(field, "image.uri"),
            );
            uri.and_then(|u| match u.parse::<Image>() {
                Ok(image) => Some(image),
                Err(e) => {
                    r.error(&join(field, "image.uri"), e.to_string());
                    None
                }
            })
        }
        _ => {
            r.error(
                &join(field, "image"),
                "expected {uri: docker://… or oras://…}",
            );
            None
        }
    };

    let mut command = command(r, &step, field);
    let mut env = BTreeMap::new();
    if let Some(list) = step.get("env") {
        match list.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    match item.as_str().and_then(|s| s.split_once('=')) {
                        Some((k, v)) => {
                            if let Some(secret) = v.strip_prefix("secret://") {
                                r.error(
                                    &format!("{field}.env[{i}]"),
                                    format!("{k} takes its value from secret://{secret}: a workflow's env never holds secrets; give the site the variable"),
                                );
                            }
                            env.insert(k.to_string(), v.to_string());
                        }
                        None => r.error(&format!("{field}.env[{i}]"), "expected NAME=VALUE"),
                    }
                }
            }
            None => r.error(&join(field, "env"), "expected a list of NAME=VALUE"),
        }
    }
    let cwd = step
        .get("cwd")
        .and_then(|c| r.text(c, &join(field, "cwd")))
        .map(String::from);
    let mut mounts = BTreeMap::new();
    if let Some(m) = step.get("mounts") {
        if let Some(map) = r.mapping(m, &join(field, "mounts")) {
            for (volume, at) in map {
                let f = join(&join(field, "mounts"), volume);
                match at.get("location").and_then(Value::as_str) {
                    Some(location) => {
                        mounts.insert(volume.clone(), location.to_string());
                    }
                    None => r.error(&f, "expected {location: /path}"),
                }
            }
        }
    }
    let requires = requires(r, &step, field, names, services);
    let mut resources = resources(r, step.get("resource"), &join(field, "resource"));
    if let Some(multinode) = step.get("multinode") {
        let f = join(field, "multinode");
        if let Some(m) = r.mapping(multinode, &f) {
            r.unknown(m, &f, &["nodes", "implementation", "procs-per-node"]);
            if let Some(n) = m
                .get("nodes")
                .and_then(|n| r.whole(n, &join(&f, "nodes"), 1))
            {
                resources.nodes = n;
            }
            if let Some(i) = m.get("implementation").and_then(Value::as_str) {
                r.note(
                    &join(&f, "implementation"),
                    NoteKind::Warning,
                    format!("Fuzzball starts the command with its {i} launcher; Meridian runs the command as written on the job's nodes, so start it with mpirun yourself"),
                );
            }
            r.ignore_key(
                m,
                &f,
                "procs-per-node",
                "processes per node are the launcher's, as written in the command",
            );
        }
    }

    if is_service {
        let port = service_port(r, &step, field);
        r.ignore_key(
            &step,
            field,
            "persist",
            "a service runs until its workflow ends",
        );
        r.ignore_key(
            &step,
            field,
            "readiness-probe",
            "a service is ready when its port answers TCP",
        );
        return Some(Step::Service(Service {
            requires,
            image: image?,
            command: command?,
            env,
            cwd,
            mounts,
            port: port?,
            replicas: Replicas::default(),
            resources,
        }));
    }

    let mut array = None;
    if let Some(t) = step.get("task-array") {
        let f = join(field, "task-array");
        if let Some(t) = r.mapping(t, &f) {
            r.unknown(t, &f, &["start", "end", "concurrency"]);
            let start = t
                .get("start")
                .and_then(|v| r.whole(v, &join(&f, "start"), 0));
            let end = t.get("end").and_then(|v| r.whole(v, &join(&f, "end"), 0));
            let concurrency = match t.get("concurrency") {
                Some(v) => r.whole(v, &join(&f, "concurrency"), 1),
                None => None,
            };
            if let (Some(start), Some(end)) = (start, end) {
                if end < start {
                    r.error(&f, format!("end {end} is before start {start}"));
                } else {
                    let tasks = end - start + 1;
                    array = Some(TaskArray {
                        start,
                        end,
                        parallelism: concurrency.unwrap_or(tasks).min(tasks),
                    });
                }
            } else if r.errors.is_empty() {
                r.error(&f, "expected start and end");
            }
        }
        // Tasks read their index as FB_TASK_ID: in the command's words, and in the
        // environment through a shell the image must have.
        if let Some(words) = command.as_mut() {
            for word in words.iter_mut() {
                *word = word
                    .replace("${FB_TASK_ID}", "${ARRAY_INDEX}")
                    .replace("$FB_TASK_ID", "${ARRAY_INDEX}");
            }
            let mut wrapped = vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                "FB_TASK_ID=$ARRAY_INDEX; export FB_TASK_ID; exec \"$@\"".to_string(),
                "fuzzball-task".to_string(),
            ];
            wrapped.append(words);
            *words = wrapped;
        }
        r.note(
            &f,
            NoteKind::Warning,
            "each task's index reaches FB_TASK_ID through /bin/sh, which the image must have",
        );
    }
    if let Some(p) = step.get("policy") {
        let f = join(field, "policy");
        if let Some(p) = r.mapping(p, &f) {
            r.unknown(p, &f, &["timeout", "retry"]);
            match p.get("timeout").and_then(|t| t.get("execute")) {
                Some(Value::String(d)) => match duration(d) {
                    Ok(secs) => resources.walltime = Walltime::from_secs(secs),
                    Err(e) => r.error(&join(&f, "timeout.execute"), e),
                },
                Some(_) => r.error(
                    &join(&f, "timeout.execute"),
                    "expected a duration such as 2h or 30m",
                ),
                None => {}
            }
            r.ignore_key(p, &f, "retry", "Meridian places work again after a site fault; a task that fails by its own exit code is not retried");
        }
    }
    if step
        .get("policy")
        .and_then(|p| p.get("timeout"))
        .and_then(|t| t.get("execute"))
        .is_none()
    {
        r.note(
            field,
            NoteKind::Warning,
            format!(
                "no policy.timeout.execute: each task gets Meridian's default walltime, {}",
                Resources::default().walltime
            ),
        );
    }
    Some(Step::Job(Job {
        requires,
        image: image?,
        command: command?,
        env,
        cwd,
        mounts,
        resources,
        array,
        slurm: None,
    }))
}

/// A step's field over its default: mappings merge key by key, `env` lists by name; the
/// step's own value wins.
fn merged(key: &str, default: &Value, own: &Value) -> Value {
    match (default, own) {
        (Value::Object(d), Value::Object(o)) => {
            let mut out = d.clone();
            for (k, v) in o {
                let value = match out.get(k) {
                    Some(dv) => merged(k, dv, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), value);
            }
            Value::Object(out)
        }
        (Value::Array(d), Value::Array(o)) if key == "env" => {
            let name = |v: &Value| {
                v.as_str()
                    .and_then(|s| s.split_once('='))
                    .map(|(n, _)| n.to_string())
            };
            let own: Vec<Option<String>> = o.iter().map(name).collect();
            let mut out: Vec<Value> = d
                .iter()
                .filter(|v| name(v).is_none_or(|n| !own.contains(&Some(n))))
                .cloned()
                .collect();
            out.extend(o.iter().cloned());
            Value::Array(out)
        }
        _ => own.clone(),
    }
}

/// `command` (a list), or `script` (a shell script), and `args` after either.
fn command(r: &mut Reader, step: &Map<String, Value>, field: &str) -> Option<Vec<String>> {
    let mut command = match (step.get("command"), step.get("script")) {
        (Some(_), Some(_)) => {
            r.error(&join(field, "script"), "give command or script, not both");
            return None;
        }
        (Some(Value::Array(words)), None) => {
            let mut out = Vec::new();
            for (i, w) in words.iter().enumerate() {
                match w {
                    Value::String(s) => out.push(s.clone()),
                    Value::Number(n) => out.push(n.to_string()),
                    Value::Bool(b) => out.push(b.to_string()),
                    _ => r.error(&format!("{field}.command[{i}]"), "expected text"),
                }
            }
            out
        }
        (Some(_), None) => {
            r.error(&join(field, "command"), "expected a list of words");
            return None;
        }
        (None, Some(Value::String(script))) => match script.strip_prefix("#!") {
            // Run by its own interpreter from a file, as Fuzzball does; `sh -c` passes
            // `args` on as the file's arguments.
            Some(rest) => {
                let line = rest.split_once('\n').map_or(rest, |(line, _)| line);
                let interpreter: Vec<String> = line.split_whitespace().map(String::from).collect();
                if interpreter.is_empty() {
                    r.error(&join(field, "script"), "no interpreter follows #!");
                    return None;
                }
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    crate::sbatch::run_file(&interpreter, script, ""),
                    "script".into(),
                ]
            }
            None => vec![
                "/bin/sh".into(),
                "-c".into(),
                script.clone(),
                "script".into(),
            ],
        },
        (None, Some(_)) => {
            r.error(&join(field, "script"), "expected the script's text");
            return None;
        }
        (None, None) => {
            r.error(field, "expected command or script");
            return None;
        }
    };
    if let Some(args) = step.get("args") {
        match args.as_array() {
            Some(args) => {
                command.extend(args.iter().map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }));
            }
            None => r.error(&join(field, "args"), "expected a list"),
        }
    }
    if command.is_empty() {
        r.error(&join(field, "command"), "expected at least the program");
        return None;
    }
    Some(command)
}

/// `requires` (finished first) and `depends-on` (`{name, status}`), as step names.
fn requires(
    r: &mut Reader,
    step: &Map<String, Value>,
    field: &str,
    names: &Names,
    services: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |r: &mut Reader, name: &str, f: &str| match names.get(name) {
        Some(spec) => {
            if !out.contains(spec) {
                out.push(spec.clone());
            }
        }
        None => r.error(
            f,
            format!("{name:?} is neither a job nor a service of this Fuzzfile"),
        ),
    };
    if let Some(list) = step.get("depends-on") {
        r.ignore_key(
            step,
            field,
            "requires",
            "depends-on is given, and Fuzzball reads only that",
        );
        match list.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let f = format!("{field}.depends-on[{i}]");
                    let Some(name) = item.get("name").and_then(Value::as_str) else {
                        r.error(&f, "expected {name, status}");
                        continue;
                    };
                    let status = item
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("FINISHED");
                    let is_service = services.iter().any(|s| s == name);
                    match (status, is_service) {
                        ("RUNNING", true) | ("FINISHED", false) => {}
                        ("FINISHED", true) => r.note(
                            &f,
                            NoteKind::Warning,
                            format!("{name} is a service: Meridian starts this step once it is up, not after it ends"),
                        ),
                        ("RUNNING", false) => {
                            r.error(&f, format!("{name} is a job: a step can wait for it to finish, not to run"));
                            continue;
                        }
                        (other, _) => {
                            r.error(&join(&f, "status"), format!("expected FINISHED or RUNNING; got {other:?}"));
                            continue;
                        }
                    }
                    add(r, name, &f);
                }
            }
            None => r.error(&join(field, "depends-on"), "expected a list"),
        }
    } else if let Some(list) = step.get("requires") {
        match list.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let f = format!("{field}.requires[{i}]");
                    match item.as_str() {
                        Some(name) => {
                            if services.iter().any(|s| s == name) {
                                r.note(
                                    &f,
                                    NoteKind::Warning,
                                    format!("{name} is a service: Meridian starts this step once it is up, not after it ends"),
                                );
                            }
                            add(r, name, &f);
                        }
                        None => r.error(&f, "expected a step's name"),
                    }
                }
            }
            None => r.error(&join(field, "requires"), "expected a list of names"),
        }
    }
    out
}

fn resources(r: &mut Reader, value: Option<&Value>, field: &str) -> Resources {
    let mut resources = Resources::default();
    let Some(value) = value else {
        r.note(
            field,
            NoteKind::Warning,
            format!(
                "not given: {} CPU and {} of memory, Meridian's defaults",
                resources.cpus, resources.memory
            ),
        );
        return resources;
    };
    let Some(map) = r.mapping(value, field) else {
        return resources;
    };
    r.unknown(
        map,
        field,
        &["cpu", "memory", "devices", "exclusive", "annotations"],
    );
    if let Some(cpu) = map.get("cpu") {
        let f = join(field, "cpu");
        if let Some(cpu) = r.mapping(cpu, &f) {
            r.unknown(cpu, &f, &["cores", "affinity", "threads", "sockets"]);
            if let Some(n) = cpu
                .get("cores")
                .and_then(|c| r.whole(c, &join(&f, "cores"), 1))
            {
                resources.cpus = n;
            }
            for key in ["affinity", "threads", "sockets"] {
                r.ignore_key(cpu, &f, key, "CPU placement within a node is the site's");
            }
        }
    }
    if let Some(memory) = map.get("memory") {
        let f = join(field, "memory");
        if let Some(memory) = r.mapping(memory, &f) {
            r.unknown(memory, &f, &["size", "by-core"]);
            match memory.get("size") {
                Some(Value::String(s)) => match size(s) {
                    Ok(bytes) => {
                        let by_core = memory.get("by-core").and_then(Value::as_bool) == Some(true);
                        let total = if by_core {
                            bytes.saturating_mul(u64::from(resources.cpus))
                        } else {
                            bytes
                        };
                        resources.memory = Size::from_bytes(total);
                    }
                    Err(e) => r.error(&join(&f, "size"), e),
                },
                _ => r.error(&join(&f, "size"), "expected a size such as 4GiB"),
            }
        }
    }
    if let Some(devices) = map.get("devices") {
        let f = join(field, "devices");
        if let Some(devices) = r.mapping(devices, &f) {
            for (device, n) in devices {
                let vendor = match device.as_str() {
                    "nvidia.com/gpu" => GpuVendor::Nvidia,
                    "amd.com/gpu" => GpuVendor::Amd,
                    other => {
                        r.error(
                            &join(&f, other),
                            "only GPUs are carried over: nvidia.com/gpu or amd.com/gpu",
                        );
                        continue;
                    }
                };
                if resources.gpus.is_some() {
                    r.error(
                        &join(&f, device),
                        "GPUs of two vendors in one step are not supported",
                    );
                    continue;
                }
                if let Some(count) = r.whole(n, &join(&f, device), 1) {
                    resources.gpus = Some(Gpus {
                        count,
                        vendor,
                        model: None,
                        memory: None,
                    });
                }
            }
        }
    }
    r.ignore_key(
        map,
        field,
        "exclusive",
        "Meridian asks for the CPUs, memory and GPUs the step names",
    );
    r.ignore_key(
        map,
        field,
        "annotations",
        "node annotations are a cluster's own; a GPU model goes in the workflow's gpus.model",
    );
    resources
}

/// The service's port: the endpoint's port when it names one, else the first port.
fn service_port(r: &mut Reader, step: &Map<String, Value>, field: &str) -> Option<u16> {
    let f = join(field, "network");
    let Some(network) = step.get("network").and_then(|n| r.mapping(n, &f)) else {
        r.error(
            &f,
            "a service needs network.ports: Meridian follows it on its port",
        );
        return None;
    };
    r.unknown(network, &f, &["ports", "endpoints", "host"]);
    let ports: Vec<(String, u16)> = network
        .get("ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| {
                    let port = p
                        .get("port")
                        .and_then(Value::as_u64)
                        .and_then(|n| u16::try_from(n).ok())?;
                    let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
                    Some((name.to_string(), port))
                })
                .collect()
        })
        .unwrap_or_default();
    if ports.is_empty() {
        r.error(&join(&f, "ports"), "expected at least one {name, port}");
        return None;
    }
    r.ignore_key(network, &f, "endpoints", "Meridian gives each service one address (meridian status shows it); endpoint names, types and scopes are Fuzzball's");
    r.ignore_key(network, &f, "host", "a service's network is the site's");
    if ports.len() > 1 {
        r.note(
            &join(&f, "ports"),
            NoteKind::Warning,
            format!(
                "Meridian follows one port per service: {} ({}); the others are open only as the site allows",
                ports[0].1, ports[0].0
            ),
        );
    }
    Some(ports[0].1)
}

/// A Fuzzball size: a number (decimals allowed) and a unit (`B`, `KB`…`TB` of 1000,
/// `KiB`…`TiB` of 1024); bytes without one.
fn size(text: &str) -> Result<u64, String> {
    let expected = || format!("expected a size such as 4GiB, 500MB or 0.5GiB; got {text:?}");
    let at = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(at);
    let multiplier: u128 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(expected()),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') || fraction.len() > 9 {
        return Err(expected());
    }
    if whole.len() > 20 {
        return Err(format!("{text:?} is too large"));
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| expected())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| expected())?
    };
    let bytes = whole * multiplier + (fraction * multiplier).div_ceil(scale);
    match u64::try_from(bytes) {
        Ok(0) => Err(format!("{text:?} is no memory at all")),
        Ok(b) => Ok(b),
        Err(_) => Err(format!("{text:?} is too large")),
    }
}

/// A Go-style duration (`2h`, `30m`, `1h30m`, `150s`) in whole seconds.
fn duration(text: &str) -> Result<u64, String> {
    let expected = || format!("expected a duration such as 2h, 30m or 1h30m; got {text:?}");
    let mut total: u64 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return Err(expected());
    }
    while !rest.is_empty() {
        let at = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(expected)?;
        let (n, tail) = rest.split_at(at);
        let n: u64 = n.parse().map_err(|_| expected())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let secs = match unit {
            "h" => 3_600,
            "m" => 60,
            "s" => 1,
            _ => return Err(expected()),
        };
        total = n
            .checked_mul(secs)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = tail;
    }
    if total == 0 {
        return Err(format!("{text:?} is no time at all"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_decimal_and_binary_units() {
        assert_eq!(size("4GiB"), Ok(4 << 30));
        assert_eq!(size("2GB"), Ok(2_000_000_000));
        assert_eq!(size("0.5GiB"), Ok(1 << 29));
        assert_eq!(size("1024"), Ok(1024));
        for bad in ["", "4 GiB x", "GiB", "1.2.3GiB", "0GiB", "4gb"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_as_go_writes_them() {
        assert_eq!(duration("2h"), Ok(7_200));
        assert_eq!(duration("1h30m"), Ok(5_400));
        assert_eq!(duration("150s"), Ok(150));
        for bad in ["", "2", "h", "1.5h", "10ms", "0s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }
}
