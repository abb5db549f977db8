//! The conformance kit every [`SiteAdapter`] passes against its real backend. Each check
//! gets a [`Harness`]: an [`Open`] that opens a *new* adapter instance on the *same*
//! backend and state every time it is called, as a restarted adapter process would, and
//! the [`ConformanceOptions`] that say how patient to be with this backend.
//! [`crate::conformance_suite!`] turns the whole kit into one `#[tokio::test]` per check.
//!
//! The test jobs use only `sh -c`, `true`, `sleep` and `echo`, so any POSIX host or a
//! busybox image runs them. Some checks prove what ran by having the job append to a file
//! in [`ConformanceOptions::scratch`], which the jobs and this test process must both see.
//! Every wait polls with a deadline from the options; no check asserts that something
//! happens *quickly*, only that it happens within a generous bound.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    AdapterError, BackendJobId, FailureReason, JobReport, JobRequest, JobState, Resources,
    SiteAdapter,
};

/// Opens a new adapter instance on the backend under test (same state every call).
pub type Open =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn SiteAdapter>> + Send>> + Send + Sync>;

/// What a check needs: a way to (re)open the adapter, and how to treat its backend.
pub struct Harness {
    pub open: Open,
    pub options: ConformanceOptions,
}

/// How patient the kit is with a backend, and what its test jobs look like. The defaults
/// suit the local site; a batch scheduler raises the timeouts and the walltime.
#[derive(Debug, Clone)]
pub struct ConformanceOptions {
    /// A directory that this test process and the jobs both see at the same path (a shared
    /// file system on HPC sites; any temporary directory for the local site).
    pub scratch: PathBuf,
    /// The image test jobs run in; `None` runs them on the host. It must have `sh`,
    /// `sleep`, `true` and `echo`.
    pub image: Option<String>,
    /// Resources of the test jobs (the walltime is the generous one for jobs that must
    /// not time out).
    pub resources: Resources,
    /// How long a submitted job may wait before it runs.
    pub start_timeout: Duration,
    /// How long a short job may take, once running, to reach a final state.
    pub finish_timeout: Duration,
    /// How long a cancelled job may take to show as cancelled and to stop running.
    pub cancel_timeout: Duration,
    /// The walltime of the timeout checks: the smallest the backend enforces.
    pub short_walltime: Duration,
    /// How long after its walltime the site may take to kill a job and say so.
    pub timeout_grace: Duration,
    /// How often to poll status.
    pub poll_interval: Duration,
    /// How far the site's clock may be from this machine's.
    pub clock_skew: Duration,
    /// How long a stopped job is watched to be sure nothing of it runs any more; well above
    /// the 0.2 s tick of the test jobs.
    pub quiet_period: Duration,
    /// A backend id that names no job at this site.
    pub unknown_id: BackendJobId,
}

impl ConformanceOptions {
    /// Defaults for a site that starts jobs at once (the local site).
    pub fn new(scratch: impl Into<PathBuf>) -> Self {
        ConformanceOptions {
            scratch: scratch.into(),
            image: None,
            resources: Resources {
                nodes: 1,
                cpus: 1,
                memory_bytes: 64 << 20,
                walltime: Duration::from_secs(600),
                gpus: None,
            },
            start_timeout: Duration::from_secs(30),
            finish_timeout: Duration::from_secs(30),
            cancel_timeout: Duration::from_secs(30),
            short_walltime: Duration::from_secs(2),
            timeout_grace: Duration::from_secs(30),
            poll_interval: Duration::from_millis(100),
            clock_skew: Duration::from_secs(2),
            quiet_period: Duration::from_secs(2),
            unknown_id: BackendJobId(Uuid::now_v7().to_string()),
        }
    }

    /// A test job running `command`, with fresh job and workflow ids.
    pub fn job(&self, name: &str, command: &[&str]) -> JobRequest {
        JobRequest {
            image: self.image.clone(),
            resources: self.resources.clone(),
            ..JobRequest::new(name, command)
        }
    }

    /// A file in the scratch directory, unique to `job`.
    pub fn scratch_file(&self, job: &JobRequest, what: &str) -> PathBuf {
        self.scratch.join(format!("{}.{what}", job.job_id))
    }

    fn skew(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.clock_skew).expect("clock skew fits")
    }
}

