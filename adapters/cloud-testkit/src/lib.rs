//! For tests only: the machines a cloud stand-in's instances would be. [`Machines`] boots
//! each instance its stand-in says is running by running the bootstrap it was launched
//! with (`sh`, in a process group of its own, in a work directory of its own), and kills
//! that group when the instance is no longer running, as a VM that stops takes its
//! processes with it. It also serves the two routes of Meridian's API that a bootstrap
//! calls (`POST /v1/runs/{job}/report`, `PUT /v1/runs/{job}/output/{stream}`), checking
//! the run credential, into [`MemoryReports`] the adapter reads. [`Placed`] gives a test
//! job what placement would (a shape and where to report), so that the conformance kit of
//! `meridian-adapter-core` runs against a cloud site unchanged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{post, put};
use axum::Router;
use chrono::Utc;
use meridian_adapter_cloud::testing::MemoryReports;
use meridian_adapter_cloud::LifecycleConfig;
use meridian_adapter_core::conformance::{ConformanceOptions, Harness};
use meridian_adapter_core::{
    AdapterError, BackendJobId, Capacity, JobReport, JobRequest, Logs, PlacedShape, ReportTo,
    SiteAdapter,
};
use uuid::Uuid;

/// An instance to play: its provider id, the bootstrap it was launched with, and the URL
/// that stops it (what its power-off calls).
#[derive(Debug, Clone)]
pub struct Running {
    pub id: String,
    pub script: String,
    pub power_off_url: String,
}

/// The run credential every played bootstrap reports with.
const CREDENTIAL: &str = "mer_run_testkit";

#[derive(Clone)]
struct Inner {
    reports: MemoryReports,
    /// Instance id → the process group of its bootstrap.
    booted: Arc<Mutex<HashMap<String, i32>>>,
}

/// The machines, and the report routes.
pub struct Machines {
    inner: Inner,
    url: String,
    dir: PathBuf,
}

impl Machines {
    /// Serves the report routes on a free port; instances' work directories go under
    /// `dir`.
    pub async fn start(dir: &Path) -> Machines {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let inner = Inner {
            reports: MemoryReports::default(),
            booted: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/runs/{job}/report", post(report))
            .route("/v1/runs/{job}/output/{stream}", put(output))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Machines {
            inner,
            url,
            dir: dir.to_path_buf(),
        }
    }

    /// What runs reported, for the adapter to read.
    pub fn reports(&self) -> MemoryReports {
        self.inner.reports.clone()
    }

    /// Where a bootstrap reports, and with what.
    pub fn report_to(&self) -> ReportTo {
        ReportTo {
            server: self.url.clone(),
            credential: CREDENTIAL.into(),
        }
    }

    /// The lifecycle's `power_off_command` for played instances: it calls the URL of the
    /// instance it runs on.
    pub fn power_off_command() -> &'static str {
        "curl -fsS -o /dev/null -X POST \"$MERIDIAN_TESTKIT_POWER_OFF\""
    }

