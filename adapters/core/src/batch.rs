//! What the batch-scheduler adapters (Slurm, PBS) share: the `/bin/sh` job script they
//! submit, and quoting for it. Each adapter adds only its scheduler's arguments.

use std::path::Path;

use crate::JobRequest;

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
}

/// The job script of `job`: a header, the job's variables then Meridian's (so a job
/// cannot pass itself off as another), and `exec` of its command, inside the container
/// runtime when it names an image, so the command itself gets the scheduler's signals.
/// `Err` says why the site can never run it.
pub fn job_script(job: &JobRequest, options: &ScriptOptions) -> Result<String, String> {
    let mut script = String::from("#!/bin/sh\n");
    script.push_str(&format!(
        "# Meridian job {} of workflow {}: {}\n",
        job.job_id, job.workflow_id, options.title
    ));
    if let Some(dir) = options.cd_to {
        script.push_str(&format!(
            "cd {} || exit 1\n",
            shell_quote(&dir.display().to_string())
        ));
    }
    let meridian_env = job.meridian_env();
    for (k, v) in job
        .env
        .iter()
        .chain(meridian_env.iter().map(|(k, v)| (k, v)))
    {
        script.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    let command = job.task_command();
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
        argv.push(if image.contains("://") || image.starts_with('/') {
            image.to_string()
        } else {
            format!("docker://{image}")
        });
    }
    argv.extend(command);
    let line: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
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