/// A shell loop that appends a line to `$TICKS` every 0.2 s until it is killed.
const TICK_LOOP: &str = "while :; do echo tick >> \"$TICKS\"; sleep 0.2; done";

/// Polls `id` until `done` holds, or panics after `within` with the last report.
pub async fn wait_for(
    adapter: &dyn SiteAdapter,
    id: &BackendJobId,
    options: &ConformanceOptions,
    within: Duration,
    what: &str,
    done: impl Fn(&JobState) -> bool,
) -> JobReport {
    let deadline = Instant::now() + within;
    loop {
        let report = adapter.status(id).await.expect("status");
        if done(&report.state) {
            return report;
        }
        if Instant::now() >= deadline {
            panic!("job {id} did not become {what} within {within:?}; last report: {report:?}");
        }
        tokio::time::sleep(options.poll_interval).await;
    }
}

/// Waits until `id` runs.
pub async fn wait_running(
    adapter: &dyn SiteAdapter,
    id: &BackendJobId,
    options: &ConformanceOptions,
) -> DateTime<Utc> {
    let report = wait_for(
        adapter,
        id,
        options,
        options.start_timeout,
        "running",
        |s| matches!(s, JobState::Running { .. }) || s.is_terminal(),
    )
    .await;
    match report.state {
        JobState::Running { started_at } => started_at,
        other => panic!("job {id} should be running, but it ended: {other:?}"),
    }
}

/// Waits until `id` reaches a final state.
pub async fn wait_final(
    adapter: &dyn SiteAdapter,
    id: &BackendJobId,
    options: &ConformanceOptions,
) -> JobReport {
    let within = options.start_timeout + options.finish_timeout;
    wait_for(adapter, id, options, within, "final", JobState::is_terminal).await
}

