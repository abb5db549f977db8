//! The Slurm adapter against a real Slurm 22.05 on this machine: the shared conformance
//! kit in CLI mode, then slurmrestd (REST mode), then the accounting fallbacks on real
//! `sacct` output. When Slurm is not running, the first test to need it runs
//! `infra/slurm/start.sh` (once per test binary, under a lock file shared with other
//! binaries); when that fails, every test fails with the reason. Nothing is skipped.

use std::path::PathBuf;
use std::process::Command as Std;
use std::sync::Arc;
use std::time::Duration;

use meridian_adapter_core::conformance::{self, ConformanceOptions, Harness, Open};
use meridian_adapter_core::{
    AdapterError, BackendJobId, FailureReason, JobState, Resources, SiteAdapter,
};
use meridian_adapter_slurm::parse::{sacct_record, SACCT_FORMAT, SACCT_JOBCOMP_FORMAT};
use meridian_adapter_slurm::{SlurmAdapter, SlurmConfig, TokenSource};

const REST_URL: &str = "http://127.0.0.1:6820";

fn sh(cmd: &str) -> std::process::Output {
    Std::new("sh").arg("-c").arg(cmd).output().expect("run sh")
}

/// Makes sure Slurm runs, starting it if needed; panics with the reason when it cannot.
fn ensure_slurm() {
    if let Err(why) = meridian_adapter_slurm::testkit::ensure_slurm() {
        panic!("these tests need a running Slurm, and it could not be started: {why}");
    }
}

/// Cancels this test's jobs that are still in Slurm when it ends (a failed check leaves
/// them running until their walltime), then removes its directory.
struct Leftovers {
    dir: tempfile::TempDir,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let dir = self.dir.path().display().to_string();
        let out = sh("squeue --me -h -o '%i|%Z'");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((id, workdir)) = line.split_once('|') {
                if workdir.starts_with(&dir) {
                    let _ = sh(&format!("scancel {id}"));
                }
            }
        }
    }
}

