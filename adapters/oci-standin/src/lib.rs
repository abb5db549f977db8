//! For tests only: a stand-in for OCI's Core Services API, for what no local server
//! offers. It speaks the documented request and response shapes (JSON bodies, `{"code",
//! "message"}` errors, `opc-next-page` paging, `opc-retry-token`) of LaunchInstance,
//! ListInstances, GetInstance, TerminateInstance and ListShapes, with state: instances go
//! PROVISIONING → RUNNING → TERMINATING → TERMINATED as they are looked at; a retry token
//! given again returns its instance; an availability domain can be told to answer "Out
//! of host capacity" or a limit; a preemptible instance can be taken back.
//!
//! Every request must carry a valid `rsa-sha256` signature of the headers OCI's signing
//! documentation names (checked against the public half of the key it is given), and a
//! body's `x-content-sha256` must be its SHA-256: a request the real API would refuse
//! with 401 gets 401 here too.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use chrono::{DateTime, Utc};
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::sha2::{Digest, Sha256};
use rsa::signature::Verifier;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{json, Value};

/// One instance the stand-in holds.
#[derive(Debug, Clone)]
pub struct StandInInstance {
    pub id: String,
    pub shape: String,
    pub availability_domain: String,
    /// `PROVISIONING`, `RUNNING`, `TERMINATING`, `TERMINATED`.
    pub state: String,
    pub launch: Value,
    pub created_at: DateTime<Utc>,
    /// Whether a TerminateInstance asked to keep its boot volume.
    pub preserve_boot_volume: Option<bool>,
    retry_token: Option<String>,
}

impl StandInInstance {
    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "compartmentId": self.launch["compartmentId"],
            "availabilityDomain": self.availability_domain,
            "displayName": self.launch["displayName"],
            "shape": self.shape,
            "lifecycleState": self.state,
            "timeCreated": self.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "freeformTags": self.launch["freeformTags"],
            "metadata": self.launch["metadata"],
            "preemptibleInstanceConfig": self.launch.get("preemptibleInstanceConfig").cloned().unwrap_or(Value::Null),
        })
    }
}

#[derive(Default)]
struct Inner {
    instances: Vec<StandInInstance>,
    /// Availability domain → the status, code and message LaunchInstance answers there.
    refusals: HashMap<String, (u16, String, String)>,
    /// Every call received, in order (`LaunchInstance <ad>`, `ListInstances`, …).
    requests: Vec<String>,
    /// Requests refused for their signature.
    unsigned: usize,
    next: u64,
}

/// The stand-in's state, shared with its server task.
#[derive(Clone)]
pub struct OciStandIn {
    inner: Arc<Mutex<Inner>>,
    key: VerifyingKey<Sha256>,
    key_id: String,
    url: String,
}

/// The shapes ListShapes answers, as OCI lists them.
const SHAPES: &str = r#"[
  {"shape": "VM.Standard.E5.Flex", "ocpus": 1.0, "memoryInGBs": 12.0, "gpus": 0, "isFlexible": true, "processorDescription": "4th Generation AMD EPYC"},
  {"shape": "BM.GPU.H100.8", "ocpus": 112.0, "memoryInGBs": 2048.0, "gpus": 8, "gpuDescription": "NVIDIA® H100", "processorDescription": "Intel Xeon Platinum 8480+"},
  {"shape": "BM.GPU.MI300X.8", "ocpus": 112.0, "memoryInGBs": 2048.0, "gpus": 8, "gpuDescription": "AMD Instinct MI300X", "processorDescription": "Intel Xeon Platinum 8480+"},
  {"shape": "VM.GPU.A10.1", "ocpus": 15.0, "memoryInGBs": 240.0, "gpus": 1, "gpuDescription": "NVIDIA® A10", "processorDescription": "Intel Xeon Platinum 8358"}
]"#;