/// Lines in `path` (0 when it does not exist yet).
pub fn count_lines(path: &Path) -> usize {
    match std::fs::read_to_string(path) {
        Ok(text) => text.lines().count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

/// Waits until `path` has at least one line: the job's command really runs.
async fn wait_first_line(path: &Path, options: &ConformanceOptions) {
    let deadline = Instant::now() + options.start_timeout + options.finish_timeout;
    while count_lines(path) == 0 {
        assert!(
            Instant::now() < deadline,
            "the job never wrote to {}",
            path.display()
        );
        tokio::time::sleep(options.poll_interval).await;
    }
}

/// Waits until `ticks` stops growing for a quiet period: whatever wrote it is gone.
async fn wait_ticks_stop(ticks: &Path, options: &ConformanceOptions, within: Duration) {
    let deadline = Instant::now() + within + options.quiet_period;
    loop {
        let before = count_lines(ticks);
        tokio::time::sleep(options.quiet_period).await;
        let after = count_lines(ticks);
        if after == before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the job still runs: {} kept growing ({before} -> {after} lines)",
            ticks.display()
        );
    }
}

fn assert_ordered(
    options: &ConformanceOptions,
    before: DateTime<Utc>,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    after: DateTime<Utc>,
) {
    let skew = options.skew();
    assert!(
        before - skew <= started_at,
        "started_at {started_at} is before the submission at {before}"
    );
    assert!(
        started_at <= ended_at,
        "ended_at {ended_at} is before started_at {started_at}"
    );
    assert!(
        ended_at <= after + skew,
        "ended_at {ended_at} is after the job was seen final at {after}"
    );
}

pub async fn succeeded_job_reports_times_in_order(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    let job = o.job("succeeds", &["true"]);
    let before = Utc::now();
    let id = adapter.submit(&job).await.expect("submit");
    let report = wait_final(&*adapter, &id, o).await;
    let after = Utc::now();
    assert_eq!(report.backend_id, id);
    match report.state {
        JobState::Succeeded {
            started_at,
            ended_at,
        } => assert_ordered(o, before, started_at, ended_at, after),
        other => panic!("`true` should succeed, got {other:?}"),
    }
    assert!(report.usage.nodes >= 1, "a job that ran used a node");
    assert_eq!(
        adapter.find(job.job_id).await.expect("find"),
        Some(id.clone())
    );

    // Cancelling a finished job is not an error and changes nothing.
    adapter.cancel(&id).await.expect("cancel a finished job");
    let again = adapter.status(&id).await.expect("status");
    assert_eq!(
        again.state, report.state,
        "a finished job stays as it ended"
    );
}

pub async fn failed_job_reports_exit_code(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    let job = o.job("fails", &["sh", "-c", "exit 3"]);
    let before = Utc::now();
    let id = adapter.submit(&job).await.expect("submit");
    let report = wait_final(&*adapter, &id, o).await;
    let after = Utc::now();
    match report.state {
        JobState::Failed {
            started_at,
            ended_at,
            exit_code,
            failure,
        } => {
            assert_eq!(failure, FailureReason::ExitCode { code: 3 });
            assert_eq!(exit_code, Some(3));
            let started_at = started_at.expect("a job that ran has a start time");
            assert_ordered(o, before, started_at, ended_at, after);
        }
        other => panic!("`exit 3` should fail, got {other:?}"),
    }
}

pub async fn logs_keep_stdout_and_stderr_apart(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    let job = o.job(
        "logs",
        &[
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2; echo more-stdout",
        ],
    );
    let id = adapter.submit(&job).await.expect("submit");
    let report = wait_final(&*adapter, &id, o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    // Some sites collect logs a little after the job ends.
    let deadline = Instant::now() + o.finish_timeout;
    let logs = loop {
        let logs = adapter.logs(&id).await.expect("logs");
        if logs.stdout.contains("more-stdout") && logs.stderr.contains("to-stderr") {
            break logs;
        }
        assert!(Instant::now() < deadline, "logs never arrived: {logs:?}");
        tokio::time::sleep(o.poll_interval).await;
    };
    assert!(logs.stdout.contains("to-stdout\n"), "{logs:?}");
    assert!(
        !logs.stdout.contains("to-stderr"),
        "stderr leaked into stdout: {logs:?}"
    );
    assert!(
        !logs.stderr.contains("stdout"),
        "stdout leaked into stderr: {logs:?}"
    );
}

pub async fn array_index_and_env_reach_the_job(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    // `$1` carries the substituted argument: the shell never expands it again.
    let script = "echo \"arg=$1 index=$MERIDIAN_ARRAY_INDEX array=$ARRAY_INDEX \
                  greeting=$GREETING job=$MERIDIAN_JOB_ID workflow=$MERIDIAN_WORKFLOW_ID\"";
    let mut job = o.job("array", &["sh", "-c", script, "sh", "cell-${ARRAY_INDEX}"]);
    job.array_index = Some(7);
    job.env.insert("GREETING".into(), "hello world".into());
    let id = adapter.submit(&job).await.expect("submit");
    let report = wait_final(&*adapter, &id, o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    let want = format!(
        "arg=cell-7 index=7 array=7 greeting=hello world job={} workflow={}",
        job.job_id, job.workflow_id
    );
    let deadline = Instant::now() + o.finish_timeout;
    loop {
        let logs = adapter.logs(&id).await.expect("logs");
        if logs.stdout.contains(&want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expected {want:?} in stdout, got {logs:?}"
        );
        tokio::time::sleep(o.poll_interval).await;
    }
}

pub async fn cancel_stops_a_running_job(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    let mut job = o.job("cancelled", &["sh", "-c", TICK_LOOP]);
    let ticks = o.scratch_file(&job, "ticks");
    job.env.insert("TICKS".into(), ticks.display().to_string());
    let id = adapter.submit(&job).await.expect("submit");
    wait_running(&*adapter, &id, o).await;
    wait_first_line(&ticks, o).await;

    adapter.cancel(&id).await.expect("cancel");
    let report = wait_for(
        &*adapter,
        &id,
        o,
        o.cancel_timeout,
        "cancelled",
        JobState::is_terminal,
    )
    .await;
    match report.state {
        JobState::Cancelled {
            started_at,
            ended_at,
        } => {
            let started_at = started_at.expect("it ran, so it has a start time");
            assert!(started_at <= ended_at, "{started_at} > {ended_at}");
        }
        other => panic!("a cancelled job should be Cancelled, got {other:?}"),
    }
    wait_ticks_stop(&ticks, o, o.cancel_timeout).await;

    adapter.cancel(&id).await.expect("cancelling twice is fine");
    let again = adapter.status(&id).await.expect("status");
    assert!(
        matches!(again.state, JobState::Cancelled { .. }),
        "{again:?}"
    );
}

/// Checks that `report` is a walltime kill of a job with `short_walltime`.
fn assert_timed_out(o: &ConformanceOptions, report: &JobReport) {
    match &report.state {
        JobState::Failed {
            started_at,
            ended_at,
            failure,
            ..
        } => {
            assert_eq!(failure, &FailureReason::Timeout, "{report:?}");
            let started_at = started_at.expect("it ran, so it has a start time");
            let walltime = chrono::Duration::from_std(o.short_walltime).unwrap();
            assert!(
                *ended_at - started_at >= walltime - o.skew(),
                "killed after {} although the walltime is {walltime}",
                *ended_at - started_at
            );
        }
        other => panic!("a job past its walltime should fail with Timeout, got {other:?}"),
    }
}

pub async fn walltime_exceeded_fails_with_timeout(h: Harness) {
    let adapter = (h.open)().await;
    let o = &h.options;
    let mut job = o.job("too-long", &["sh", "-c", TICK_LOOP]);
    job.resources.walltime = o.short_walltime;
    let ticks = o.scratch_file(&job, "ticks");
    job.env.insert("TICKS".into(), ticks.display().to_string());
    let id = adapter.submit(&job).await.expect("submit");
    let within = o.start_timeout + o.short_walltime + o.timeout_grace;
    let report = wait_for(&*adapter, &id, o, within, "final", JobState::is_terminal).await;
    assert_timed_out(o, &report);
    wait_ticks_stop(&ticks, o, o.timeout_grace).await;
}

pub async fn resubmission_after_restart_runs_nothing_again(h: Harness) {
    let o = &h.options;
    let mut job = o.job("once", &["sh", "-c", "echo run >> \"$RUNS\""]);
    let runs = o.scratch_file(&job, "runs");
    job.env.insert("RUNS".into(), runs.display().to_string());

    let first = (h.open)().await;
    let id = first.submit(&job).await.expect("submit");
    let again = first.submit(&job).await.expect("submit again");
    assert_eq!(again, id, "the same job submitted twice is one backend job");
    let report = wait_final(&*first, &id, o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    drop(first);

    let restarted = (h.open)().await;
    assert_eq!(
        restarted.find(job.job_id).await.expect("find"),
        Some(id.clone()),
        "a restarted adapter finds what it submitted"
    );
    let resubmitted = restarted.submit(&job).await.expect("resubmit");
    assert_eq!(resubmitted, id, "a restarted adapter does not submit again");
    let report = restarted.status(&id).await.expect("status");
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    tokio::time::sleep(o.quiet_period).await;
    assert_eq!(count_lines(&runs), 1, "the job ran exactly once");
    assert_eq!(
        restarted.find(Uuid::now_v7()).await.expect("find"),
        None,
        "a job never submitted is not found"
    );
}

pub async fn concurrent_submissions_run_once(h: Harness) {
    let o = &h.options;
    let mut job = o.job("raced", &["sh", "-c", "echo run >> \"$RUNS\""]);
    let runs = o.scratch_file(&job, "runs");
    job.env.insert("RUNS".into(), runs.display().to_string());

    // Two instances, as two adapter processes racing after a failover would be.
    let adapters = [(h.open)().await, (h.open)().await];
    let mut tasks = Vec::new();
    for i in 0..6 {
        let adapter = adapters[i % 2].clone();
        let job = job.clone();
        tasks.push(tokio::spawn(async move { adapter.submit(&job).await }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("join").expect("submit"));
    }
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "one backend job: {ids:?}"
    );
    let report = wait_final(&*adapters[0], &ids[0], o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    tokio::time::sleep(o.quiet_period).await;
    assert_eq!(count_lines(&runs), 1, "the job ran exactly once");
}

pub async fn job_running_across_restart_finishes_through_new_instance(h: Harness) {
    let o = &h.options;
    // The job runs until the test opens its gate, so it is surely running at the restart.
    let script = "echo started >> \"$RUNS\"; \
                  while [ ! -e \"$GATE\" ]; do sleep 0.2; done; echo finished";
    let mut job = o.job("gated", &["sh", "-c", script]);
    let runs = o.scratch_file(&job, "runs");
    let gate = o.scratch_file(&job, "gate");
    job.env.insert("RUNS".into(), runs.display().to_string());
    job.env.insert("GATE".into(), gate.display().to_string());

    let first = (h.open)().await;
    let id = first.submit(&job).await.expect("submit");
    let started = wait_running(&*first, &id, o).await;
    wait_first_line(&runs, o).await;
    drop(first);

    let restarted = (h.open)().await;
    let report = restarted.status(&id).await.expect("status after restart");
    assert_eq!(
        report.state,
        JobState::Running {
            started_at: started
        },
        "the job still runs, and the restarted adapter says so"
    );
    assert_eq!(
        restarted.find(job.job_id).await.expect("find"),
        Some(id.clone())
    );
    assert_eq!(restarted.submit(&job).await.expect("resubmit"), id);

    std::fs::write(&gate, b"open\n").expect("open the gate");
    let report = wait_final(&*restarted, &id, o).await;
    match report.state {
        JobState::Succeeded { started_at, .. } => assert_eq!(started_at, started),
        other => panic!("the gated job should succeed, got {other:?}"),
    }
    let deadline = Instant::now() + o.finish_timeout;
    loop {
        let logs = restarted.logs(&id).await.expect("logs");
        if logs.stdout.contains("finished") {
            break;
        }
        assert!(Instant::now() < deadline, "no `finished` in {logs:?}");
        tokio::time::sleep(o.poll_interval).await;
    }
    assert_eq!(count_lines(&runs), 1, "the job ran exactly once");
}

pub async fn walltime_enforced_after_restart(h: Harness) {
    let o = &h.options;
    let mut job = o.job("too-long-restarted", &["sh", "-c", TICK_LOOP]);
    job.resources.walltime = o.short_walltime;
    let ticks = o.scratch_file(&job, "ticks");
    job.env.insert("TICKS".into(), ticks.display().to_string());

    let first = (h.open)().await;
    let id = first.submit(&job).await.expect("submit");
    wait_running(&*first, &id, o).await;
    drop(first);

    let restarted = (h.open)().await;
    let within = o.start_timeout + o.short_walltime + o.timeout_grace;
    let report = wait_for(&*restarted, &id, o, within, "final", JobState::is_terminal).await;
    assert_timed_out(o, &report);
    wait_ticks_stop(&ticks, o, o.timeout_grace).await;
}

pub async fn unknown_job_is_reported_unknown(h: Harness) {
    let adapter = (h.open)().await;
    let unknown = &h.options.unknown_id;
    match adapter.status(unknown).await {
        Err(AdapterError::UnknownJob(_)) => {}
        other => panic!("status of an unknown job: expected UnknownJob, got {other:?}"),
    }
    match adapter.cancel(unknown).await {
        Err(AdapterError::UnknownJob(_)) => {}
        other => panic!("cancel of an unknown job: expected UnknownJob, got {other:?}"),
    }
    match adapter.logs(unknown).await {
        Err(AdapterError::UnknownJob(_)) => {}
        other => panic!("logs of an unknown job: expected UnknownJob, got {other:?}"),
    }
    assert_eq!(adapter.find(Uuid::now_v7()).await.expect("find"), None);
}

/// A site that takes arrays runs one as one submission: every task once, with its own
/// index, job id and `${ARRAY_INDEX}` in its arguments, never more than the cap at once,
/// and a restarted adapter finds the submission rather than making another. A site that
/// does not take arrays says so (`NotSupported`).
pub async fn array_runs_as_one_submission_within_its_cap(h: Harness) {
    let o = &h.options;
    let first = (h.open)().await;
    let indices = [2u32, 3, 5, 8];
    let mut template = o.job(
        "batch",
        &[
            "sh",
            "-c",
            "echo \"start $ARRAY_INDEX\" >> \"$SPANS\"; \
             echo \"arg=$1 index=$MERIDIAN_ARRAY_INDEX job=$MERIDIAN_JOB_ID\"; \
             sleep 1; echo \"end $ARRAY_INDEX\" >> \"$SPANS\"",
            "sh",
            "cell-${ARRAY_INDEX}",
        ],
    );
    let spans = o.scratch_file(&template, "spans");
    template
        .env
        .insert("SPANS".into(), spans.display().to_string());
    template.array_index = Some(indices[0]);
    let array = crate::ArrayRequest {
        batch_id: Uuid::now_v7(),
        template,
        tasks: indices
            .iter()
            .map(|&index| crate::ArrayTask {
                index,
                job_id: Uuid::now_v7(),
            })
            .collect(),
        cap: 2,
    };
    if first.array_limit().is_none() {
        let refused = first.submit_array(&array).await;
        assert!(
            matches!(refused, Err(AdapterError::NotSupported(_))),
            "a site that takes no arrays says so: {refused:?}"
        );
        return;
    }
    let ids = first.submit_array(&array).await.expect("submit the array");
    assert_eq!(ids.len(), indices.len(), "one id per task: {ids:?}");
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "each task its own id: {ids:?}");
    drop(first);

    let restarted = (h.open)().await;
    let again = restarted.submit_array(&array).await.expect("submit again");
    assert_eq!(
        again, ids,
        "a restarted adapter finds the array it submitted"
    );
    // Followed together, as the runner does: every answer is a state, never an error,
    // while tasks wait, run and end.
    let deadline = Instant::now() + o.start_timeout + o.finish_timeout * indices.len() as u32;
    let reports = loop {
        let reports: Vec<JobReport> = restarted
            .status_all(&ids)
            .await
            .into_iter()
            .zip(&indices)
            .map(|(r, i)| r.unwrap_or_else(|e| panic!("task {i}: {e}")))
            .collect();
        if reports.iter().all(|r| r.state.is_terminal()) {
            break reports;
        }
        assert!(
            Instant::now() < deadline,
            "the array did not end: {reports:?}"
        );
        tokio::time::sleep(o.poll_interval).await;
    };
    for ((task, id), report) in array.tasks.iter().zip(&ids).zip(reports) {
        assert_eq!(&report.backend_id, id);
        assert!(
            matches!(report.state, JobState::Succeeded { .. }),
            "task {}: {report:?}",
            task.index
        );
        let want = format!("arg=cell-{i} index={i} job={}", task.job_id, i = task.index);
        let deadline = Instant::now() + o.finish_timeout;
        loop {
            let logs = restarted.logs(id).await.expect("logs");
            if logs.stdout.contains(&want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "task {}: expected {want:?} in stdout, got {logs:?}",
                task.index
            );
            tokio::time::sleep(o.poll_interval).await;
        }
    }
    let text = std::fs::read_to_string(&spans).expect("the tasks' spans");
    let (mut running, mut most, mut started) = (0i32, 0i32, Vec::new());
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("start", i)) => {
                running += 1;
                most = most.max(running);
                started.push(i.to_string());
            }
            Some(("end", _)) => running -= 1,
            _ => panic!("unexpected line {line:?} in {text:?}"),
        }
    }
    started.sort_by_key(|i| i.parse::<u32>().unwrap_or(u32::MAX));
    let want: Vec<String> = indices.iter().map(u32::to_string).collect();
    assert_eq!(started, want, "every task ran once: {text:?}");
    assert!(most <= 2, "at most the cap of 2 ran at once: {text:?}");
}

pub async fn capacity_reports_healthy(h: Harness) {
    let adapter = (h.open)().await;
    let capacity = adapter.capacity().await.expect("capacity");
    assert!(capacity.healthy, "{capacity:?}");
    assert!(
        capacity.total_cpus >= h.options.resources.cpus,
        "the site cannot run the test jobs: {capacity:?}"
    );
    assert!(capacity.free_cpus <= capacity.total_cpus, "{capacity:?}");
    assert!(
        capacity.free_memory_bytes <= capacity.total_memory_bytes,
        "{capacity:?}"
    );
    assert!(!adapter.kind().is_empty());
}

/// Generates one `#[tokio::test]` per conformance check. `$harness` is an expression that
/// yields a [`conformance::Harness`](crate::conformance::Harness) on fresh state.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::conformance_suite!(@tests $harness;
            succeeded_job_reports_times_in_order, failed_job_reports_exit_code,
            logs_keep_stdout_and_stderr_apart, array_index_and_env_reach_the_job,
            cancel_stops_a_running_job, walltime_exceeded_fails_with_timeout,
            resubmission_after_restart_runs_nothing_again, concurrent_submissions_run_once,
            job_running_across_restart_finishes_through_new_instance,
            walltime_enforced_after_restart, unknown_job_is_reported_unknown,
            array_runs_as_one_submission_within_its_cap, capacity_reports_healthy);
    };
    (@tests $harness:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let harness: $crate::conformance::Harness = $harness;
                $crate::conformance::$check(harness).await;
            }
        )*
    };
}
