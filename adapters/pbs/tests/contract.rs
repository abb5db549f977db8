//! Contract tests: the PBS adapter against the outputs OpenPBS documents for qsub, qstat
//! and pbsnodes, replayed by stand-in commands (`tests/fixtures/pbs-standin.sh`) that a
//! test puts in the adapter's `bin_dir`. The stand-ins record every call, so each test
//! checks both what the adapter sends and what it makes of the answer. No PBS server runs
//! here; see docs/site-pbs.md.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use meridian_adapter_core::{
    AdapterError, BackendJobId, FailureReason, JobRequest, JobState, SiteAdapter,
};
use meridian_adapter_pbs::{array_args, depend_arg, PbsAdapter, PbsConfig, PbsId};
use uuid::Uuid;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
/// The Meridian job id `qstat-all.json` tags jobs 130 and 131 with.
const TAGGED: &str = "0193b6a2-4c1e-7d3a-9f00-00000000a001";

struct Site {
    dir: tempfile::TempDir,
    adapter: PbsAdapter,
}

fn site_with(config: impl FnOnce(&mut PbsConfig)) -> Site {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(state.join("jobs")).unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    for name in ["qsub", "qstat", "qdel", "pbsnodes"] {
        let to = bin.join(name);
        std::fs::copy(Path::new(FIXTURES).join("pbs-standin.sh"), &to).unwrap();
        // Whatever mode the checkout gave the fixture, the stand-ins must run.
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::copy(fixture("pbsnodes.json"), state.join("pbsnodes.json")).unwrap();
    std::fs::copy(fixture("qstat-server.json"), state.join("server.json")).unwrap();
    std::fs::copy(fixture("qstat-queue-gpu.json"), state.join("queue.json")).unwrap();
    let mut c = PbsConfig::new(dir.path().join("work"));
    c.bin_dir = Some(bin);
    config(&mut c);
    let adapter = PbsAdapter::new(c).expect("adapter");
    Site { dir, adapter }
}

fn site() -> Site {
    site_with(|_| {})
}

fn fixture(name: &str) -> PathBuf {
    Path::new(FIXTURES).join(name)
}

impl Site {
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Makes `qstat … <id>` answer with this fixture; returns the job's id.
    fn job(&self, name: &str) -> BackendJobId {
        let text = std::fs::read_to_string(fixture(name))
            .unwrap()
            .replace("@WORK@", &self.work().display().to_string());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let id = v["Jobs"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        std::fs::write(self.state().join("jobs").join(format!("{id}.json")), text).unwrap();
        BackendJobId(id)
    }

    fn all_jobs(&self, name: &str) {
        let text = std::fs::read_to_string(fixture(name))
            .unwrap()
            .replace("@WORK@", &self.work().display().to_string());
        std::fs::write(self.state().join("all.json"), text).unwrap();
    }

    fn fail(&self, command: &str, stderr_fixture: &str, rc: i32, stdout_fixture: Option<&str>) {
        let state = self.state();
        std::fs::copy(
            fixture(stderr_fixture),
            state.join(format!("{command}.fail")),
        )
        .unwrap();
        std::fs::write(state.join(format!("{command}.fail.rc")), rc.to_string()).unwrap();
        if let Some(out) = stdout_fixture {
            std::fs::copy(fixture(out), state.join(format!("{command}.fail.stdout"))).unwrap();
        }
    }

    /// Every call so far: the command name, then its arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.state().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split('\u{1f}').map(str::to_string).collect())
            .collect()
    }
}

fn t(h: u32, m: u32, s: u32) -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 11, 24, h, m, s).unwrap()
}

fn request(name: &str) -> JobRequest {
    let mut job = JobRequest::new(name, &["sh", "-c", "echo \"$GREETING\""]);
    job.env = BTreeMap::from([("GREETING".into(), "hello, world".into())]);
    job.resources.cpus = 4;
    job.resources.memory_bytes = 16 << 30;
    job.resources.walltime = Duration::from_secs(3600);
    job
}

