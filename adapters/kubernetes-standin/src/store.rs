//! The one state behind the server: objects as JSON, the global resource-version
//! counter, a bounded history of changes for watches, and the pod processes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::broadcast;

/// How many changes are kept for watches that resume from a resource version.
/// Older versions answer 410 Expired, which kube-rs handles by listing again.
const HISTORY: usize = 16_384;

/// One kind of object the stand-in serves.
pub(crate) struct Kind {
    pub resource: &'static str,
    pub group: &'static str,
    pub api_version: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl Kind {
    /// `jobs.batch`, or `pods` for the core group, as Kubernetes names them in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
    /// `Job.batch`, or `Pod`, as in "is invalid" messages.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

pub(crate) const KINDS: [Kind; 7] = [
    Kind {
        resource: "pods",
        group: "",
        api_version: "v1",
        kind: "Pod",
        namespaced: true,
    },
    Kind {
        resource: "services",
        group: "",
        api_version: "v1",
        kind: "Service",
        namespaced: true,
    },
    Kind {
        resource: "persistentvolumeclaims",
        group: "",
        api_version: "v1",
        kind: "PersistentVolumeClaim",
        namespaced: true,
    },
    Kind {
        resource: "nodes",
        group: "",
        api_version: "v1",
        kind: "Node",
        namespaced: false,
    },
    Kind {
        resource: "namespaces",
        group: "",
        api_version: "v1",
        kind: "Namespace",
        namespaced: false,
    },
    Kind {
        resource: "jobs",
        group: "batch",
        api_version: "batch/v1",
        kind: "Job",
        namespaced: true,
    },
    Kind {
        resource: "deployments",
        group: "apps",
        api_version: "apps/v1",
        kind: "Deployment",
        namespaced: true,
    },
];

pub(crate) fn kind(resource: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.resource == resource)
}

/// resource, namespace ("" when cluster-scoped), name.
pub(crate) type Key = (&'static str, String, String);

pub(crate) fn key(resource: &'static str, ns: &str, name: &str) -> Key {
    (resource, ns.to_string(), name.to_string())
}

/// One change, as a watch sends it.
pub(crate) struct Event {
    pub rv: u64,
    pub resource: &'static str,
    pub namespace: String,
    pub name: String,
    pub kind: &'static str,
    pub object: Value,
}

/// A running pod process (its container), see `kubelet`.
pub(crate) struct Proc {
    pub pgid: i32,
    pub run: u64,
    pub key: Key,
}

pub(crate) struct State {
    objects: BTreeMap<&'static str, BTreeMap<(String, String), Value>>,
    pub rv: u64,
    history: VecDeque<Arc<Event>>,
    /// Watches from a version below this one cannot be served any more.
    pub compacted: u64,
    /// None once stopped, which ends every watch stream.
    tx: Option<broadcast::Sender<Arc<Event>>>,
    pub created: HashMap<String, usize>,
    pub procs: HashMap<String, Proc>,
    /// Pod uid -> when the kubelet may next (re)start it, or when an image pull began.
    pub waits: HashMap<String, Instant>,
    pub runs: u64,
    rng: u64,
    next_ip: u32,
    pub stopped: bool,
}

pub(crate) fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Seconds since an RFC 3339 time (0 if it does not parse).
pub(crate) fn seconds_since(s: Option<&str>) -> i64 {
    s.and_then(parse_time)
        .map(|t| (chrono::Utc::now() - t).num_seconds())
        .unwrap_or(0)
}

pub(crate) fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

pub(crate) fn int(v: &Value, pointer: &str) -> Option<i64> {
    v.pointer(pointer).and_then(Value::as_i64)
}

impl State {
    pub fn new() -> State {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ (u64::from(std::process::id()) << 32);
        State {
            objects: BTreeMap::new(),
            rv: 1000,
            history: VecDeque::new(),
            compacted: 0,
            tx: Some(broadcast::channel(HISTORY).0),
            created: HashMap::new(),
            procs: HashMap::new(),
            waits: HashMap::new(),
            runs: 0,
            rng: seed | 1,
            next_ip: 10,
            stopped: false,
        }
    }

    pub fn subscribe(&self) -> Option<broadcast::Receiver<Arc<Event>>> {
        self.tx.as_ref().map(broadcast::Sender::subscribe)
    }

    pub fn close(&mut self) {
        self.stopped = true;
        self.tx = None;
    }

    pub fn history_after(&self, rv: u64) -> impl Iterator<Item = &Arc<Event>> {
        self.history.iter().filter(move |e| e.rv > rv)
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects
            .get(key.0)?
            .get(&(key.1.clone(), key.2.clone()))
    }

    /// The objects of one resource, sorted by namespace and name.
    pub fn list(&self, resource: &str) -> impl Iterator<Item = (&(String, String), &Value)> {
        self.objects
            .get(resource)
            .into_iter()
            .flat_map(|m| m.iter())
    }

    pub fn keys(&self, resource: &'static str) -> Vec<Key> {
        self.list(resource)
            .map(|((ns, n), _)| (resource, ns.clone(), n.clone()))
            .collect()
    }

    fn emit(&mut self, kind: &'static str, key: &Key, object: Value) {
        let event = Arc::new(Event {
            rv: self.rv,
            resource: key.0,
            namespace: key.1.clone(),
            name: key.2.clone(),
            kind,
            object,
        });
        if self.history.len() >= HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        self.history.push_back(event.clone());
        if let Some(tx) = &self.tx {
            // No receivers is fine.
            let _ = tx.send(event);
        }
    }

    /// Stores a new object, filling in the metadata the server owns. The caller has
    /// checked that the name is free.
    pub fn insert(&mut self, kind: &'static Kind, ns: &str, mut obj: Value) -> Value {
        self.rv += 1;
        obj["apiVersion"] = json!(kind.api_version);
        obj["kind"] = json!(kind.kind);
        let meta = &mut obj["metadata"];
        if kind.namespaced {
            meta["namespace"] = json!(ns);
        }
        if text(meta, "/uid").is_none() {
            meta["uid"] = json!(uuid::Uuid::now_v7().to_string());
        }
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["creationTimestamp"] = json!(now());
        meta["generation"] = json!(1);
        let name = text(meta, "/name").unwrap_or_default().to_string();
        let key = (
            kind.resource,
            if kind.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name,
        );
        self.objects
            .entry(kind.resource)
            .or_default()
            .insert((key.1.clone(), key.2.clone()), obj.clone());
        self.emit("ADDED", &key, obj.clone());
        obj
    }

    /// Changes an object; only a real change bumps the resource version and is
    /// sent to watchers (so a controller may call this every tick). A spec change
    /// bumps metadata.generation. Returns the object as it now is.
    pub fn modify(&mut self, key: &Key, f: impl FnOnce(&mut Value)) -> Option<Value> {
        let old = self.get(key)?;
        let mut new = old.clone();
        f(&mut new);
        if new == *old {
            return Some(new);
        }
        if new.get("spec") != old.get("spec") {
            let generation = int(old, "/metadata/generation").unwrap_or(1);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        self.rv += 1;
        new["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects
            .get_mut(key.0)?
            .insert((key.1.clone(), key.2.clone()), new.clone());
        self.emit("MODIFIED", key, new.clone());
        Some(new)
    }

    /// Removes an object (no cascade; see `controllers::delete`).
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut obj = self
            .objects
            .get_mut(key.0)?
            .remove(&(key.1.clone(), key.2.clone()))?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit("DELETED", key, obj.clone());
        Some(obj)
    }

    /// Lowercase letters and digits, as Kubernetes uses for generated names (no vowels,
    /// so no words).
    pub fn random_suffix(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..n)
            .map(|_| {
                // xorshift64: random enough for names, and no dependency.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                ALPHABET[(self.rng % ALPHABET.len() as u64) as usize] as char
            })
            .collect()
    }

    pub fn cluster_ip(&mut self) -> String {
        self.next_ip += 1;
        format!("10.96.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1)
    }
}
