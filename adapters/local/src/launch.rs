//! How a job becomes a command line (on the host, in podman or in apptainer) and the
//! `/bin/sh` wrapper that starts it only when the adapter says go and records its exit
//! status in the job directory.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use meridian_adapter_core::JobRequest;
use serde::{Deserialize, Serialize};

/// Which container runtime runs the jobs that name an image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerRuntime {
    /// `podman`, else `apptainer`, on the adapter's `PATH`, looked up at each submit (so
    /// installing one needs no restart).
    #[default]
    Detect,
    /// This podman binary.
    Podman(PathBuf),
    /// This apptainer (or singularity) binary.
    Apptainer(PathBuf),
    /// No containers here: jobs with an image fail as refused.
    None,
}

/// Why a job with an image fails when there is no runtime to run it.
pub const NO_CONTAINER_RUNTIME: &str =
    "no container runtime found (install podman or apptainer, or use image: host)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RuntimeKind {
    Host,
    Podman,
    Apptainer,
}

/// What was started, kept in `launch.json`: for people reading the job directory, and to
/// stop a podman container, which outlives its killed client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Launch {
    pub runtime: RuntimeKind,
    /// The program and its arguments, `argv[0]` as an absolute path when found on `PATH`.
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl Launch {
    pub fn on_host(&self) -> bool {
        self.runtime == RuntimeKind::Host
    }
}

/// A job ready to start: its command line and what to add to the adapter's environment.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub launch: Launch,
    pub env: Vec<(String, String)>,
    /// Contents of [`CONTAINER_ENV`] in the job directory, for podman's `--env-file`.
    pub env_file: Option<String>,
}

/// The podman env file: values there, unlike `--env K=V`, do not show in the process list.
pub(crate) const CONTAINER_ENV: &str = "container.env";

