//! The bootstrap every cloud instance boots with (its cloud-init user data, a `/bin/sh`
//! script): it reports the start to Meridian's API with the run's own credential, runs
//! the job (in a container with the GPU runtime of the shape's vendor, or on the host),
//! sends its output and its exit code, and powers the instance off, which terminates it
//! (the instances are launched to terminate on shutdown).
//!
//! It needs `sh` and `curl` on the image, and Docker for jobs with an image; a report
//! that cannot be sent is retried, and the instance powers off regardless, so a broken
//! network costs at most the walltime and its grace (the adapter's backstop).

use meridian_adapter_core::batch::shell_quote;
use meridian_adapter_core::{volume_variable, JobRequest, ReportTo};

/// What the bootstrap needs besides the job.
#[derive(Debug, Clone)]
pub struct BootstrapSettings {
    /// Where the job's volumes and output live on the instance.
    pub work_dir: String,
    /// What powers the instance off when the job is done.
    pub power_off_command: String,
    /// The container runtime for jobs with an image (`docker`).
    pub container_runtime: String,
    /// Seconds between sends of the output while the job runs.
    pub output_every_secs: u32,
}

/// The most of each output stream sent: the API keeps the last 1 MiB.
const OUTPUT_TAIL_BYTES: u32 = 1 << 20;

/// The bootstrap of `job` on a shape with accelerators of `gpu_vendor`.
pub fn script(
    job: &JobRequest,
    gpu_vendor: Option<&str>,
    report_to: &ReportTo,
    settings: &BootstrapSettings,
) -> String {
    let q = |s: &str| shell_quote(s);
    let mut out = String::new();
    let line = |out: &mut String, text: &str| {
        out.push_str(text);
        out.push('\n');
    };
    line(&mut out, "#!/bin/sh");
    line(
        &mut out,
        &format!(
            "# Meridian bootstrap: job {} ({}) of workflow {}",
            job.job_id,
            job.name.replace('\n', " "),
            job.workflow_id
        ),
    );
    line(&mut out, "set -u");
    line(
        &mut out,
        &format!("meridian_api={}", q(report_to.server.trim_end_matches('/'))),
    );
    line(
        &mut out,
        &format!("meridian_run_token={}", q(&report_to.credential)),
    );
    line(&mut out, &format!("meridian_job={}", job.job_id));
    line(&mut out, &format!("work={}", q(&settings.work_dir)));
    line(&mut out, "mkdir -p \"$work\" && cd \"$work\" || exit 1");
    // Report helpers: retried, never fatal.
    line(
        &mut out,
        r#"report() { curl -fsS --retry 8 --retry-all-errors --retry-max-time 120 -o /dev/null -X POST -H "Authorization: Bearer $meridian_run_token" -H 'Content-Type: application/json' --data-binary "$1" "$meridian_api/v1/runs/$meridian_job/report" || echo "meridian: could not report $1" >&2; }"#,
    );
    line(
        &mut out,
        &format!(
            r#"send_output() {{ for s in stdout stderr; do tail -c {OUTPUT_TAIL_BYTES} "$work/$s" 2>/dev/null | curl -fsS --retry 4 --retry-all-errors -o /dev/null -X PUT -H "Authorization: Bearer $meridian_run_token" -H 'Content-Type: text/plain' --data-binary @- "$meridian_api/v1/runs/$meridian_job/output/$s" || echo "meridian: could not send $s" >&2; done; }}"#
        ),
    );
    line(
        &mut out,
        &format!("power_off() {{ {}; }}", settings.power_off_command),
    );
    // The job's environment: its own first, Meridian's after, so a job cannot pass
    // itself off as another.
    let mut names = Vec::new();
    for (name, value) in job
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(job.meridian_env())
    {
        line(&mut out, &format!("export {name}={}", q(&value)));
        names.push(name);
    }
    // Volumes: a directory each on the instance's disk.
    let mut binds = Vec::new();
    for (volume, path) in &job.mounts {
        let variable = volume_variable(volume);
        line(
            &mut out,
            &format!(
                "export {variable}=\"$work/volumes/{}\"; mkdir -p \"${variable}\"",
                volume_dir_name(volume)
            ),
        );
        binds.push((variable, path.clone()));
    }
    line(&mut out, ": >\"$work/stdout\"; : >\"$work/stderr\"");
    line(&mut out, "report '{\"event\":\"started\"}'");
    // Output goes out now and then while the job runs, so a run killed at its walltime
    // still leaves what it printed.
    line(
        &mut out,
        &format!(
            "( while sleep {}; do send_output; done ) & sender=$!",
            settings.output_every_secs.max(1)
        ),
    );
    let command: Vec<String> = job.task_command().iter().map(|a| q(a)).collect();
    match job.container_image() {
        Some(image) => {
            let image = image.strip_prefix("docker://").unwrap_or(image);
            let mut run = vec![
                settings.container_runtime.clone(),
                "run".into(),
                "--rm".into(),
                format!("--name=meridian-{}", job.job_id.simple()),
            ];
            match gpu_vendor {
                Some("nvidia") => run.push("--gpus=all".into()),
                Some("amd") => run.extend(
                    [
                        "--device=/dev/kfd",
                        "--device=/dev/dri",
                        "--group-add=video",
                        "--security-opt=seccomp=unconfined",
                    ]
                    .map(String::from),
                ),
                _ => {}
            }
            for name in &names {
                run.push(format!("--env={name}"));
            }
            // In the container a volume is at its mount path.
            for (variable, path) in &binds {
                run.push(format!("--volume=\"${variable}\":{}", q(path)));
                run.push(format!("--env={variable}={}", q(path)));
            }
            if let Some(cwd) = &job.cwd {
                run.push(format!("--workdir={}", q(cwd)));
            }
            run.push(q(image));
            run.extend(command);
            line(
                &mut out,
                &format!("{} >>\"$work/stdout\" 2>>\"$work/stderr\"", run.join(" ")),
            );
        }
        None => {
            let cd = job
                .cwd
                .as_deref()
                .map(|cwd| format!("cd {} && ", q(cwd)))
                .unwrap_or_default();
            line(
                &mut out,
                &format!(
                    "( {cd}exec {} ) </dev/null >>\"$work/stdout\" 2>>\"$work/stderr\"",
                    command.join(" ")
                ),
            );
        }
    }
    line(&mut out, "code=$?");
    line(&mut out, "kill \"$sender\" 2>/dev/null");
    line(&mut out, "send_output");
    line(
        &mut out,
        "report \"{\\\"event\\\":\\\"exited\\\",\\\"exit_code\\\":$code}\"",
    );
    line(&mut out, "power_off");
    out
}