/// A fresh work dir and scratch dir, in /tmp where the jobs (same machine) see them.
fn dirs() -> (Arc<Leftovers>, PathBuf, PathBuf) {
    ensure_slurm();
    let dir = tempfile::Builder::new()
        .prefix("meridian-slurm-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let work = dir.path().join("work");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    (Arc::new(Leftovers { dir }), work, scratch)
}

/// Patience for a real batch scheduler with a one-minute smallest time limit.
fn options(scratch: PathBuf) -> ConformanceOptions {
    let mut o = ConformanceOptions::new(scratch);
    o.resources = Resources {
        nodes: 1,
        cpus: 1,
        memory_bytes: 64 << 20,
        walltime: Duration::from_secs(600),
        gpus: None,
    };
    o.start_timeout = Duration::from_secs(60);
    o.finish_timeout = Duration::from_secs(60);
    o.cancel_timeout = Duration::from_secs(60);
    // Slurm time limits are whole minutes; slurmctld looks for jobs over their limit
    // every 30 s, then gives them KillWait (5 s here) after SIGTERM.
    o.short_walltime = Duration::from_secs(60);
    o.timeout_grace = Duration::from_secs(90);
    o.poll_interval = Duration::from_millis(250);
    // Slurm keeps times in whole seconds.
    o.clock_skew = Duration::from_secs(2);
    // Past Slurm's largest job id (0x03ff0000 by default): never a real job.
    o.unknown_id = BackendJobId("67043328".into());
    o
}

fn cli_harness() -> Harness {
    let (state, work, scratch) = dirs();
    let open: Open = Arc::new(move || {
        let (_state, work) = (state.clone(), work.clone());
        Box::pin(async move {
            let adapter = SlurmAdapter::new(SlurmConfig::cli(work)).expect("open slurm site");
            Arc::new(adapter) as Arc<dyn SiteAdapter>
        })
    });
    Harness {
        open,
        options: options(scratch),
    }
}

mod cli_conformance {
    use super::*;
    meridian_adapter_core::conformance_suite!(cli_harness());
}

// --- REST mode against the real slurmrestd ---------------------------------------------

/// A REST adapter with a fresh root token in a file, and what the test needs around it.
struct Rest {
    adapter: SlurmAdapter,
    options: ConformanceOptions,
    _state: Arc<Leftovers>,
}

fn rest_site(token: Option<&str>) -> Rest {
    let (state, work, scratch) = dirs();
    let token_file = state.dir.path().join("token");
    let token = match token {
        Some(t) => t.to_string(),
        None => {
            let out = sh("scontrol token username=root lifespan=3600");
            assert!(
                out.status.success(),
                "scontrol token: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).expect("utf-8")
        }
    };
    std::fs::write(&token_file, token).expect("token file");
    let config = SlurmConfig::rest(REST_URL, "root", TokenSource::File(token_file), work);
    Rest {
        adapter: SlurmAdapter::new(config).expect("open REST site"),
        options: options(scratch),
        _state: state,
    }
}

/// The array check of the conformance kit, through slurmrestd: one `--array` job, its
/// tasks followed as `<array>_<index>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_array_runs_as_one_submission_within_its_cap() {
    let site = Arc::new(rest_site(None));
    let config = site.adapter.config().clone();
    let keep = site.clone();
    let open: Open = Arc::new(move || {
        let (config, _keep) = (config.clone(), keep.clone());
        Box::pin(async move {
            Arc::new(SlurmAdapter::new(config).expect("open REST site")) as Arc<dyn SiteAdapter>
        })
    });
    conformance::array_runs_as_one_submission_within_its_cap(Harness {
        open,
        options: site.options.clone(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_discovers_the_api_version_the_site_serves() {
    let site = rest_site(None);
    assert_eq!(
        site.adapter.rest_api_version().await.unwrap().as_deref(),
        Some("v0.0.38"),
        "Slurm 22.05 serves only v0.0.38"
    );
    let capacity = site.adapter.capacity().await.unwrap();
    assert!(capacity.healthy, "{capacity:?}");
    assert!(capacity.total_cpus >= 1 && capacity.free_cpus <= capacity.total_cpus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_submit_runs_once_and_reports_success() {
    let site = rest_site(None);
    let o = &site.options;
    let mut job = o.job(
        "rest-ok",
        &["sh", "-c", "echo \"hi $GREETING $ARRAY_INDEX\""],
    );
    job.env.insert("GREETING".into(), "a, b".into());
    job.array_index = Some(2);
    let before = chrono::Utc::now();
    let id = site.adapter.submit(&job).await.expect("submit");
    assert_eq!(site.adapter.submit(&job).await.expect("again"), id);
    let report = conformance::wait_final(&site.adapter, &id, o).await;
    match report.state {
        JobState::Succeeded {
            started_at,
            ended_at,
        } => {
            assert!(started_at >= before - chrono::Duration::seconds(2));
            assert!(started_at <= ended_at);
        }
        other => panic!("{other:?}"),
    }
    assert!(report.usage.nodes >= 1, "{report:?}");
    assert_eq!(report.usage.memory_bytes, 64 << 20, "{report:?}");
    assert_eq!(
        site.adapter.find(job.job_id).await.unwrap(),
        Some(id.clone())
    );
    let logs = site.adapter.logs(&id).await.expect("logs");
    assert_eq!(logs.stdout, "hi a, b 2\n", "{logs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_failed_job_reports_its_exit_code() {
    let site = rest_site(None);
    let o = &site.options;
    let job = o.job("rest-fails", &["sh", "-c", "exit 3"]);
    let id = site.adapter.submit(&job).await.expect("submit");
    let report = conformance::wait_final(&site.adapter, &id, o).await;
    match report.state {
        JobState::Failed {
            exit_code, failure, ..
        } => {
            assert_eq!(failure, FailureReason::ExitCode { code: 3 });
            assert_eq!(exit_code, Some(3));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_cancel_stops_a_running_job() {
    let site = rest_site(None);
    let o = &site.options;
    let job = o.job("rest-cancel", &["sleep", "300"]);
    let id = site.adapter.submit(&job).await.expect("submit");
    conformance::wait_running(&site.adapter, &id, o).await;
    site.adapter.cancel(&id).await.expect("cancel");
    let report = conformance::wait_for(&site.adapter, &id, o, o.cancel_timeout, "final", |s| {
        s.is_terminal()
    })
    .await;
    match report.state {
        JobState::Cancelled { started_at, .. } => assert!(started_at.is_some()),
        other => panic!("{other:?}"),
    }
    site.adapter.cancel(&id).await.expect("cancelling twice");
    match site.adapter.status(&o.unknown_id).await {
        Err(AdapterError::UnknownJob(_)) => {}
        other => panic!("expected UnknownJob, got {other:?}"),
    }
    match site.adapter.cancel(&o.unknown_id).await {
        Err(AdapterError::UnknownJob(_)) => {}
        other => panic!("expected UnknownJob, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_bad_token_is_a_clear_error_never_an_unknown_job() {
    // A job that exists, so a wrong "unknown" would be visible.
    let good = rest_site(None);
    let job = good.options.job("rest-token", &["true"]);
    let id = good.adapter.submit(&job).await.expect("submit");

    let bad = rest_site(Some("SLURM_JWT=not-a-token"));
    match bad
        .adapter
        .submit(&good.options.job("never", &["true"]))
        .await
    {
        Err(AdapterError::Unavailable(message)) => {
            assert!(message.contains("token"), "{message}")
        }
        other => panic!("a bad token must be Unavailable, got {other:?}"),
    }
    match bad.adapter.status(&id).await {
        Err(AdapterError::Unavailable(message)) => {
            assert!(
                message.contains("HTTP 500") && message.contains("token"),
                "{message}"
            )
        }
        other => panic!("a bad token must be Unavailable, got {other:?}"),
    }
    let capacity = bad.adapter.capacity().await.unwrap();
    assert!(!capacity.healthy, "{capacity:?}");
    conformance::wait_final(&good.adapter, &id, &good.options).await;
}

// --- the accounting fallbacks, on real sacct output ----------------------------------------

/// A value of `scontrol show config`.
fn slurm_config(key: &str) -> String {
    let out = sh("scontrol show config");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// Once slurmctld forgets a job (MinJobAge, then its purge every 60 s), the adapter reads
/// slurmdbd, or the jobcomp log on a site without one. Both must say what slurmctld said,
/// and a forgotten job must still be found by its tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_agrees_with_slurmctld() {
    let (_state, work, scratch) = dirs();
    let dbd = slurm_config("AccountingStorageType").contains("slurmdbd");
    let min_job_age: u64 = slurm_config("MinJobAge")
        .trim_end_matches(" sec")
        .parse()
        .unwrap_or(300);
    assert!(
        min_job_age <= 60,
        "MinJobAge is {min_job_age}s: this test waits for slurmctld to forget a job; \
         run infra/slurm/start.sh to bring the test cluster's config up to date"
    );
    let o = options(scratch);
    let adapter = SlurmAdapter::new(SlurmConfig::cli(work)).unwrap();
    let ok = o.job("acct-ok", &["sh", "-c", "echo done"]);
    let bad = o.job("acct-bad", &["sh", "-c", "kill -9 $$"]);
    let ok_id = adapter.submit(&ok).await.unwrap();
    let bad_id = adapter.submit(&bad).await.unwrap();
    let ok_report = conformance::wait_final(&adapter, &ok_id, &o).await;
    let bad_report = conformance::wait_final(&adapter, &bad_id, &o).await;
    match &bad_report.state {
        JobState::Failed { failure, .. } => {
            assert_eq!(
                failure,
                &FailureReason::ExitCode { code: 137 },
                "{bad_report:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    if dbd {
        assert!(ok_report.usage.cpu_seconds.is_some(), "{ok_report:?}");
    }

    for (id, report) in [(&ok_id, &ok_report), (&bad_id, &bad_report)] {
        if dbd {
            // slurmdbd takes a moment to record the end.
            let mut row = None;
            for _ in 0..40 {
                let out = sh(&format!(
                    "TZ=UTC SLURM_TIME_FORMAT=%Y-%m-%dT%H:%M:%S sacct -P -n -X -j {id} --format={SACCT_FORMAT}"
                ));
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if let Some(r) = sacct_record(&text, false) {
                    if r.report(id).unwrap().state.is_terminal() {
                        row = Some(r);
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let row = row.expect("slurmdbd has the finished job");
            let from_dbd = row.report(id).unwrap();
            assert_eq!(from_dbd.state, report.state, "slurmdbd vs slurmctld");
            assert_eq!(from_dbd.usage.nodes, 1);
            assert_eq!(from_dbd.usage.memory_bytes, 64 << 20);
        }
        let out = sh(&format!(
            "TZ=UTC SLURM_TIME_FORMAT=%Y-%m-%dT%H:%M:%S sacct -c -P -n -j {id} --format={SACCT_JOBCOMP_FORMAT}"
        ));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let from_log = sacct_record(&text, true)
            .unwrap_or_else(|| panic!("the jobcomp log has job {id}: {text:?}"))
            .report(id)
            .unwrap();
        assert_eq!(from_log.state, report.state, "jobcomp log vs slurmctld");
    }

    // Wait until slurmctld has forgotten the job, then ask the adapter again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(min_job_age + 90);
    loop {
        let out = sh(&format!("scontrol -o show job {ok_id} 2>&1"));
        if String::from_utf8_lossy(&out.stdout).contains("Invalid job id") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slurmctld never forgot job {ok_id}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let restarted = SlurmAdapter::new(adapter.config().clone()).unwrap();
    for (id, report) in [(&ok_id, &ok_report), (&bad_id, &bad_report)] {
        let again = restarted.status(id).await.expect("status from accounting");
        assert_eq!(
            again.state, report.state,
            "accounting vs slurmctld for {id}"
        );
    }
    if dbd {
        assert_eq!(
            restarted.find(ok.job_id).await.unwrap(),
            Some(ok_id.clone())
        );
        assert_eq!(
            restarted.find(bad.job_id).await.unwrap(),
            Some(bad_id.clone())
        );
        // Found, so not submitted again.
        assert_eq!(restarted.submit(&ok).await.unwrap(), ok_id);
    }
    let logs = restarted.logs(&ok_id).await.unwrap();
    assert_eq!(logs.stdout, "done\n");

    if dbd {
        // slurmrestd reads slurmdbd too (/slurmdb/…) once slurmctld has forgotten a job.
        // Slurm 22.05's dbv0.0.38 reports every exit code as 0, so only the success is
        // compared here; see docs/site-slurm.md.
        let rest = rest_site(None);
        let again = rest
            .adapter
            .status(&ok_id)
            .await
            .expect("REST status from slurmdbd");
        assert_eq!(
            again.state, ok_report.state,
            "slurmdbd over REST vs slurmctld"
        );
        assert_eq!(again.usage.memory_bytes, 64 << 20);
        assert_eq!(
            rest.adapter.find(ok.job_id).await.unwrap(),
            Some(ok_id.clone())
        );
        assert_eq!(rest.adapter.submit(&ok).await.unwrap(), ok_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_requests_are_rejected_by_slurm() {
    let (_state, work, scratch) = dirs();
    let o = options(scratch);
    let mut config = SlurmConfig::cli(work);
    config.partition = Some("no-such-partition".into());
    let adapter = SlurmAdapter::new(config).unwrap();
    match adapter.submit(&o.job("nowhere", &["true"])).await {
        Err(AdapterError::Rejected(message)) => {
            assert!(message.contains("partition"), "{message}")
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let adapter = SlurmAdapter::new(SlurmConfig::cli(o.scratch.join("w"))).unwrap();
    let mut job = o.job("too-big", &["true"]);
    job.resources.memory_bytes = 1 << 50;
    match adapter.submit(&job).await {
        Err(AdapterError::Rejected(message)) => {
            assert!(message.contains("node configuration"), "{message}")
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

/// Runs commands here and remembers which ran.
#[derive(Debug)]
struct Recording {
    inner: meridian_adapter_slurm::LocalRunner,
    programs: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl meridian_adapter_slurm::CommandRunner for Recording {
    async fn run(
        &self,
        command: &meridian_adapter_slurm::Command,
    ) -> std::io::Result<meridian_adapter_slurm::Output> {
        self.programs.lock().unwrap().push(command.program.clone());
        self.inner.run(command).await
    }
}

/// A site following an array asks Slurm once for all its waiting and running tasks, not
/// once per task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrays_tasks_are_asked_for_in_one_call() {
    let (_state, work, scratch) = dirs();
    let runner = Arc::new(Recording {
        inner: meridian_adapter_slurm::LocalRunner {
            bin_dir: None,
            timeout: Duration::from_secs(30),
        },
        programs: Default::default(),
    });
    let adapter = SlurmAdapter::with_runner(SlurmConfig::cli(work), runner.clone()).unwrap();
    let o = options(scratch);
    let mut template = o.job("slow-array", &["sleep", "20"]);
    template.array_index = Some(0);
    let array = meridian_adapter_core::ArrayRequest {
        batch_id: uuid::Uuid::now_v7(),
        template,
        tasks: (0..3)
            .map(|index| meridian_adapter_core::ArrayTask {
                index,
                job_id: uuid::Uuid::now_v7(),
            })
            .collect(),
        cap: 1,
    };
    let ids = adapter.submit_array(&array).await.expect("submit");
    runner.programs.lock().unwrap().clear();
    let reports = adapter.status_all(&ids).await;
    let programs = runner.programs.lock().unwrap().clone();
    for (r, id) in reports.iter().zip(&ids) {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{id}: {e}"));
        assert!(!r.state.is_terminal(), "{r:?}");
        assert_eq!(&r.backend_id, id);
    }
    assert_eq!(programs, ["scontrol"], "one call for three tasks");
    for id in &ids {
        adapter.cancel(id).await.expect("cancel");
    }
}