/// Plans `job`, whose directory is `dir`. `Err` says why the site cannot start it.
pub(crate) fn plan(
    job: &JobRequest,
    dir: &Path,
    runtime: &ContainerRuntime,
    devices: &[crate::gpu::Device],
) -> Result<Plan, String> {
    let command = job.task_command();
    let mut env: Vec<(String, String)> = job
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Ours come last, so a job cannot pass itself off as another, nor see GPUs it was
    // not given.
    env.extend(job.meridian_env());
    env.extend(crate::gpu::visible(devices));
    if let Some(port) = job.service_port() {
        env.push(("MERIDIAN_SERVICE_PORT".into(), port.to_string()));
    }
    let volumes = volume_dirs(job, dir)?;
    if job.container_image().is_none() {
        // On the host a volume cannot appear at its mount path without privileges: the
        // job finds its directory in MERIDIAN_VOLUME_<NAME> instead.
        env.extend(volumes.iter().map(|(name, host, _)| {
            (
                meridian_adapter_core::volume_variable(name),
                host.display().to_string(),
            )
        }));
    }

    let Some(image) = job.container_image() else {
        return plan_host(job, dir, command, env);
    };
    let container = format!("meridian-{}", job.job_id);
    match find_runtime(runtime)? {
        (RuntimeKind::Podman, podman) => {
            let mut argv = vec![podman, "run".into(), "--rm".into()];
            argv.extend(["--name".into(), container.clone()]);
            if let Some(service) = &job.service {
                argv.extend(["--publish".into(), format!("{0}:{0}", service.port)]);
            }
            // Each GPU by its UUID through the Container Device Interface (NVIDIA's
            // toolkit); AMD's through the kernel's devices, narrowed by ROCR_VISIBLE_DEVICES.
            for d in devices {
                match d.vendor.as_str() {
                    "amd" => {}
                    _ => argv.extend(["--device".into(), format!("nvidia.com/gpu={}", d.uuid)]),
                }
            }
            if devices.iter().any(|d| d.vendor == "amd") {
                argv.extend([
                    "--device".into(),
                    "/dev/kfd".into(),
                    "--device".into(),
                    "/dev/dri".into(),
                ]);
            }
            for (_, host, path) in &volumes {
                argv.extend(["--volume".into(), format!("{}:{path}", host.display())]);
            }
            let env_file_path = dir.join(CONTAINER_ENV).display().to_string();
            argv.extend(["--env-file".into(), env_file_path]);
            let mut env_file = String::new();
            for (k, v) in &env {
                // The file has one KEY=VALUE a line, `#` starts a comment and leading
                // blanks are dropped: what it cannot carry goes on the command line.
                let fits = !v.contains(['\n', '\r'])
                    && !k.starts_with('#')
                    && !k.contains(char::is_whitespace);
                if fits {
                    env_file.push_str(&format!("{k}={v}\n"));
                } else {
                    argv.extend(["--env".into(), format!("{k}={v}")]);
                }
            }
            if let Some(cwd) = &job.cwd {
                argv.extend(["--workdir".into(), cwd.clone()]);
            }
            argv.push(image.strip_prefix("docker://").unwrap_or(image).into());
            argv.extend(command);
            Ok(Plan {
                launch: Launch {
                    runtime: RuntimeKind::Podman,
                    argv,
                    cwd: dir.to_path_buf(),
                    container: Some(container),
                },
                // The container gets the job's environment, not the host's.
                env: Vec::new(),
                env_file: Some(env_file),
            })
        }
        (_, apptainer) => {
            let verb = if command.is_empty() { "run" } else { "exec" };
            let mut argv = vec![apptainer, verb.into()];
            match devices.first().map(|d| d.vendor.as_str()) {
                Some("amd") => argv.push("--rocm".into()),
                Some(_) => argv.push("--nv".into()),
                None => {}
            }
            for (_, host, path) in &volumes {
                argv.extend(["--bind".into(), format!("{}:{path}", host.display())]);
            }
            if let Some(cwd) = &job.cwd {
                argv.extend(["--pwd".into(), cwd.clone()]);
            }
            let reference = if image.contains("://") || image.starts_with('/') {
                image.to_string()
            } else {
                format!("docker://{image}")
            };
            argv.push(reference);
            argv.extend(command);
            Ok(Plan {
                launch: Launch {
                    runtime: RuntimeKind::Apptainer,
                    argv,
                    cwd: dir.to_path_buf(),
                    container: None,
                },
                // APPTAINERENV_X becomes X in the container; --env would split values at commas.
                env: env
                    .into_iter()
                    .map(|(k, v)| (format!("APPTAINERENV_{k}"), v))
                    .collect(),
                env_file: None,
            })
        }
    }
}

/// The site root's directory of volumes.
pub(crate) const VOLUMES: &str = "volumes";

/// Where each of the job's volumes lives on this machine: a directory per workflow and
/// volume under the site root (`<root>/volumes/<workflow>/<volume>`), made if needed.
/// Returns (volume, directory, path in the job).
fn volume_dirs(job: &JobRequest, dir: &Path) -> Result<Vec<(String, PathBuf, String)>, String> {
    // The job directory is `<root>/jobs/<job id>`.
    let Some(root) = dir.parent().and_then(Path::parent) else {
        return Ok(Vec::new());
    };
    job.mounts
        .iter()
        .map(|(volume, path)| {
            let host =
                meridian_adapter_core::volume_dir(&root.join(VOLUMES), job.workflow_id, volume);
            std::fs::create_dir_all(&host)
                .map_err(|e| format!("cannot make the directory of volume {volume}: {e}"))?;
            Ok((volume.clone(), host, path.clone()))
        })
        .collect()
}

fn plan_host(
    job: &JobRequest,
    dir: &Path,
    mut argv: Vec<String>,
    env: Vec<(String, String)>,
) -> Result<Plan, String> {
    let cwd = match &job.cwd {
        // Relative to the job directory; join keeps an absolute one as it is.
        Some(cwd) => {
            let path = dir.join(cwd);
            if !path.is_dir() {
                return Err(format!("the working directory {cwd} does not exist"));
            }
            path
        }
        None => dir.to_path_buf(),
    };
    let search = job
        .env
        .get("PATH")
        .map(OsString::from)
        .or_else(|| std::env::var_os("PATH"));
    let program = argv.first().ok_or("a job on the host needs a command")?;
    // An absolute path also keeps the wrapper shell from taking `exit` or `exec` as its own
    // builtins, which would end the wrapper before it records the exit status.
    argv[0] = resolve_program(program, &cwd, search)?;
    Ok(Plan {
        launch: Launch {
            runtime: RuntimeKind::Host,
            argv,
            cwd,
            container: None,
        },
        env,
        env_file: None,
    })
}