impl OciStandIn {
    /// Starts it on a free port of 127.0.0.1, on the current Tokio runtime; requests
    /// must be signed by `key_id` with the private key `pem` (PKCS#1) stands for.
    pub async fn start(key_id: &str, pem: &str) -> OciStandIn {
        let private = RsaPrivateKey::from_pkcs1_pem(pem).expect("a PKCS#1 RSA key");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let standin = OciStandIn {
            inner: Arc::default(),
            key: VerifyingKey::new(RsaPublicKey::from(&private)),
            key_id: key_id.to_string(),
            url,
        };
        let app = Router::new()
            .route("/20160918/instances", get(list).post(launch))
            .route("/20160918/instances/{id}", get(one).delete(terminate))
            .route("/20160918/shapes", get(shapes))
            // Not OCI's API: what an instance's own `shutdown -h now` does to it (OCI
            // stops it), for tests that play the instance with a shell script.
            .route(
                "/standin/instances/{id}/shutdown",
                axum::routing::post(shutdown),
            )
            .with_state(standin.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        standin
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// From now on LaunchInstance in `ad` answers `status`, `code` and `message`.
    pub fn refuse(&self, ad: &str, status: u16, code: &str, message: &str) {
        self.lock()
            .refusals
            .insert(ad.into(), (status, code.into(), message.into()));
    }

    /// OCI takes a preemptible instance back: it is terminated.
    pub fn reclaim(&self, id: &str) {
        let mut inner = self.lock();
        let i = inner
            .instances
            .iter_mut()
            .find(|i| i.id == id)
            .expect("a known instance");
        assert!(
            i.launch["preemptibleInstanceConfig"].is_object(),
            "not preemptible"
        );
        i.state = "TERMINATED".into();
    }

    /// The instance's operating system shut down: OCI stops it (it is not terminated).
    pub fn stop(&self, id: &str) {
        if let Some(i) = self.lock().instances.iter_mut().find(|i| i.id == id) {
            if i.state == "RUNNING" || i.state == "PROVISIONING" {
                i.state = "STOPPED".into();
            }
        }
    }

    pub fn instances(&self) -> Vec<StandInInstance> {
        self.lock().instances.clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// How many requests were refused for a missing or wrong signature.
    pub fn unsigned(&self) -> usize {
        self.lock().unsigned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the request is signed as OCI requires; why not, when it is not.
    fn verify(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(), String> {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or("no Authorization header")?;
        let params: BTreeMap<&str, &str> = auth
            .strip_prefix("Signature ")
            .ok_or("not a Signature")?
            .split(',')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim_matches('"')))
            .collect();
        if params.get("keyId") != Some(&self.key_id.as_str()) {
            return Err(format!("unknown keyId {:?}", params.get("keyId")));
        }
        if params.get("algorithm") != Some(&"rsa-sha256") || params.get("version") != Some(&"1") {
            return Err("expected version 1 and rsa-sha256".into());
        }
        let signed: Vec<&str> = params
            .get("headers")
            .ok_or("no headers")?
            .split(' ')
            .collect();
        let mut required = vec!["date", "(request-target)", "host"];
        if matches!(*method, Method::POST | Method::PUT) {
            required.extend(["content-length", "content-type", "x-content-sha256"]);
            let sha = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(body));
            if headers
                .get("x-content-sha256")
                .and_then(|v| v.to_str().ok())
                != Some(sha.as_str())
            {
                return Err("x-content-sha256 is not the body's".into());
            }
        }
        if required.iter().any(|h| !signed.contains(h)) {
            return Err(format!("headers {signed:?} leave out some of {required:?}"));
        }
        let date = headers
            .get("date")
            .and_then(|v| v.to_str().ok())
            .and_then(|d| DateTime::parse_from_rfc2822(d).ok())
            .ok_or("no date")?;
        if (Utc::now() - date.with_timezone(&Utc)).num_seconds().abs() > 300 {
            return Err("date more than 5 minutes off".into());
        }
        let target = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut lines = Vec::new();
        for h in &signed {
            let value = if *h == "(request-target)" {
                format!("{} {target}", method.as_str().to_ascii_lowercase())
            } else if *h == "content-length" {
                body.len().to_string()
            } else {
                headers
                    .get(*h)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| format!("signed header {h} is missing"))?
                    .to_string()
            };
            lines.push(format!("{h}: {value}"));
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(params.get("signature").ok_or("no signature")?)
            .map_err(|e| e.to_string())?;
        let signature = Signature::try_from(signature.as_slice()).map_err(|e| e.to_string())?;
        self.key
            .verify(lines.join("\n").as_bytes(), &signature)
            .map_err(|_| "the signature does not verify".to_string())
    }

    /// The 401 the request gets when its signature does not hold; `None` when it does.
    fn refused(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Response> {
        let why = self.verify(method, uri, headers, body).err()?;
        self.lock().unsigned += 1;
        Some(error(
            401,
            "NotAuthenticated",
            &format!("The required information to complete authentication was not provided or was incorrect: {why}"),
        ))
    }
}

fn error(status: u16, code: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        [("content-type", "application/json")],
        json!({"code": code, "message": message}).to_string(),
    )
        .into_response()
}

fn ok(value: Value) -> Response {
    ([("content-type", "application/json")], value.to_string()).into_response()
}

/// Looking moves an instance one step on, as time would.
fn advance(i: &mut StandInInstance) {
    i.state = match i.state.as_str() {
        "PROVISIONING" => "RUNNING",
        "TERMINATING" => "TERMINATED",
        s => s,
    }
    .into();
}

async fn launch(
    State(s): State<OciStandIn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = s.refused(&method, &uri, &headers, &body) {
        return r;
    }
    let Ok(launch) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "CannotParseRequest", "Incorrectly formatted request.");
    };
    for field in [
        "availabilityDomain",
        "compartmentId",
        "shape",
        "sourceDetails",
    ] {
        if launch.get(field).is_none() {
            return error(400, "MissingParameter", &format!("Missing {field}."));
        }
    }
    let ad = launch["availabilityDomain"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let token = headers
        .get("opc-retry-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut inner = s.lock();
    inner.requests.push(format!("LaunchInstance {ad}"));
    if let Some(i) = inner
        .instances
        .iter()
        .find(|i| token.is_some() && i.retry_token == token)
    {
        return ok(i.json());
    }
    if let Some((status, code, message)) = inner.refusals.get(&ad).cloned() {
        return error(status, &code, &message);
    }
    if !launch["sourceDetails"]["imageId"]
        .as_str()
        .is_some_and(|i| i.starts_with("ocid1.image."))
    {
        return error(
            404,
            "NotAuthorizedOrNotFound",
            "Authorization failed or requested resource not found.",
        );
    }
    inner.next += 1;
    let instance = StandInInstance {
        id: format!("ocid1.instance.oc1.iad.standin{:06}", inner.next),
        shape: launch["shape"].as_str().unwrap_or("").to_string(),
        availability_domain: ad,
        state: "PROVISIONING".into(),
        launch,
        created_at: Utc::now(),
        preserve_boot_volume: None,
        retry_token: token,
    };
    let answer = instance.json();
    inner.instances.push(instance);
    ok(answer)
}

#[derive(serde::Deserialize)]
struct ListQuery {
    #[serde(rename = "compartmentId")]
    compartment_id: Option<String>,
    limit: Option<usize>,
    page: Option<usize>,
}

async fn list(
    State(s): State<OciStandIn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Some(r) = s.refused(&method, &uri, &headers, &[]) {
        return r;
    }
    let Some(compartment) = q.compartment_id else {
        return error(400, "MissingParameter", "Missing compartmentId.");
    };
    let mut inner = s.lock();
    inner.requests.push("ListInstances".into());
    for i in inner.instances.iter_mut() {
        advance(i);
    }
    let all: Vec<Value> = inner
        .instances
        .iter()
        .filter(|i| i.launch["compartmentId"] == compartment.as_str())
        .map(StandInInstance::json)
        .collect();
    let limit = q.limit.unwrap_or(100).max(1);
    let from = q.page.unwrap_or(0);
    let page: Vec<Value> = all.iter().skip(from).take(limit).cloned().collect();
    let mut response = ok(Value::Array(page));
    if from + limit < all.len() {
        response.headers_mut().insert(
            "opc-next-page",
            (from + limit).to_string().parse().expect("a header value"),
        );
    }
    response
}

async fn one(
    State(s): State<OciStandIn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = s.refused(&method, &uri, &headers, &[]) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("GetInstance {id}"));
    match inner.instances.iter_mut().find(|i| i.id == id) {
        Some(i) => {
            advance(i);
            ok(i.json())
        }
        None => error(
            404,
            "NotAuthorizedOrNotFound",
            "Authorization failed or requested resource not found.",
        ),
    }
}

async fn terminate(
    State(s): State<OciStandIn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = s.refused(&method, &uri, &headers, &[]) {
        return r;
    }
    let preserve = q.get("preserveBootVolume").map(|v| v == "true");
    let mut inner = s.lock();
    inner.requests.push(format!(
        "TerminateInstance {id} preserveBootVolume={}",
        preserve.map_or("unset".to_string(), |p| p.to_string())
    ));
    match inner.instances.iter_mut().find(|i| i.id == id) {
        Some(i) => {
            if i.state != "TERMINATED" {
                i.state = "TERMINATING".into();
            }
            i.preserve_boot_volume = preserve;
            StatusCode::NO_CONTENT.into_response()
        }
        None => error(
            404,
            "NotAuthorizedOrNotFound",
            "Authorization failed or requested resource not found.",
        ),
    }
}

async fn shapes(
    State(s): State<OciStandIn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.refused(&method, &uri, &headers, &[]) {
        return r;
    }
    s.lock().requests.push("ListShapes".into());
    ok(serde_json::from_str(SHAPES).expect("the shapes parse"))
}

async fn shutdown(State(s): State<OciStandIn>, Path(id): Path<String>) -> StatusCode {
    s.stop(&id);
    StatusCode::NO_CONTENT
}