#[tokio::test]
async fn contract_submit_sends_the_documented_qsub_arguments() {
    let s = site_with(|c| c.queue = Some("workq".into()));
    std::fs::write(s.state().join("qsub.next"), "4242.pbs01\n").unwrap();
    let mut job = request("prep");
    job.array_index = Some(3);
    let id = s.adapter.submit(&job).await.expect("submit");
    assert_eq!(id, BackendJobId("4242.pbs01".into()));

    let calls = s.calls();
    // First the lookup for an earlier submission, then qsub.
    assert_eq!(calls[0], ["qstat", "-f", "-F", "json", "-x"]);
    let qsub = &calls[1];
    assert_eq!(qsub[0], "qsub");
    let args = &qsub[1..];
    let work = s.work().display().to_string();
    let script = format!("{work}/meridian-{}.sh", job.job_id);
    assert_eq!(
        args,
        [
            "-N".to_string(),
            "prep-3".into(),
            "-o".into(),
            format!("{work}/meridian-{}.out", job.job_id),
            "-e".into(),
            format!("{work}/meridian-{}.err", job.job_id),
            "-l".into(),
            "select=1:ncpus=4:mem=16384mb".into(),
            "-l".into(),
            "walltime=01:00:00".into(),
            "-q".into(),
            "workq".into(),
            "-v".into(),
            format!(
                "MERIDIAN_JOB_ID={},MERIDIAN_WORKFLOW_ID={},MERIDIAN_ARRAY_INDEX=3,ARRAY_INDEX=3",
                job.job_id, job.workflow_id
            ),
            script.clone(),
        ]
    );
    let submitted = std::fs::read_to_string(s.state().join("submitted.sh")).unwrap();
    assert!(submitted.starts_with("#!/bin/sh\n"), "{submitted}");
    assert!(
        submitted.contains(&format!("cd {work} || exit 1\n")),
        "{submitted}"
    );
    assert!(
        submitted.contains("export GREETING='hello, world'\n"),
        "{submitted}"
    );
    assert!(
        submitted.ends_with("exec sh -c 'echo \"$GREETING\"'\n"),
        "{submitted}"
    );
}

#[tokio::test]
async fn contract_a_tagged_job_is_found_not_submitted_again() {
    let s = site();
    s.all_jobs("qstat-all.json");
    let mut job = request("tagged");
    job.job_id = TAGGED.parse().unwrap();
    // 130 and 131 both carry the tag: the first submitted is the one.
    assert_eq!(
        s.adapter.find(job.job_id).await.unwrap(),
        Some(BackendJobId("130.pbs01".into()))
    );
    assert_eq!(
        s.adapter.submit(&job).await.unwrap(),
        BackendJobId("130.pbs01".into())
    );
    assert!(
        s.calls().iter().all(|c| c[0] != "qsub"),
        "nothing submitted: {:?}",
        s.calls()
    );
    assert_eq!(s.adapter.find(Uuid::now_v7()).await.unwrap(), None);
}

