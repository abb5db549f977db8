//! What only the local site does: processes, directories, container runtimes and the
//! things that can go wrong on one machine. Real processes throughout.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use meridian_adapter_core::conformance::{wait_final, wait_for, wait_running, ConformanceOptions};
use meridian_adapter_core::{
    AdapterError, BackendJobId, FailureReason, Gpus, JobRequest, JobState, SiteAdapter, Usage,
};
use meridian_adapter_local::{ContainerRuntime, LocalAdapter, LocalConfig, NO_CONTAINER_RUNTIME};
use tempfile::TempDir;
use tokio::time::Instant;

mod common;

struct Site {
    // Declared first, so dropped first: jobs are killed before their directory goes.
    _leftovers: common::KillLeftovers,
    tmp: TempDir,
    options: ConformanceOptions,
}

impl Site {
    fn new() -> Site {
        let tmp = tempfile::tempdir().expect("tempdir");
        let options = ConformanceOptions::new(tmp.path());
        let _leftovers = common::KillLeftovers {
            root: tmp.path().join("site"),
        };
        Site {
            _leftovers,
            tmp,
            options,
        }
    }

    fn config(&self) -> LocalConfig {
        let mut config = LocalConfig::new(self.tmp.path().join("site"));
        config.container_runtime = ContainerRuntime::None;
        // This machine's GPUs, if any, are no part of these tests.
        config.discover_gpus = false;
        config
    }

    fn open(&self) -> LocalAdapter {
        self.open_with(self.config())
    }

    fn open_with(&self, config: LocalConfig) -> LocalAdapter {
        LocalAdapter::new(config).expect("open local site")
    }

    fn job(&self, command: &[&str]) -> JobRequest {
        self.options.job("local", command)
    }

    /// An executable script in the temporary directory.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.tmp.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

async fn run(adapter: &LocalAdapter, site: &Site, job: &JobRequest) -> (BackendJobId, JobState) {
    let id = adapter.submit(job).await.expect("submit");
    let report = wait_final(adapter, &id, &site.options).await;
    (id, report.state)
}

async fn stdout(adapter: &LocalAdapter, id: &BackendJobId) -> String {
    adapter.logs(id).await.expect("logs").stdout
}

fn refusal(state: &JobState) -> &str {
    match state {
        JobState::Failed {
            started_at: None,
            failure: FailureReason::Other { message },
            exit_code: None,
            ..
        } => message,
        other => panic!("expected a refusal before start, got {other:?}"),
    }
}

/// Live (not zombie) processes in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        if fields[2] == pgid.to_string() && !matches!(fields[0], "Z" | "X") {
            members.push(pid);
        }
    }
    members
}

