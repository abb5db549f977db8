//! What the batch-scheduler adapters (Slurm, PBS) share: the `/bin/sh` job script they
//! submit, and quoting for it. Each adapter adds only its scheduler's arguments.

use std::path::Path;

use crate::{ArrayRequest, ArrayTask, JobRequest};

/// Quotes `s` for a POSIX shell: as it is when that is safe, else in single quotes.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// How the script starts the job.
pub struct ScriptOptions<'a> {
    /// The scheduler's name for the job, shown in the script's header.
    pub title: &'a str,
    /// `cd` here first (PBS starts jobs in the home directory; Slurm has `--chdir`).
    pub cd_to: Option<&'a Path>,
    /// The working directory a container gets (`--pwd`) when the job names one.
    pub cwd: &'a Path,
    /// The apptainer (or singularity) command for jobs with an image; none refuses them.
    pub container_runtime: Option<&'a str>,
    /// The scheduler, for messages ("Slurm", "PBS").
    pub scheduler: &'a str,
    /// The directory every compute node shares that holds the site's volumes (each at
    /// [`crate::volume_dir`]); without one, a job that mounts a volume is refused.
    pub volume_root: Option<&'a Path>,
}

/// The job script of `job`: a header, the job's variables then Meridian's (so a job
/// cannot pass itself off as another), and `exec` of its command, inside the container
/// runtime when it names an image, so the command itself gets the scheduler's signals.
/// `Err` says why the site can never run it.
pub fn job_script(job: &JobRequest, options: &ScriptOptions) -> Result<String, String> {
    script(job, options, None)
}

/// How an array's script tells its tasks apart: the scheduler's variable that holds a
/// task's index in the submission (`SLURM_ARRAY_TASK_ID`, `PBS_ARRAY_INDEX`), and each
/// task with the index the scheduler gives it.
pub struct ArrayTasks<'a> {
    pub index_var: &'a str,
    pub tasks: Vec<(u32, &'a ArrayTask)>,
}

/// The one script every task of `array` runs: like [`job_script`], with a `case` on
/// the scheduler's task index that sets each task's `MERIDIAN_JOB_ID` and
/// `ARRAY_INDEX`, and `${ARRAY_INDEX}` in the command left for the shell to expand.
pub fn array_script(
    array: &ArrayRequest,
    options: &ScriptOptions,
    tasks: &ArrayTasks,
) -> Result<String, String> {
    script(&array.template, options, Some(tasks))
}