/// Finds `name` as the shell would: as a path when it has a slash, else on `search`.
fn resolve_program(name: &str, cwd: &Path, search: Option<OsString>) -> Result<String, String> {
    if name.contains('/') {
        return if is_executable(&cwd.join(name)) {
            Ok(name.to_string())
        } else {
            Err(format!(
                "the command {name} does not exist or is not executable"
            ))
        };
    }
    let search = search.unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&search) {
        // An empty PATH entry means the working directory.
        let candidate = cwd.join(dir).join(name);
        if is_executable(&candidate) {
            return candidate
                .into_os_string()
                .into_string()
                .map_err(|p| format!("the path of {name}, {p:?}, is not UTF-8"));
        }
    }
    Err(format!("the command {name} is not found on PATH"))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn find_runtime(runtime: &ContainerRuntime) -> Result<(RuntimeKind, String), String> {
    let configured = |kind, path: &PathBuf| {
        if is_executable(path) {
            Ok((kind, path.display().to_string()))
        } else {
            Err(format!(
                "the configured container runtime {} does not exist or is not executable",
                path.display()
            ))
        }
    };
    match runtime {
        ContainerRuntime::Podman(path) => configured(RuntimeKind::Podman, path),
        ContainerRuntime::Apptainer(path) => configured(RuntimeKind::Apptainer, path),
        ContainerRuntime::None => Err(NO_CONTAINER_RUNTIME.into()),
        ContainerRuntime::Detect => {
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            let search = std::env::var_os("PATH");
            [
                (RuntimeKind::Podman, "podman"),
                (RuntimeKind::Apptainer, "apptainer"),
            ]
            .into_iter()
            .find_map(|(kind, name)| {
                resolve_program(name, &cwd, search.clone())
                    .ok()
                    .map(|path| (kind, path))
            })
            .ok_or_else(|| NO_CONTAINER_RUNTIME.into())
        }
    }
}

/// Runs as `sh -c WRAPPER <job dir> <argv...>`. It waits for the adapter's `go` on stdin, so
/// a job whose pid the adapter failed to record (it died) never runs; then it runs the
/// command and writes its status, newline-terminated, to `exit_code`, and the CPU time of
/// the command to `times`. It sets no variables the command could see.
const WRAPPER: &str = r#"read -r meridian_go || exit 90
exec </dev/null
"$@"
set -- "$?"
times > "$0/times"
printf '%s\n' "$1" > "$0/exit_code"
exit "$1"
"#;

/// The wrapper of a service: as [`WRAPPER`], but a command that ends is started again,
/// up to `$1` times (a second apart), each restart noted in `restarts`; the status
/// recorded is the last run's.
const SERVICE_WRAPPER: &str = r#"read -r meridian_go || exit 90
exec </dev/null
meridian_left=$1
shift
while :; do
"$@"
meridian_status=$?
[ "$meridian_left" -gt 0 ] || break
meridian_left=$((meridian_left - 1))
printf 'exit %s\n' "$meridian_status" >> "$0/restarts"
printf 'meridian: the service exited with status %s; starting it again\n' "$meridian_status" >&2
sleep 1
done
times > "$0/times"
printf '%s\n' "$meridian_status" > "$0/exit_code"
exit "$meridian_status"
"#;

