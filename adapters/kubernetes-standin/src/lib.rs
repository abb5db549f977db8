//! A stand-in Kubernetes API server, for tests only.
//!
//! It speaks the documented Kubernetes REST shapes of batch/v1 Jobs, apps/v1
//! Deployments and core/v1 Pods, Services, PersistentVolumeClaims, Nodes and
//! Namespaces, with resource versions and watches, so that the real kube-rs
//! client can be tested against it. Behind the API sit small versions of the Job
//! and Deployment controllers, the scheduler and the kubelet; the kubelet runs each
//! pod's container command as a local process: no images, no isolation, no
//! network of its own. Never point it at anything but tests and hand trials.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let standin = meridian_kube_standin::StandIn::start(meridian_kube_standin::Options::new("/tmp/standin")).await?;
//! let kubeconfig = standin.kubeconfig("meridian"); // hand this to kube-rs
//! # Ok(()) }
//! ```

mod api;
mod controllers;
mod kubelet;
mod select;
mod store;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// What the stand-in cluster looks like.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: Vec<Node>,
    /// Namespaces that exist.
    pub namespaces: Vec<String>,
    /// Namespaces that exist but where every request answers 403 Forbidden.
    pub forbidden_namespaces: Vec<String>,
    /// The bearer token every request must carry (401 otherwise).
    pub token: String,
    /// Where pod logs and working directories go (one dir per pod uid).
    pub work_dir: PathBuf,
}

/// A node: its capacity is what the scheduler fits pods into.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub labels: BTreeMap<String, String>,
    /// extended resources, e.g. "nvidia.com/gpu" -> 4
    pub extended: BTreeMap<String, u32>,
}

impl Node {
    /// A node with no extended resources, labelled only with kubernetes.io/hostname.
    pub fn new(name: impl Into<String>, cpus: u32, memory_bytes: u64) -> Node {
        let name = name.into();
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.clone())]);
        Node {
            name,
            cpus,
            memory_bytes,
            labels,
            extended: BTreeMap::new(),
        }
    }
}

impl Options {
    /// One node "standin-node-1" (8 cpus, 16 GiB, no GPUs), namespace "meridian",
    /// token "standin-token".
    pub fn new(work_dir: impl Into<PathBuf>) -> Self {
        Options {
            nodes: vec![Node::new("standin-node-1", 8, 16 << 30)],
            namespaces: vec!["meridian".into()],
            forbidden_namespaces: Vec::new(),
            token: "standin-token".into(),
            work_dir: work_dir.into(),
        }
    }
}

pub(crate) struct Shared {
    pub opts: Options,
    pub state: Mutex<store::State>,
    /// Every HTTP request received, for tests that count API calls.
    pub requests: AtomicU64,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, store::State> {
        // A panic elsewhere must not take the whole stand-in down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn node_object(n: &Node) -> Value {
    let memory = if n.memory_bytes.is_multiple_of(1024) {
        format!("{}Ki", n.memory_bytes / 1024)
    } else {
        n.memory_bytes.to_string()
    };
    let mut caps = json!({"cpu": n.cpus.to_string(), "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"});
    for (r, count) in &n.extended {
        caps[r] = json!(count.to_string());
    }
    let mut labels = json!(n.labels);
    if labels.get("kubernetes.io/hostname").is_none() {
        labels["kubernetes.io/hostname"] = json!(n.name);
    }
    let now = store::now();
    json!({
        "metadata": {"name": n.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": caps, "allocatable": caps,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": n.name}],
            "nodeInfo": {"architecture": std::env::consts::ARCH, "bootID": "", "containerRuntimeVersion": "standin://0",
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "v1.33.0-standin", "machineID": "",
                "operatingSystem": "linux", "osImage": "Meridian Kubernetes stand-in", "systemUUID": ""}
        }
    })
}

/// A running stand-in. Dropping it stops it.
pub struct StandIn {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl StandIn {
    /// Binds 127.0.0.1 on a free port and spawns the server and the controllers on
    /// the current tokio runtime.
    pub async fn start(options: Options) -> std::io::Result<StandIn> {
        std::fs::create_dir_all(&options.work_dir)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut st = store::State::new();
        let namespaces = store::kind("namespaces").expect("namespaces");
        let mut names: Vec<&String> = options
            .namespaces
            .iter()
            .chain(&options.forbidden_namespaces)
            .collect();
        names.dedup();
        for ns in names {
            let obj = json!({"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            st.insert(namespaces, "", obj);
        }
        for n in &options.nodes {
            st.insert(store::kind("nodes").expect("nodes"), "", node_object(n));
        }
        let shared = Arc::new(Shared {
            opts: options,
            state: Mutex::new(st),
            requests: AtomicU64::new(0),
        });
        let app = api::router(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "stand-in server stopped");
            }
        });
        let controllers = tokio::spawn(controllers::run(shared.clone()));
        tracing::info!(%addr, "Kubernetes stand-in listening");
        Ok(StandIn {
            shared,
            addr,
            tasks: vec![server, controllers],
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig with cluster, user and context all named "standin".
    pub fn kubeconfig(&self, namespace: &str) -> String {
        // JSON strings are valid YAML scalars, and quote whatever needs quoting.
        let q = |s: &str| Value::String(s.to_string()).to_string();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\nusers:\n- name: standin\n  user:\n    token: {}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: {}\ncurrent-context: standin\npreferences: {{}}\n",
            q(&self.url()),
            q(&self.shared.opts.token),
            q(namespace)
        )
    }

    /// How many objects of `resource` ("jobs", "pods", "deployments", "services",
    /// "persistentvolumeclaims") were ever created through the API (POST that
    /// returned 201); objects the controllers make are not counted.
    pub fn created(&self, resource: &str) -> usize {
        self.shared
            .lock()
            .created
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// How many HTTP requests the server has received so far, of every kind (a
    /// watch counts once, when it starts). For tests that an answer came from a
    /// client's watch cache rather than from the API.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// The live objects of `resource`, all namespaces, as JSON.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        self.shared
            .lock()
            .list(resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Stops the server and kills every pod process (also done on Drop).
    pub fn shutdown(&self) {
        let mut st = self.shared.lock();
        if !st.stopped {
            st.close();
            kubelet::kill_all_now(&mut st);
        }
        drop(st);
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.shutdown();
    }
}