fn script(
    job: &JobRequest,
    options: &ScriptOptions,
    array: Option<&ArrayTasks>,
) -> Result<String, String> {
    let mut script = String::from("#!/bin/sh\n");
    match array {
        None => script.push_str(&format!(
            "# Meridian job {} of workflow {}: {}\n",
            job.job_id, job.workflow_id, options.title
        )),
        Some(a) => script.push_str(&format!(
            "# Meridian array of {} task(s) of workflow {}: {}\n",
            a.tasks.len(),
            job.workflow_id,
            options.title
        )),
    }
    if let Some(dir) = options.cd_to {
        script.push_str(&format!(
            "cd {} || exit 1\n",
            shell_quote(&dir.display().to_string())
        ));
    }
    // An array's tasks share every variable but their own ids, set by the `case`.
    let meridian_env: Vec<(String, String)> = match array {
        None => job.meridian_env(),
        Some(_) => vec![("MERIDIAN_WORKFLOW_ID".into(), job.workflow_id.to_string())],
    };
    for (k, v) in job
        .env
        .iter()
        .chain(meridian_env.iter().map(|(k, v)| (k, v)))
    {
        script.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    // Each volume's directory on the shared file system: made if needed, named to a job
    // on the host by MERIDIAN_VOLUME_<NAME>, bound at its mount path in a container.
    let mut binds = Vec::new();
    for (volume, at) in &job.mounts {
        let Some(root) = options.volume_root else {
            return Err(format!(
                "this {} site has no shared volume path (volume_root in its adapter \
                 config), so the job cannot mount volume {volume}",
                options.scheduler
            ));
        };
        let host = crate::volume_dir(root, job.workflow_id, volume)
            .display()
            .to_string();
        script.push_str(&format!("mkdir -p {} || exit 1\n", shell_quote(&host)));
        if job.container_image().is_none() {
            script.push_str(&format!(
                "export {}={}\n",
                crate::volume_variable(volume),
                shell_quote(&host)
            ));
        }
        binds.push(format!("{host}:{at}"));
    }
    if let Some(a) = array {
        script.push_str(&task_table(a));
    }
    let command = match array {
        None => job.task_command(),
        Some(_) => job.command.clone(),
    };
    let mut argv: Vec<String> = Vec::new();
    if let Some(image) = job.container_image() {
        let Some(runtime) = options.container_runtime else {
            return Err(format!(
                "this {} site runs no containers (no container_runtime configured); \
                 the job asks for {image}",
                options.scheduler
            ));
        };
        argv.push(runtime.to_string());
        argv.push(if command.is_empty() { "run" } else { "exec" }.into());
        if job.cwd.is_some() {
            argv.extend(["--pwd".into(), options.cwd.display().to_string()]);
        }
        for bind in &binds {
            argv.extend(["--bind".into(), bind.clone()]);
        }
        argv.push(if image.contains("://") || image.starts_with('/') {
            image.to_string()
        } else {
            format!("docker://{image}")
        });
    }
    argv.extend(command);
    let line: Vec<String> = argv
        .iter()
        .map(|a| match array {
            None => shell_quote(a),
            Some(_) => quote_with_index(a),
        })
        .collect();
    match &job.service {
        // A service that exits is started again, up to its limit, a second apart; the
        // script ends with the last run's status.
        Some(service) => script.push_str(&format!(
            "export MERIDIAN_SERVICE_PORT={port}\n\
             meridian_left={restarts}\n\
             while :; do\n\
             {line}\n\
             meridian_status=$?\n\
             [ \"$meridian_left\" -gt 0 ] || exit \"$meridian_status\"\n\
             meridian_left=$((meridian_left - 1))\n\
             echo \"meridian: the service exited with status $meridian_status; starting it again\" >&2\n\
             sleep 1\n\
             done\n",
            port = service.port,
            restarts = service.max_restarts,
            line = line.join(" "),
        )),
        None => script.push_str(&format!("exec {}\n", line.join(" "))),
    }
    Ok(script)
}

/// The `case` on the site's task index that sets each task's `MERIDIAN_JOB_ID`,
/// `ARRAY_INDEX` and `MERIDIAN_ARRAY_INDEX`, and exports them; an index the array does
/// not have fails the task.
pub fn task_table(tasks: &ArrayTasks) -> String {
    let mut table = format!("case \"${}\" in\n", tasks.index_var);
    for (site_index, task) in &tasks.tasks {
        table.push_str(&format!(
            "{site_index}) MERIDIAN_JOB_ID={} ARRAY_INDEX={} ;;\n",
            task.job_id, task.index
        ));
    }
    table.push_str(&format!(
        "*) echo \"meridian: no task of this array has index ${}\" >&2; exit 1 ;;\nesac\n\
         MERIDIAN_ARRAY_INDEX=$ARRAY_INDEX\n\
         export MERIDIAN_JOB_ID ARRAY_INDEX MERIDIAN_ARRAY_INDEX\n",
        tasks.index_var
    ));
    table
}

/// Quotes `arg` for a POSIX shell, leaving each `${ARRAY_INDEX}` in it for the shell to
/// expand (an array task's index is known only when it runs).
pub fn quote_with_index(arg: &str) -> String {
    const INDEX: &str = "${ARRAY_INDEX}";
    if !arg.contains(INDEX) {
        return shell_quote(arg);
    }
    arg.split(INDEX)
        .map(|part| match part {
            "" => String::new(),
            part => shell_quote(part),
        })
        .collect::<Vec<_>>()
        .join("\"$ARRAY_INDEX\"")
}