fn pid_of(adapter: &LocalAdapter, job: &JobRequest) -> u32 {
    let text = std::fs::read_to_string(adapter.job_dir(job.job_id).join("pid")).unwrap();
    text.trim().parse().unwrap()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn env_and_cwd_are_honoured() {
    let site = Site::new();
    let adapter = site.open();
    let cwd = site.tmp.path().join("work dir");
    std::fs::create_dir(&cwd).unwrap();
    let mut job = site.job(&[
        "sh",
        "-c",
        "pwd; echo \"$FOO\"; echo \"${PATH:+inherited}\"",
    ]);
    job.env.insert("FOO".into(), "bar baz".into());
    job.cwd = Some(cwd.display().to_string());
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let want = format!("{}\nbar baz\ninherited\n", cwd.display());
    assert_eq!(
        stdout(&adapter, &id).await,
        want,
        "cwd, env, and the inherited environment"
    );
}

#[tokio::test]
async fn default_cwd_is_the_job_directory() {
    let site = Site::new();
    let adapter = site.open();
    let job = site.job(&["pwd"]);
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let dir = adapter.job_dir(job.job_id);
    assert_eq!(stdout(&adapter, &id).await, format!("{}\n", dir.display()));
    for file in [
        "request.json",
        "pid",
        "started_at",
        "exit_code",
        "stdout",
        "stderr",
    ] {
        assert!(dir.join(file).exists(), "{file} is in the job directory");
    }
}

#[tokio::test]
async fn array_index_is_substituted_and_exported() {
    let site = Site::new();
    let adapter = site.open();
    let mut job = site.job(&[
        "sh",
        "-c",
        "echo \"$1 ${ARRAY_INDEX} $MERIDIAN_ARRAY_INDEX\"",
        "sh",
        "x${ARRAY_INDEX}y${ARRAY_INDEX}",
    ]);
    job.array_index = Some(12);
    let (id, _) = run(&adapter, &site, &job).await;
    assert_eq!(stdout(&adapter, &id).await, "x12y12 12 12\n");

    // Not an array task: the text stays as written, and the variables are unset.
    let job = site.job(&[
        "sh",
        "-c",
        "echo \"[$1] [${MERIDIAN_ARRAY_INDEX-unset}]\"",
        "sh",
        "${ARRAY_INDEX}",
    ]);
    let (id, _) = run(&adapter, &site, &job).await;
    assert_eq!(stdout(&adapter, &id).await, "[${ARRAY_INDEX}] [unset]\n");
}

#[tokio::test]
async fn missing_cwd_is_refused_with_its_path() {
    let site = Site::new();
    let adapter = site.open();
    let mut job = site.job(&["true"]);
    job.cwd = Some("/no/such/dir".into());
    let (id, state) = run(&adapter, &site, &job).await;
    assert_eq!(
        refusal(&state),
        "the working directory /no/such/dir does not exist"
    );
    let logs = adapter.logs(&id).await.unwrap();
    assert!(logs.stderr.contains("/no/such/dir"), "{logs:?}");
    let report = adapter.status(&id).await.unwrap();
    assert_eq!(
        report.usage,
        Usage::default(),
        "a job that never ran used nothing"
    );
}

#[tokio::test]
async fn unknown_commands_and_shell_builtins_are_refused() {
    let site = Site::new();
    let adapter = site.open();
    for command in ["no-such-command-for-meridian", "exit", "exec"] {
        let job = site.job(&[command, "3"]);
        let (_, state) = run(&adapter, &site, &job).await;
        assert_eq!(
            refusal(&state),
            format!("the command {command} is not found on PATH")
        );
    }
    let job = site.job(&["./missing.sh"]);
    let (_, state) = run(&adapter, &site, &job).await;
    assert!(refusal(&state).contains("./missing.sh"), "{state:?}");
}

#[tokio::test]
async fn image_without_container_runtime_is_refused() {
    let site = Site::new();
    let adapter = site.open();
    let mut job = site.job(&["echo", "hi"]);
    job.image = Some("docker://busybox:1.36".into());
    let id = adapter
        .submit(&job)
        .await
        .expect("accepted, then failed at the site");
    let state = wait_final(&adapter, &id, &site.options).await.state;
    assert_eq!(refusal(&state), NO_CONTAINER_RUNTIME);
    assert_eq!(
        NO_CONTAINER_RUNTIME,
        "no container runtime found (install podman or apptainer, or use image: host)"
    );
    assert!(adapter
        .logs(&id)
        .await
        .unwrap()
        .stderr
        .contains(NO_CONTAINER_RUNTIME));

    let mut config = site.config();
    config.container_runtime = ContainerRuntime::Podman(site.tmp.path().join("no-podman"));
    let adapter = site.open_with(config);
    let mut job = job.clone();
    job.job_id = uuid::Uuid::now_v7();
    let (_, state) = run(&adapter, &site, &job).await;
    assert!(refusal(&state).contains("no-podman"), "{state:?}");

    // `image: host` is the host.
    let mut job = site.job(&["true"]);
    job.image = Some("host".into());
    let (_, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
}

#[tokio::test]
async fn podman_is_called_with_the_job() {
    let site = Site::new();
    // Stands in for podman (not installed here): prints the arguments it was given.
    let podman = site.script("podman", "for a in \"$@\"; do echo \"$a\"; done\n");
    let mut config = site.config();
    config.container_runtime = ContainerRuntime::Podman(podman);
    let adapter = site.open_with(config);
    let mut job = site.job(&["sh", "-c", "echo ${ARRAY_INDEX}"]);
    job.image = Some("docker://docker.io/library/busybox:1.36".into());
    job.array_index = Some(5);
    job.env.insert("GREETING".into(), "a, b".into());
    job.cwd = Some("/data".into()); // inside the container: not checked on the host
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let dir = adapter.job_dir(job.job_id);
    let env_file = dir.join("container.env");
    let want = format!(
        "run\n--rm\n--name\nmeridian-{id}\n--env-file\n{}\n--workdir\n/data\n\
         docker.io/library/busybox:1.36\nsh\n-c\necho 5\n",
        env_file.display()
    );
    assert_eq!(stdout(&adapter, &id).await, want);
    // The environment goes in a file, not on the command line anyone can read.
    let env = std::fs::read_to_string(&env_file).unwrap();
    let want = format!(
        "GREETING=a, b\nMERIDIAN_JOB_ID={id}\nMERIDIAN_WORKFLOW_ID={}\n\
         MERIDIAN_ARRAY_INDEX=5\nARRAY_INDEX=5\n",
        job.workflow_id
    );
    assert_eq!(env, want);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the job directory is private");
    let report = adapter.status(&id).await.unwrap();
    assert_eq!(
        report.usage.cpu_seconds, None,
        "podman's CPU time is not the container's"
    );
}

#[tokio::test]
async fn apptainer_is_called_with_the_job() {
    let site = Site::new();
    let apptainer = site.script(
        "apptainer",
        "echo \"$*\"; env | grep '^APPTAINERENV_' | sort\n",
    );
    let mut config = site.config();
    config.container_runtime = ContainerRuntime::Apptainer(apptainer);
    let adapter = site.open_with(config);
    let mut job = site.job(&["python3", "train.py"]);
    job.image = Some("python:3.12".into());
    let (id, _) = run(&adapter, &site, &job).await;
    let want = format!(
        "exec docker://python:3.12 python3 train.py\nAPPTAINERENV_MERIDIAN_JOB_ID={id}\n\
         APPTAINERENV_MERIDIAN_WORKFLOW_ID={}\n",
        job.workflow_id
    );
    assert_eq!(stdout(&adapter, &id).await, want);
}

#[tokio::test]
async fn requests_the_site_cannot_hold_are_rejected_and_leave_nothing() {
    let site = Site::new();
    let mut config = site.config();
    config.cpus = 2;
    config.memory_bytes = 1 << 30;
    let adapter = site.open_with(config);
    type Change = fn(&mut JobRequest);
    let cases: Vec<(&str, Change)> = vec![
        ("1 any GPU(s) requested; the local site has none", |j| {
            j.resources.gpus = Some(Gpus {
                count: 1,
                vendor: "any".into(),
                model: None,
            })
        }),
        ("3 cpus requested; the local site has 2", |j| {
            j.resources.cpus = 3
        }),
        (
            "2147483648 bytes of memory requested; the local site has 1073741824",
            |j| j.resources.memory_bytes = 2 << 30,
        ),
        ("the local site is one node; 2 requested", |j| {
            j.resources.nodes = 2
        }),
        ("a job on the host needs a command", |j| j.command.clear()),
    ];
    for (want, change) in cases {
        let mut job = site.job(&["true"]);
        change(&mut job);
        match adapter.submit(&job).await {
            Err(AdapterError::Rejected(why)) => assert_eq!(why, want),
            other => panic!("expected Rejected({want:?}), got {other:?}"),
        }
        assert_eq!(
            adapter.find(job.job_id).await.unwrap(),
            None,
            "nothing was created"
        );
    }
    // A GPU entry asking for none is no GPU request.
    let mut job = site.job(&["true"]);
    job.resources.gpus = Some(Gpus {
        count: 0,
        vendor: "any".into(),
        model: None,
    });
    let (_, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
}

#[tokio::test]
async fn a_job_killed_behind_the_adapters_back_is_lost() {
    let site = Site::new();
    let adapter = site.open();
    let job = site.job(&["sleep", "600"]);
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &site.options).await;
    let pid = pid_of(&adapter, &job);
    // SAFETY: kill(2) on the process group of the job we just started.
    assert_eq!(unsafe { libc::kill(-(pid as i32), libc::SIGKILL) }, 0);

    let report = wait_final(&adapter, &id, &site.options).await;
    match &report.state {
        JobState::Failed {
            started_at: Some(_),
            failure: FailureReason::Lost,
            exit_code: None,
            ..
        } => {}
        other => panic!("expected Lost, got {other:?}"),
    }
    // Fixed once decided: the same answer later and from a restarted adapter.
    drop(adapter);
    let restarted = site.open();
    assert_eq!(restarted.status(&id).await.unwrap().state, report.state);
}

#[tokio::test]
async fn a_submit_that_died_before_starting_is_lost() {
    let site = Site::new();
    let adapter = site.open();
    // What a crash right after claiming the job directory leaves: the request, no process.
    let job = site.job(&["true"]);
    let dir = adapter.job_dir(job.job_id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("request.json"), serde_json::to_vec(&job).unwrap()).unwrap();
    let restarted = site.open();
    let id = restarted.submit(&job).await.unwrap();
    let report = restarted.status(&id).await.unwrap();
    match report.state {
        JobState::Failed {
            started_at: None,
            failure: FailureReason::Lost,
            ..
        } => {}
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(report.usage, Usage::default());
}

#[tokio::test]
async fn cancel_kills_the_whole_process_tree() {
    let site = Site::new();
    let mut config = site.config();
    config.kill_grace = Duration::from_secs(1);
    let adapter = site.open_with(config);
    // The shell ignores SIGTERM and keeps starting sleeps: only SIGKILL stops it.
    let job = site.job(&[
        "sh",
        "-c",
        "sleep 600 & trap '' TERM; while :; do sleep 0.1; done",
    ]);
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &site.options).await;
    let pid = pid_of(&adapter, &job);
    // The wrapper, the shell, its long sleep and a short one.
    eventually("the job's processes start", || {
        group_members(pid).len() >= 4
    })
    .await;

    adapter.cancel(&id).await.unwrap();
    // cancel returns once the group is gone, the shell ignoring SIGTERM included.
    assert_eq!(
        group_members(pid),
        Vec::<u32>::new(),
        "nothing of the job survives"
    );
    let state = adapter.status(&id).await.unwrap().state;
    assert!(
        matches!(
            state,
            JobState::Cancelled {
                started_at: Some(_),
                ..
            }
        ),
        "{state:?}"
    );
}

#[tokio::test]
async fn capacity_counts_running_jobs() {
    let site = Site::new();
    let mut config = site.config();
    config.cpus = 2;
    config.memory_bytes = 1 << 30;
    let adapter = site.open_with(config);
    let idle = adapter.capacity().await.unwrap();
    assert_eq!(
        (idle.free_cpus, idle.free_memory_bytes, idle.idle_nodes),
        (2, 1 << 30, 1)
    );
    assert_eq!((idle.pending, idle.free_gpus), (0, 0));

    let mut job = site.job(&["sleep", "600"]);
    job.resources.cpus = 2;
    job.resources.memory_bytes = 256 << 20;
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &site.options).await;
    let busy = adapter.capacity().await.unwrap();
    assert_eq!(
        (busy.free_cpus, busy.free_memory_bytes, busy.idle_nodes),
        (0, 768 << 20, 0)
    );
    let report = adapter.status(&id).await.unwrap();
    assert_eq!(
        (
            report.usage.nodes,
            report.usage.cpus,
            report.usage.memory_bytes,
            report.usage.gpus
        ),
        (1, 2, 256 << 20, 0)
    );

    adapter.cancel(&id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let capacity = adapter.capacity().await.unwrap();
        if capacity.free_cpus == 2 {
            assert_eq!(capacity.free_memory_bytes, 1 << 30);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "capacity never freed: {capacity:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn logs_keep_the_last_mebibyte() {
    let site = Site::new();
    let adapter = site.open();
    let job = site.job(&[
        "sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo last-line",
    ]);
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let out = stdout(&adapter, &id).await;
    assert!(
        out.starts_with("[meridian: the first 1951435 bytes are left out]\n"),
        "{}",
        &out[..80]
    );
    assert!(out.ends_with("x\nlast-line\n"));
    let kept = out.split_once('\n').unwrap().1;
    assert_eq!(kept.len() as u64, meridian_adapter_local::LOG_CAP_BYTES);
    let whole = std::fs::metadata(adapter.job_dir(job.job_id).join("stdout"))
        .unwrap()
        .len();
    assert_eq!(whole, 3_000_011, "the file itself is kept whole");
}

#[tokio::test]
async fn host_jobs_report_cpu_time() {
    let site = Site::new();
    let adapter = site.open();
    let job = site.job(&[
        "sh",
        "-c",
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
    ]);
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let usage = adapter.status(&id).await.unwrap().usage;
    let cpu = usage.cpu_seconds.expect("CPU time of a finished host job");
    assert!(cpu > 0.0, "a busy loop used some CPU: {cpu}");
    assert_eq!(usage.max_rss_bytes, None);
}

#[tokio::test]
async fn a_job_that_ended_while_no_adapter_ran_is_reported() {
    let site = Site::new();
    let adapter = site.open();
    let gate = site.tmp.path().join("gate");
    let mut job = site.job(&[
        "sh",
        "-c",
        "while [ ! -e \"$GATE\" ]; do sleep 0.1; done; exit 4",
    ]);
    job.env.insert("GATE".into(), gate.display().to_string());
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &site.options).await;
    let exit_code = adapter.job_dir(job.job_id).join("exit_code");
    drop(adapter);

    std::fs::write(&gate, "").unwrap();
    eventually("the job ends", || exit_code.exists()).await;
    let restarted = site.open();
    let report = wait_for(
        &restarted,
        &id,
        &site.options,
        Duration::from_secs(30),
        "final",
        JobState::is_terminal,
    )
    .await;
    match report.state {
        JobState::Failed {
            exit_code: Some(4),
            failure: FailureReason::ExitCode { code: 4 },
            ..
        } => {}
        other => panic!("expected exit code 4, got {other:?}"),
    }
}

#[tokio::test]
async fn a_zero_walltime_means_no_limit() {
    let site = Site::new();
    let adapter = site.open();
    let mut job = site.job(&["sleep", "1"]);
    job.resources.walltime = Duration::ZERO;
    let (_, state) = run(&adapter, &site, &job).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
}

#[test]
fn new_needs_a_tokio_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    match LocalAdapter::new(LocalConfig::new(tmp.path())) {
        Err(AdapterError::Unavailable(why)) => assert!(why.contains("tokio"), "{why}"),
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("expected an error outside a runtime"),
    }
}

#[test]
fn config_defaults_describe_this_machine() {
    let config = LocalConfig::default();
    assert_eq!(config.root, Path::new("meridian-data/sites/local"));
    assert!(config.cpus >= 1);
    assert!(config.memory_bytes > 0, "MemTotal read from /proc/meminfo");
    assert_eq!(config.container_runtime, ContainerRuntime::Detect);
    assert_eq!(config.kill_grace, Duration::from_secs(5));
    let json = serde_json::to_value(&config).unwrap();
    let back: LocalConfig = serde_json::from_value(json).unwrap();
    assert_eq!(back, config);
}

/// A relative state directory (as `meridian up` gives by default) still records exit
/// codes: jobs run in their own directory, so the adapter must not hand out relative paths.
#[tokio::test]
async fn a_relative_root_still_records_exit_codes() {
    let site = Site::new();
    let cwd = std::env::current_dir().unwrap();
    let mut config = site.config();
    config.root = relative_to(&config.root, &cwd);
    assert!(config.root.is_relative());
    let adapter = site.open_with(config);
    let (_, state) = run(
        &adapter,
        &site,
        &site.job(&["sh", "-c", "echo done; exit 7"]),
    )
    .await;
    match state {
        JobState::Failed { exit_code, .. } => assert_eq!(exit_code, Some(7)),
        other => panic!("expected a failure with exit code 7, got {other:?}"),
    }
}

/// `target` relative to `from` (both absolute), with `..` as needed.
fn relative_to(target: &Path, from: &Path) -> PathBuf {
    let t: Vec<_> = target.components().collect();
    let f: Vec<_> = from.components().collect();
    let common = t.iter().zip(&f).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

fn service(site: &Site, command: &[&str], port: u16, max_restarts: u32) -> JobRequest {
    let mut job = site.job(command);
    job.service = Some(meridian_adapter_core::ServiceRequest {
        port,
        min_replicas: 1,
        max_replicas: 1,
        max_restarts,
    });
    job
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_service_is_ready_once_it_answers_and_gone_after_cancel() {
    let site = Site::new();
    let adapter = site.open();
    let port = free_port();
    // Listens only after a moment: ready is when it answers, not when it starts.
    let job = service(
        &site,
        &[
            "python3",
            "-c",
            &format!(
                "import socket,time; time.sleep(0.5); s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(600)"
            ),
        ],
        port,
        0,
    );
    let id = adapter.submit(&job).await.unwrap();
    let service = job.service.clone().unwrap();
    let report = adapter.status(&id).await.unwrap();
    assert_eq!(
        meridian_adapter_core::service_address(&report, &service).await,
        None,
        "not ready before it listens"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = loop {
        let report = adapter.status(&id).await.unwrap();
        if let Some(address) = meridian_adapter_core::service_address(&report, &service).await {
            assert!(matches!(report.state, JobState::Running { .. }));
            assert_eq!(report.host.as_deref(), Some("127.0.0.1"));
            break address;
        }
        assert!(Instant::now() < deadline, "never ready: {report:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(address, format!("127.0.0.1:{port}"));
    adapter.cancel(&id).await.unwrap();
    let report = adapter.status(&id).await.unwrap();
    assert!(
        matches!(report.state, JobState::Cancelled { .. }),
        "{report:?}"
    );
    assert_eq!(report.address, None);
}

#[tokio::test]
async fn a_crashing_service_is_restarted_up_to_its_limit_then_fails() {
    let site = Site::new();
    let adapter = site.open();
    let job = service(&site, &["sh", "-c", "echo run; exit 7"], free_port(), 2);
    let (id, state) = run(&adapter, &site, &job).await;
    assert!(
        matches!(
            state,
            JobState::Failed {
                failure: FailureReason::ExitCode { code: 7 },
                ..
            }
        ),
        "{state:?}"
    );
    // Three runs: the first and two restarts, each noted.
    assert_eq!(stdout(&adapter, &id).await.matches("run").count(), 3);
    let restarts = std::fs::read_to_string(adapter.job_dir(job.job_id).join("restarts")).unwrap();
    assert_eq!(restarts.lines().count(), 2, "{restarts}");
}

#[tokio::test]
async fn a_service_asking_for_more_replicas_than_the_site_runs_is_rejected() {
    let site = Site::new();
    let adapter = site.open();
    let mut job = service(&site, &["sleep", "1"], 8000, 0);
    job.service.as_mut().unwrap().min_replicas = 2;
    let err = adapter.submit(&job).await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Rejected(m) if m.contains("one replica")),
        "{err}"
    );
}

#[tokio::test]
async fn mounted_volumes_are_directories_shared_by_the_workflow_s_jobs() {
    let site = Site::new();
    let adapter = site.open();
    let mut writer = site.job(&["sh", "-c", "echo kept > \"$MERIDIAN_VOLUME_MY_DATA/f\""]);
    writer.mounts.insert("my-data".into(), "/data".into());
    let (_, state) = run(&adapter, &site, &writer).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    let mut reader = site.job(&["sh", "-c", "cat \"$MERIDIAN_VOLUME_MY_DATA/f\""]);
    reader.workflow_id = writer.workflow_id;
    reader.mounts = writer.mounts.clone();
    let (id, state) = run(&adapter, &site, &reader).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    assert_eq!(stdout(&adapter, &id).await.trim(), "kept");
    let dir = site
        .tmp
        .path()
        .join("site/volumes")
        .join(writer.workflow_id.to_string())
        .join("my-data");
    assert!(dir.join("f").is_file(), "{}", dir.display());
}

#[tokio::test]
async fn a_gpu_goes_to_one_job_at_a_time_and_stays_taken_across_a_restart() {
    let site = Site::new();
    let mut config = site.config();
    config.gpus = vec![meridian_adapter_local::gpu::Device {
        vendor: "nvidia".into(),
        model: "H100".into(),
        index: 0,
        uuid: "GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01".into(),
        memory_bytes: 80 << 30,
    }];
    let gpu_job = |command: &[&str]| {
        let mut job = site.job(command);
        job.resources.gpus = Some(Gpus {
            count: 1,
            vendor: "nvidia".into(),
            model: Some("H100".into()),
        });
        job
    };
    let adapter = site.open_with(config.clone());
    let marker = site.tmp.path().join("release");
    let script = site.script(
        "hold.sh",
        &format!(
            "echo \"saw $CUDA_VISIBLE_DEVICES\"\nwhile [ ! -e {} ]; do sleep 0.05; done\n",
            marker.display()
        ),
    );
    let first = gpu_job(&[script.to_str().unwrap()]);
    let id = adapter.submit(&first).await.expect("the GPU is free");
    wait_running(&adapter, &id, &site.options).await;
    assert_eq!(adapter.capacity().await.unwrap().free_gpus, 0);

    // Taken: the second waits, and says why; nothing of it is made.
    let second = gpu_job(&["sh", "-c", "echo \"saw $CUDA_VISIBLE_DEVICES\""]);
    match adapter.submit(&second).await {
        Err(AdapterError::Busy(why)) => assert!(why.contains("in use"), "{why}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(adapter.find(second.job_id).await.unwrap(), None);

    // A new adapter on the same directory (Meridian restarted) knows the GPU is taken.
    drop(adapter);
    let adapter = site.open_with(config);
    assert_eq!(adapter.capacity().await.unwrap().free_gpus, 0);
    assert!(matches!(
        adapter.submit(&second).await,
        Err(AdapterError::Busy(_))
    ));

    // Once the first ends, the second gets the device, and only it.
    std::fs::write(&marker, "").unwrap();
    let report = wait_final(&adapter, &id, &site.options).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    assert_eq!(
        stdout(&adapter, &id).await,
        "saw GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01\n"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while adapter.capacity().await.unwrap().free_gpus != 1 {
        assert!(Instant::now() < deadline, "the GPU was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (second_id, state) = run(&adapter, &site, &second).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
    assert_eq!(
        stdout(&adapter, &second_id).await,
        "saw GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01\n"
    );
}

#[tokio::test]
async fn a_cordoned_gpu_gets_no_new_work_and_is_not_counted_free() {
    let site = Site::new();
    let mut config = site.config();
    let device = |uuid: &str| meridian_adapter_local::gpu::Device {
        vendor: "nvidia".into(),
        model: "H100".into(),
        index: 0,
        uuid: uuid.into(),
        memory_bytes: 80 << 30,
    };
    config.gpus = vec![device("GPU-a"), device("GPU-b")];
    let adapter = site.open_with(config);
    let gpu_job = |count: u32| {
        let mut job = site.job(&["sh", "-c", "echo \"saw $CUDA_VISIBLE_DEVICES\""]);
        job.resources.gpus = Some(Gpus {
            count,
            vendor: "nvidia".into(),
            model: Some("H100".into()),
        });
        job
    };
    let capacity = adapter.capacity().await.unwrap();
    assert_eq!(
        capacity.free_gpus_by_model,
        [("H100".to_string(), 2)].into()
    );

    adapter.cordon(&["GPU-a".to_string()].into());
    let capacity = adapter.capacity().await.unwrap();
    assert_eq!(
        (capacity.free_gpus, capacity.free_gpus_by_model),
        (1, [("H100".to_string(), 1)].into())
    );
    // Both asked for: never, while one is cordoned; the reason names it.
    match adapter.submit(&gpu_job(2)).await {
        Err(AdapterError::Refused(why)) => {
            assert!(why.contains("cordoned (GPU-a)"), "{why}")
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    // One: the healthy device, every time.
    for _ in 0..2 {
        let (id, state) = run(&adapter, &site, &gpu_job(1)).await;
        assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
        assert_eq!(stdout(&adapter, &id).await, "saw GPU-b\n");
    }
    // Given back: both again.
    adapter.cordon(&Default::default());
    let (_, state) = run(&adapter, &site, &gpu_job(2)).await;
    assert!(matches!(state, JobState::Succeeded { .. }), "{state:?}");
}