/// The wrapper command for `plan`, in its own process group so the whole tree can be
/// signalled at once. `restarts` is set for a service.
pub(crate) fn command(
    plan: &Plan,
    dir: &Path,
    stdout: File,
    stderr: File,
    restarts: Option<u32>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("/bin/sh");
    command.arg("-c");
    match restarts {
        Some(n) => command.arg(SERVICE_WRAPPER).arg(dir).arg(n.to_string()),
        None => command.arg(WRAPPER).arg(dir),
    };
    command
        .args(&plan.launch.argv)
        .current_dir(&plan.launch.cwd)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(false);
    command
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use meridian_adapter_core::Resources;
    use uuid::Uuid;

    use super::*;

    fn job(image: Option<&str>, command: &[&str]) -> JobRequest {
        JobRequest {
            job_id: Uuid::now_v7(),
            workflow_id: Uuid::now_v7(),
            name: "t".into(),
            array_index: Some(4),
            image: image.map(String::from),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("A".to_string(), "x,y".to_string())]),
            cwd: Some("/work".into()),
            resources: Resources {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1,
                walltime: Duration::from_secs(1),
                gpus: None,
            },
            service: None,
            mounts: Default::default(),
            volume_sizes: Default::default(),
            tenant: None,
            shape: None,
            report_to: None,
            slurm: None,
        }
    }

    #[test]
    fn host_command_is_resolved_and_substituted() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = job(Some("host"), &["sh", "-c", "echo ${ARRAY_INDEX}"]);
        j.cwd = None;
        let plan = plan(&j, tmp.path(), &ContainerRuntime::None, &[]).unwrap();
        assert!(plan.launch.on_host());
        assert!(
            plan.launch.argv[0].ends_with("/sh"),
            "{:?}",
            plan.launch.argv
        );
        assert_eq!(plan.launch.argv[1..], ["-c", "echo 4"]);
        assert_eq!(plan.launch.cwd, tmp.path());
        assert!(plan.env.contains(&("ARRAY_INDEX".into(), "4".into())));
        assert!(plan
            .env
            .contains(&("MERIDIAN_ARRAY_INDEX".into(), "4".into())));
    }

    #[test]
    fn podman_gets_env_flags_and_a_plain_image() {
        let tmp = tempfile::tempdir().unwrap();
        let podman = tmp.path().join("podman");
        std::fs::write(&podman, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&podman, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut j = job(Some("docker://busybox:1.36"), &["echo", "${ARRAY_INDEX}"]);
        j.env.insert("B".into(), "two\nlines".into());
        let plan = plan(
            &j,
            tmp.path(),
            &ContainerRuntime::Podman(podman.clone()),
            &[],
        )
        .unwrap();
        let argv = &plan.launch.argv;
        let name = format!("meridian-{}", j.job_id);
        assert_eq!(
            argv[..5],
            [
                podman.display().to_string(),
                "run".into(),
                "--rm".into(),
                "--name".into(),
                name
            ]
        );
        let env_file = tmp.path().join(CONTAINER_ENV).display().to_string();
        assert!(argv.windows(2).any(|w| w == ["--env-file", &env_file]));
        assert!(argv.windows(2).any(|w| w == ["--env", "B=two\nlines"]));
        assert!(
            !argv.iter().any(|a| a.starts_with("A=")),
            "A is in the file"
        );
        assert!(argv.windows(2).any(|w| w == ["--workdir", "/work"]));
        assert_eq!(argv[argv.len() - 3..], ["busybox:1.36", "echo", "4"]);
        assert!(plan.env.is_empty());
        let file = plan.env_file.expect("an env file");
        assert!(file.starts_with("A=x,y\nMERIDIAN_JOB_ID="), "{file}");
        assert!(
            file.ends_with("MERIDIAN_ARRAY_INDEX=4\nARRAY_INDEX=4\n"),
            "{file}"
        );
    }

    #[test]
    fn missing_runtime_is_a_refusal() {
        let tmp = tempfile::tempdir().unwrap();
        let j = job(Some("docker://busybox"), &["true"]);
        assert_eq!(
            plan(&j, tmp.path(), &ContainerRuntime::None, &[]).unwrap_err(),
            NO_CONTAINER_RUNTIME
        );
        let gone = ContainerRuntime::Apptainer(tmp.path().join("nope"));
        assert!(plan(&j, tmp.path(), &gone, &[])
            .unwrap_err()
            .contains("nope"));
    }
}