#[tokio::test]
async fn contract_every_job_state_letter() {
    let s = site();
    let pending = JobState::Pending;
    let running = JobState::Running {
        started_at: t(10, 0, 0),
    };
    let cases: Vec<(&str, JobState)> = vec![
        ("qstat-101-Q.json", pending.clone()),
        ("qstat-102-H.json", pending.clone()),
        ("qstat-103-W.json", pending.clone()),
        ("qstat-104-T.json", pending.clone()),
        (
            "qstat-105-M.json",
            JobState::Failed {
                started_at: None,
                ended_at: t(10, 2, 0),
                exit_code: None,
                failure: FailureReason::Lost,
            },
        ),
        ("qstat-106-R.json", running.clone()),
        ("qstat-107-S.json", running.clone()),
        ("qstat-108-U.json", running.clone()),
        ("qstat-109-E.json", running.clone()),
        (
            "qstat-110-F-exit0.json",
            JobState::Succeeded {
                started_at: t(10, 0, 0),
                ended_at: t(10, 2, 0),
            },
        ),
        (
            "qstat-111-F-exit3.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 2, 0),
                exit_code: Some(3),
                failure: FailureReason::ExitCode { code: 3 },
            },
        ),
        (
            "qstat-112-F-walltime.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 10, 1),
                exit_code: None,
                failure: FailureReason::Timeout,
            },
        ),
        (
            "qstat-113-F-271-walltime.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 10, 2),
                exit_code: None,
                failure: FailureReason::Timeout,
            },
        ),
        (
            "qstat-114-F-string-values.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 2, 0),
                exit_code: Some(2),
                failure: FailureReason::ExitCode { code: 2 },
            },
        ),
        (
            "qstat-115-F-deleted-queued.json",
            JobState::Cancelled {
                started_at: None,
                ended_at: t(10, 2, 0),
            },
        ),
        (
            "qstat-116-F-271.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 0, 30),
                exit_code: Some(143),
                failure: FailureReason::ExitCode { code: 143 },
            },
        ),
        (
            "qstat-117-F-mem.json",
            JobState::Failed {
                started_at: Some(t(10, 0, 0)),
                ended_at: t(10, 2, 0),
                exit_code: None,
                failure: FailureReason::OutOfMemory,
            },
        ),
        (
            "qstat-118-F-exec-fail.json",
            JobState::Failed {
                started_at: None,
                ended_at: t(10, 2, 0),
                exit_code: None,
                failure: FailureReason::BootFailure,
            },
        ),
        ("qstat-120-array-B.json", running.clone()),
        (
            "qstat-120-7-X.json",
            JobState::Succeeded {
                started_at: t(10, 0, 0),
                ended_at: t(10, 2, 0),
            },
        ),
        ("qstat-120-8-R.json", running.clone()),
    ];
    for (name, want) in cases {
        let id = s.job(name);
        let report = s
            .adapter
            .status(&id)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.state, want, "{name}");
        assert_eq!(report.backend_id, id);
        let last = s.calls().pop().unwrap();
        assert_eq!(last, ["qstat", "-f", "-F", "json", "-x", &id.0], "{name}");
    }
}

#[tokio::test]
async fn contract_usage_comes_from_the_resource_lists_even_as_strings() {
    let s = site();
    let id = s.job("qstat-114-F-string-values.json");
    let usage = s.adapter.status(&id).await.unwrap().usage;
    assert_eq!((usage.nodes, usage.cpus, usage.gpus), (2, 8, 1));
    assert_eq!(usage.memory_bytes, 64 << 20);
    assert_eq!(usage.cpu_seconds, Some(1000.0));
    assert_eq!(usage.max_rss_bytes, Some(10 << 20));
    // A job that never ran used nothing.
    let id = s.job("qstat-101-Q.json");
    assert_eq!(
        s.adapter.status(&id).await.unwrap().usage,
        Default::default()
    );
}

/// A running job says where its script runs (`exec_host`'s first host): a service there
/// is ready once it answers on its port.
#[tokio::test]
async fn contract_a_running_job_reports_its_execution_host() {
    let s = site();
    let id = s.job("qstat-106-R.json");
    assert_eq!(
        s.adapter.status(&id).await.unwrap().host.as_deref(),
        Some("node01")
    );
    let id = s.job("qstat-110-F-exit0.json");
    assert_eq!(
        s.adapter.status(&id).await.unwrap().host,
        None,
        "ended: nowhere"
    );
}

/// A service is one PBS job whose script starts the command again when it exits.
#[tokio::test]
async fn contract_a_service_is_one_job_with_a_restart_loop() {
    let s = site();
    let mut job = request("web");
    job.service = Some(meridian_adapter_core::ServiceRequest {
        port: 8000,
        min_replicas: 1,
        max_replicas: 1,
        max_restarts: 3,
    });
    std::fs::write(s.state().join("qsub.next"), "4243.pbs01\n").unwrap();
    s.adapter.submit(&job).await.unwrap();
    let script = std::fs::read_to_string(s.state().join("submitted.sh")).unwrap();
    assert!(script.contains("meridian_left=3"), "{script}");
    assert!(
        script.contains("export MERIDIAN_SERVICE_PORT=8000"),
        "{script}"
    );
    assert!(script.contains("while :; do"), "{script}");
}