    /// Plays, every 100 ms until the runtime ends, what `running` lists: boots the new
    /// ones, kills the ones no longer listed.
    pub fn follow(&self, running: impl Fn() -> Vec<Running> + Send + 'static) {
        let booted = self.inner.booted.clone();
        let dir = self.dir.clone();
        tokio::spawn(async move {
            loop {
                let now = running();
                let gone: Vec<(String, i32)> = {
                    let b = booted.lock().unwrap_or_else(|e| e.into_inner());
                    b.iter()
                        .filter(|(id, _)| !now.iter().any(|r| &r.id == *id))
                        .map(|(id, g)| (id.clone(), *g))
                        .collect()
                };
                for (id, group) in gone {
                    // SAFETY: killpg only sends a signal; a group already gone answers
                    // ESRCH, which is ignored.
                    unsafe {
                        libc::killpg(group, libc::SIGKILL);
                    }
                    booted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, -1);
                }
                for r in now {
                    if booted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains_key(&r.id)
                    {
                        continue;
                    }
                    if let Some(group) = boot(&dir, &r) {
                        booted
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(r.id.clone(), group);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
}

/// Runs `r`'s bootstrap in a work directory of its own (each instance has its own disk);
/// its process group.
fn boot(dir: &Path, r: &Running) -> Option<i32> {
    let name: String =
        r.id.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
    let work = dir.join(&name);
    std::fs::create_dir_all(&work).ok()?;
    let script: String = r
        .script
        .lines()
        .map(|l| {
            if l.starts_with("work=") {
                format!("work='{}'", work.join("disk").display())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = work.join("bootstrap.sh");
    std::fs::write(&path, script).ok()?;
    let log = std::fs::File::create(work.join("console.log")).ok()?;
    let child = tokio::process::Command::new("sh")
        .arg(&path)
        .env("MERIDIAN_TESTKIT_POWER_OFF", &r.power_off_url)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().ok()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .ok()?;
    let group = child.id()? as i32;
    tokio::spawn(async move {
        let mut child = child;
        let _ = child.wait().await;
    });
    Some(group)
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {CREDENTIAL}"))
}

async fn report(
    State(s): State<Inner>,
    UrlPath(job): UrlPath<Uuid>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    match v["event"].as_str() {
        Some("started") => s.reports.started(job, Utc::now()),
        Some("exited") => match v["exit_code"].as_i64() {
            Some(code) => s.reports.ended(job, code as i32),
            None => return StatusCode::BAD_REQUEST,
        },
        _ => return StatusCode::BAD_REQUEST,
    }
    StatusCode::NO_CONTENT
}

async fn output(
    State(s): State<Inner>,
    UrlPath((job, stream)): UrlPath<(Uuid, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED;
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    match stream.as_str() {
        "stdout" | "stderr" => s.reports.output(job, &stream, &text),
        _ => return StatusCode::NOT_FOUND,
    }
    StatusCode::NO_CONTENT
}

/// A cloud site as placement hands it work: each job gets `shape` and where to report
/// before it reaches `site`.
pub struct Placed {
    pub site: Arc<dyn SiteAdapter>,
    pub shape: String,
    pub report_to: ReportTo,
}

#[async_trait]
impl SiteAdapter for Placed {
    fn kind(&self) -> &'static str {
        self.site.kind()
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        let mut job = job.clone();
        job.shape = Some(PlacedShape {
            name: self.shape.clone(),
            offer: self.shape.clone(),
            spot: false,
            gpu_vendor: None,
        });
        job.report_to = Some(self.report_to.clone());
        self.site.submit(&job).await
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        self.site.find(job_id).await
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        self.site.status(id).await
    }

    async fn status_all(&self, ids: &[BackendJobId]) -> Vec<Result<JobReport, AdapterError>> {
        self.site.status_all(ids).await
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        self.site.cancel(id).await
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        self.site.logs(id).await
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        self.site.capacity().await
    }
}

/// The conformance kit's harness for a cloud site: `running` lists the stand-in's running
/// instances for [`Machines`] to play (under `dir`); `site` opens the site anew (as a
/// restarted adapter) with the lifecycle given and the runs' reports, and its jobs are
/// placed on `shape`. A backend id naming no instance is `unknown_id`.
pub async fn harness(
    dir: &Path,
    shape: &str,
    unknown_id: String,
    running: impl Fn() -> Vec<Running> + Send + 'static,
    site: impl Fn(LifecycleConfig, MemoryReports) -> Arc<dyn SiteAdapter> + Send + Sync + 'static,
) -> Harness {
    let machines = Machines::start(&dir.join("machines")).await;
    machines.follow(running);
    let lifecycle = LifecycleConfig {
        walltime_grace: Duration::from_secs(1),
        boot_timeout: Duration::from_secs(60),
        power_off_command: Machines::power_off_command().into(),
        work_dir: dir.join("disk").display().to_string(),
        output_every_seconds: 1,
        ..LifecycleConfig::default()
    };
    let (reports, report_to) = (machines.reports(), machines.report_to());
    let mut options = ConformanceOptions::new(dir.join("scratch"));
    std::fs::create_dir_all(&options.scratch).expect("the scratch directory");
    options.unknown_id = BackendJobId(unknown_id);
    let shape = shape.to_string();
    let site = Arc::new(site);
    Harness {
        open: Arc::new(move || {
            let placed = Placed {
                site: site(lifecycle.clone(), reports.clone()),
                shape: shape.clone(),
                report_to: report_to.clone(),
            };
            Box::pin(async move { Arc::new(placed) as Arc<dyn SiteAdapter> })
        }),
        options,
    }
}

/// The conformance kit against a cloud site, one `#[tokio::test]` per check: every check
/// but `capacity_reports_healthy`, since a cloud site has no fixed capacity to report
/// (its quotas are not read).
#[macro_export]
macro_rules! cloud_conformance_suite {
    ($harness:expr) => {
        meridian_adapter_core::conformance_suite!(@tests $harness;
            succeeded_job_reports_times_in_order, failed_job_reports_exit_code,
            logs_keep_stdout_and_stderr_apart, array_index_and_env_reach_the_job,
            cancel_stops_a_running_job, walltime_exceeded_fails_with_timeout,
            resubmission_after_restart_runs_nothing_again, concurrent_submissions_run_once,
            job_running_across_restart_finishes_through_new_instance,
            walltime_enforced_after_restart, unknown_job_is_reported_unknown,
            array_runs_as_one_submission_within_its_cap);
    };
}