/// A volume's directory name on the instance: its name, with anything a path could
/// misread replaced.
fn volume_dir_name(volume: &str) -> String {
    volume
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use uuid::Uuid;

    use super::*;

    fn job(image: Option<&str>) -> JobRequest {
        JobRequest {
            job_id: Uuid::nil(),
            workflow_id: Uuid::max(),
            image: image.map(String::from),
            env: BTreeMap::from([("GREETING".into(), "a b".into())]),
            mounts: BTreeMap::from([("data".into(), "/data".into())]),
            ..JobRequest::new("train", &["echo", "it's here"])
        }
    }

    fn settings() -> BootstrapSettings {
        BootstrapSettings {
            work_dir: "/var/lib/meridian".into(),
            power_off_command: "shutdown -h now".into(),
            container_runtime: "docker".into(),
            output_every_secs: 30,
        }
    }

    fn to() -> ReportTo {
        ReportTo {
            server: "https://meridian.example/".into(),
            credential: "mer_run_x_y".into(),
        }
    }

    #[test]
    fn a_host_job_is_quoted_and_powers_off_last() {
        let s = script(&job(None), None, &to(), &settings());
        assert!(s.starts_with("#!/bin/sh\n"), "{s}");
        assert!(s.contains("exec echo 'it'\\''s here'"), "{s}");
        assert!(s.contains("export GREETING='a b'"), "{s}");
        assert!(s.contains("meridian_api=https://meridian.example\n"), "{s}");
        assert!(s.trim_end().ends_with("power_off"), "{s}");
        assert!(!s.contains("docker"), "{s}");
    }

    #[test]
    fn a_container_gets_the_runtime_of_its_vendor() {
        let nvidia = script(
            &job(Some("docker://pytorch/pytorch:2")),
            Some("nvidia"),
            &to(),
            &settings(),
        );
        assert!(nvidia.contains("docker run --rm"), "{nvidia}");
        assert!(nvidia.contains("--gpus=all"), "{nvidia}");
        assert!(nvidia.contains(" pytorch/pytorch:2 echo"), "{nvidia}");
        assert!(nvidia.contains("--env=MERIDIAN_JOB_ID"), "{nvidia}");
        assert!(
            nvidia.contains("--volume=\"$MERIDIAN_VOLUME_DATA\":/data"),
            "{nvidia}"
        );
        let amd = script(&job(Some("rocm/pytorch")), Some("amd"), &to(), &settings());
        assert!(amd.contains("--device=/dev/kfd"), "{amd}");
        assert!(!amd.contains("--gpus"), "{amd}");
    }
}