#[tokio::test]
async fn contract_array_ids_and_helpers() {
    let s = site();
    let parent = s.job("qstat-120-array-B.json");
    assert_eq!(parent.0, "120[].pbs01");
    let pid = PbsId::parse(&parent.0).unwrap();
    assert_eq!((pid.seq, pid.array), (120, Some(None)));
    let sub = s.job("qstat-120-7-X.json");
    assert_eq!(PbsId::parse(&sub.0).unwrap().array, Some(Some(7)));
    assert!(s.adapter.status(&sub).await.unwrap().state.is_terminal());
    // The `-J` Meridian sends for a batch, and the dependency syntax it does not use.
    assert_eq!(
        array_args(1, 1000, None, Some(50)),
        ["-J", "1-1000", "-W", "max_run_subjobs=50"]
    );
    assert_eq!(
        depend_arg("afterok", &[PbsId::parse("110.pbs01").unwrap(), pid]).unwrap(),
        "depend=afterok:110.pbs01:120[].pbs01"
    );
    assert!(matches!(
        depend_arg("afterwards", &[PbsId::parse("1").unwrap()]),
        Err(AdapterError::Rejected(_))
    ));
}

#[tokio::test]
async fn contract_unknown_queue_is_rejected() {
    let s = site_with(|c| c.queue = Some("nosuch".into()));
    s.fail("qsub", "qsub-unknown-queue.stderr", 170, None);
    match s.adapter.submit(&request("nowhere")).await {
        Err(AdapterError::Rejected(message)) => {
            assert_eq!(message, "qsub: Unknown queue")
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[tokio::test]
async fn contract_connection_errors_are_unavailable() {
    let s = site();
    let id = s.job("qstat-106-R.json");
    s.fail(
        "qstat",
        "connection-refused.stderr",
        255,
        Some("connection-refused.stdout"),
    );
    s.fail("qsub", "connection-refused.stderr", 255, None);
    s.fail("pbsnodes", "connection-refused.stderr", 255, None);
    for result in [
        s.adapter.status(&id).await.map(|_| ()),
        s.adapter.find(Uuid::now_v7()).await.map(|_| ()),
        s.adapter.submit(&request("later")).await.map(|_| ()),
        s.adapter.cancel(&id).await,
    ] {
        match result {
            Err(AdapterError::Unavailable(message)) => {
                assert!(message.contains("cannot connect to server"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    let capacity = s.adapter.capacity().await.unwrap();
    assert!(!capacity.healthy);
    assert!(capacity.message.unwrap().contains("errno=15010"));
}

#[tokio::test]
async fn contract_unknown_jobs_are_unknown() {
    let s = site();
    for id in ["999.pbs01", "not-a-pbs-id"] {
        let id = BackendJobId(id.into());
        assert!(matches!(
            s.adapter.status(&id).await,
            Err(AdapterError::UnknownJob(_))
        ));
        assert!(matches!(
            s.adapter.cancel(&id).await,
            Err(AdapterError::UnknownJob(_))
        ));
        assert!(matches!(
            s.adapter.logs(&id).await,
            Err(AdapterError::UnknownJob(_))
        ));
    }
}

#[tokio::test]
async fn contract_cancel_deletes_and_reports_cancelled() {
    let s = site();
    let id = s.job("qstat-106-R.json");
    s.adapter.cancel(&id).await.expect("cancel");
    assert_eq!(s.calls().last().unwrap(), &["qdel", "106.pbs01"]);
    // PBS now reports the deleted job as finished, killed by SIGTERM: 271.
    let text = std::fs::read_to_string(fixture("qstat-116-F-271.json"))
        .unwrap()
        .replace("116.pbs01", "106.pbs01");
    std::fs::write(s.state().join("jobs/106.pbs01.json"), text).unwrap();
    // A restarted adapter on the same work dir knows the end was a cancellation.
    let restarted = PbsAdapter::new(s.adapter.config().clone()).unwrap();
    assert_eq!(
        restarted.status(&id).await.unwrap().state,
        JobState::Cancelled {
            started_at: Some(t(10, 0, 0)),
            ended_at: t(10, 0, 30)
        }
    );
    // Cancelling what has ended changes nothing and calls no qdel.
    let calls = s.calls().len();
    restarted.cancel(&id).await.expect("cancel again");
    let finished = s.job("qstat-110-F-exit0.json");
    restarted
        .cancel(&finished)
        .await
        .expect("cancel a finished job");
    assert!(s.calls()[calls..].iter().all(|c| c[0] != "qdel"));
    assert!(matches!(
        restarted.status(&finished).await.unwrap().state,
        JobState::Succeeded { .. }
    ));
}

#[tokio::test]
async fn contract_logs_come_from_the_delivered_files() {
    let s = site();
    let id = s.job("qstat-110-F-exit0.json");
    std::fs::write(s.work().join("meridian-ok.out"), "to-stdout\n").unwrap();
    std::fs::write(s.work().join("meridian-ok.err"), "to-stderr\n").unwrap();
    let logs = s.adapter.logs(&id).await.unwrap();
    assert_eq!(
        (logs.stdout.as_str(), logs.stderr.as_str()),
        ("to-stdout\n", "to-stderr\n")
    );
    // Running: PBS delivers output at the end, so there is none yet.
    let id = s.job("qstat-106-R.json");
    let logs = s.adapter.logs(&id).await.unwrap();
    assert_eq!((logs.stdout.as_str(), logs.stderr.as_str()), ("", ""));
}

#[tokio::test]
async fn contract_capacity_from_pbsnodes_and_the_server() {
    let s = site();
    let c = s.adapter.capacity().await.unwrap();
    assert!(c.healthy, "{c:?}");
    // node04 is down,offline: counted in totals, not in what is free.
    assert_eq!((c.total_cpus, c.free_cpus, c.idle_nodes), (32, 14, 1));
    assert_eq!(c.total_memory_bytes, 128 << 30);
    assert_eq!(c.free_memory_bytes, (32 << 30) + (24 << 30));
    assert_eq!(c.free_gpus, 3);
    // node02 names its GPUs' model in a `gpu_model` resource.
    assert_eq!(c.free_gpus_by_model, [("A100".to_string(), 3)].into());
    // Queued 3 + Waiting 1 (held jobs wait for a person, not for resources).
    assert_eq!(c.pending, 4);
    assert_eq!(s.calls()[0], ["pbsnodes", "-a", "-F", "json"]);
    assert_eq!(s.calls()[1], ["qstat", "-B", "-f", "-F", "json"]);

    let q = site_with(|c| c.queue = Some("gpu".into()));
    assert_eq!(q.adapter.capacity().await.unwrap().pending, 2);
    assert_eq!(q.calls()[1], ["qstat", "-Q", "-f", "-F", "json", "gpu"]);
}

/// `fixture` with its one job renamed `id` and `edit` applied to that job.
fn job_fixture(
    s: &Site,
    fixture_name: &str,
    id: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> String {
    let text = std::fs::read_to_string(fixture(fixture_name))
        .unwrap()
        .replace("@WORK@", &s.work().display().to_string());
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let jobs = v["Jobs"].as_object_mut().unwrap();
    let (_, mut job) = jobs
        .iter()
        .next()
        .map(|(k, j)| (k.clone(), j.clone()))
        .unwrap();
    edit(&mut job);
    jobs.clear();
    jobs.insert(id.to_string(), job);
    v.to_string()
}

#[tokio::test]
async fn contract_an_array_goes_as_one_qsub_j_held_to_its_cap() {
    let s = site_with(|c| c.queue = Some("workq".into()));
    std::fs::write(s.state().join("qsub.next"), "130[].pbs01\n").unwrap();
    let mut template = request("sweep");
    template.command = vec![
        "sh".into(),
        "-c".into(),
        "echo \"task $ARRAY_INDEX job $MERIDIAN_JOB_ID arg $1\"".into(),
        "sh".into(),
        "cell-${ARRAY_INDEX}".into(),
    ];
    template.array_index = Some(4);
    let array = meridian_adapter_core::ArrayRequest {
        batch_id: Uuid::now_v7(),
        template: template.clone(),
        tasks: [4, 7, 9]
            .into_iter()
            .map(|index| meridian_adapter_core::ArrayTask {
                index,
                job_id: Uuid::now_v7(),
            })
            .collect(),
        cap: 2,
    };
    assert_eq!(s.adapter.array_limit(), Some(10_000));
    let ids = s.adapter.submit_array(&array).await.expect("submit");
    assert_eq!(
        ids,
        ["130[0].pbs01", "130[1].pbs01", "130[2].pbs01"].map(|i| BackendJobId(i.into()))
    );
    let calls = s.calls();
    assert_eq!(calls[0], ["qstat", "-f", "-F", "json", "-x"]);
    let work = s.work().display().to_string();
    let batch = array.batch_id;
    assert_eq!(
        calls[1][1..],
        [
            "-N".to_string(),
            "sweep".into(),
            "-o".into(),
            format!("{work}/meridian-{batch}.^array_index^.out"),
            "-e".into(),
            format!("{work}/meridian-{batch}.^array_index^.err"),
            "-l".into(),
            "select=1:ncpus=4:mem=16384mb".into(),
            "-l".into(),
            "walltime=01:00:00".into(),
            "-q".into(),
            "workq".into(),
            "-J".into(),
            "0-2".into(),
            "-W".into(),
            "max_run_subjobs=2".into(),
            "-v".into(),
            format!(
                "MERIDIAN_WORKFLOW_ID={},MERIDIAN_BATCH_ID={batch}",
                template.workflow_id
            ),
            format!("{work}/meridian-{batch}.sh"),
        ]
    );
    // The one script runs each subjob as its own task, and nothing for an index it
    // does not know.
    let script = std::fs::read_to_string(s.state().join("submitted.sh")).unwrap();
    let run = |index: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("PBS_ARRAY_INDEX", index)
            .output()
            .unwrap()
    };
    let out = run("1");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("task 7 job {} arg cell-7\n", array.tasks[1].job_id),
        "{script}"
    );
    let out = run("3");
    assert!(!out.status.success(), "{script}");

    // Found again by its tag, not submitted twice.
    let all = job_fixture(&s, "qstat-120-array-B.json", "130[].pbs01", |job| {
        job["Variable_List"]["MERIDIAN_BATCH_ID"] = batch.to_string().into();
    });
    std::fs::write(s.state().join("all.json"), all).unwrap();
    let restarted = PbsAdapter::new(s.adapter.config().clone()).unwrap();
    assert_eq!(restarted.submit_array(&array).await.unwrap(), ids);
    assert_eq!(
        s.calls().iter().filter(|c| c[0] == "qsub").count(),
        1,
        "one qsub for the array"
    );

    // A subjob is followed as itself, and its output read at its index.
    let sub = job_fixture(&s, "qstat-120-7-X.json", "130[1].pbs01", |job| {
        job["Output_Path"] = format!("login1:{work}/meridian-{batch}.^array_index^.out").into();
    });
    std::fs::write(s.state().join("jobs").join("130[1].pbs01.json"), sub).unwrap();
    std::fs::write(s.work().join(format!("meridian-{batch}.1.out")), "cell 7\n").unwrap();
    assert!(s.adapter.status(&ids[1]).await.unwrap().state.is_terminal());
    assert_eq!(s.adapter.logs(&ids[1]).await.unwrap().stdout, "cell 7\n");
}

#[tokio::test]
async fn contract_an_array_of_one_task_is_a_plain_job() {
    let s = site();
    std::fs::write(s.state().join("qsub.next"), "131.pbs01\n").unwrap();
    let template = request("sweep");
    let task = meridian_adapter_core::ArrayTask {
        index: 4,
        job_id: Uuid::now_v7(),
    };
    let array = meridian_adapter_core::ArrayRequest {
        batch_id: Uuid::now_v7(),
        template: template.clone(),
        tasks: vec![task],
        cap: 1,
    };
    let ids = s.adapter.submit_array(&array).await.unwrap();
    assert_eq!(ids, [BackendJobId("131.pbs01".into())]);
    let qsub = s.calls().into_iter().find(|c| c[0] == "qsub").unwrap();
    assert!(!qsub.contains(&"-J".to_string()), "{qsub:?}");
    assert_eq!(qsub[2], "sweep-4");
    assert!(
        qsub.contains(&format!(
            "MERIDIAN_JOB_ID={},MERIDIAN_WORKFLOW_ID={},MERIDIAN_ARRAY_INDEX=4,ARRAY_INDEX=4",
            task.job_id, template.workflow_id
        )),
        "{qsub:?}"
    );
}
