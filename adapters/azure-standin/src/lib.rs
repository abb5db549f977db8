//! For tests only: a stand-in for Azure Resource Manager (the VM, NIC, operation and
//! resource SKU calls a cloud site makes) and for Microsoft Entra ID's token endpoint.
//! It speaks their documented shapes: JSON resources with `provisioningState`, instance
//! views with `PowerState/…` codes, `{"error": {"code", "message"}}` errors, creates and
//! deletes answered 201/202 with an `Azure-AsyncOperation` URL to follow, and OAuth2's
//! client-credentials grant. With state: a VM is Creating until its operation is looked
//! at, then Succeeded and running (or Failed with an allocation error); a deleted VM takes
//! its OS disk and NIC with it when their `deleteOption` is `Delete`, and vanishes; a
//! Spot VM can be evicted; a guest shutdown stops a VM without deallocating it.
//!
//! Every ARM call must carry a bearer token this stand-in issued.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// One VM the stand-in holds.
#[derive(Debug, Clone)]
pub struct StandInVm {
    pub name: String,
    pub body: Value,
    pub zone: Option<String>,
    /// `Creating`, `Succeeded`, `Failed`, `Deleting`.
    pub provisioning: String,
    /// `starting`, `running`, `stopped`, `deallocated`.
    pub power: String,
    pub created_at: DateTime<Utc>,
}

/// A long-running operation on a VM.
struct Operation {
    /// Looks left before it ends.
    looks: u32,
    /// Its end: done, or the error code and message.
    end: Result<(), (String, String)>,
    vm: String,
    delete: bool,
}

#[derive(Default)]
struct Inner {
    vms: Vec<StandInVm>,
    /// NIC name → its body.
    nics: BTreeMap<String, Value>,
    /// OS disks that exist, by VM name.
    disks: Vec<String>,
    /// Zone ("" for none) → (answered at once?, status, code, message).
    refusals: HashMap<String, (bool, u16, String, String)>,
    operations: HashMap<String, Operation>,
    tokens: Vec<String>,
    requests: Vec<String>,
    next: u64,
}

/// The stand-in's state, shared with its server task.
#[derive(Clone)]
pub struct AzureStandIn {
    inner: Arc<Mutex<Inner>>,
    url: String,
    client: String,
    secret: String,
}

const SKUS: &str = r#"{"value": [
  {"resourceType": "virtualMachines", "name": "Standard_D4s_v5", "locations": ["eastus"], "capabilities": [{"name": "vCPUs", "value": "4"}, {"name": "MemoryGB", "value": "16"}]},
  {"resourceType": "virtualMachines", "name": "Standard_ND96isr_H100_v5", "locations": ["eastus"], "capabilities": [{"name": "vCPUs", "value": "96"}, {"name": "MemoryGB", "value": "1900"}, {"name": "GPUs", "value": "8"}]},
  {"resourceType": "virtualMachines", "name": "Standard_ND96isr_MI300X_v5", "locations": ["eastus"], "capabilities": [{"name": "vCPUs", "value": "96"}, {"name": "MemoryGB", "value": "1850"}, {"name": "GPUs", "value": "8"}]},
  {"resourceType": "disks", "name": "Premium_LRS", "locations": ["eastus"]}
]}"#;

impl AzureStandIn {
    /// Starts it on a free port of 127.0.0.1; tokens go to `client` with `secret`.
    pub async fn start(client: &str, secret: &str) -> AzureStandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let standin = AzureStandIn {
            inner: Arc::default(),
            url,
            client: client.into(),
            secret: secret.into(),
        };
        let compute =
            "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines";
        let app = Router::new()
            .route("/{tenant}/oauth2/v2.0/token", post(token))
            .route(
                "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}",
                put(put_nic).delete(delete_nic),
            )
            .route(compute, get(list_vms))
            .route(&format!("{compute}/{{name}}"), put(put_vm).get(get_vm).delete(delete_vm))
            .route(&format!("{compute}/{{name}}/instanceView"), get(instance_view))
            .route("/operations/{id}", get(operation))
            .route("/subscriptions/{sub}/providers/Microsoft.Compute/skus", get(skus))
            // Not Azure's API: what a VM's own `shutdown -h now` does to it (Azure stops
            // it), for tests that play the VM with a shell script.
            .route("/standin/vms/{name}/shutdown", post(shutdown))
            .with_state(standin.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        standin
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// From now on creating a VM in `zone` ("" for none) fails with `code`: at once
    /// (`now`, with `status`), or through its operation (an allocation failure).
    pub fn refuse(&self, zone: &str, now: bool, status: u16, code: &str, message: &str) {
        self.lock()
            .refusals
            .insert(zone.into(), (now, status, code.into(), message.into()));
    }

    /// The VM's operating system shut down: stopped, not deallocated (it still bills).
    pub fn stop(&self, name: &str) {
        if let Some(vm) = self.lock().vms.iter_mut().find(|v| v.name == name) {
            vm.power = "stopped".into();
        }
    }

    /// Azure evicts a Spot VM whose eviction policy is Delete: gone, with its disk and NIC.
    pub fn evict(&self, name: &str) {
        let mut inner = self.lock();
        let vm = inner
            .vms
            .iter()
            .find(|v| v.name == name)
            .expect("a known VM")
            .clone();
        assert_eq!(vm.body["properties"]["priority"], "Spot", "not a Spot VM");
        remove(&mut inner, &vm);
    }

    pub fn vms(&self) -> Vec<StandInVm> {
        self.lock().vms.clone()
    }

    pub fn nics(&self) -> Vec<String> {
        self.lock().nics.keys().cloned().collect()
    }

    pub fn disks(&self) -> Vec<String> {
        self.lock().disks.clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `None` when the request carries a token this stand-in issued.
    fn unauthorized(&self, headers: &HeaderMap) -> Option<Response> {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match token {
            Some(t) if self.lock().tokens.iter().any(|k| k == t) => None,
            _ => Some(arm_error(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing or invalid.",
            )),
        }
    }

    fn operation(
        &self,
        inner: &mut Inner,
        end: Result<(), (String, String)>,
        vm: &str,
        delete: bool,
    ) -> String {
        inner.next += 1;
        let id = format!("op{}", inner.next);
        inner.operations.insert(
            id.clone(),
            Operation {
                looks: 1,
                end,
                vm: vm.to_string(),
                delete,
            },
        );
        format!("{}/operations/{id}?api-version=2024-07-01", self.url)
    }
}

/// A VM deleted: gone, with its OS disk and NIC where their deleteOption says Delete.
fn remove(inner: &mut Inner, vm: &StandInVm) {
    inner.vms.retain(|v| v.name != vm.name);
    let p = &vm.body["properties"];
    if p["storageProfile"]["osDisk"]["deleteOption"] == "Delete" {
        inner.disks.retain(|d| *d != vm.name);
    }
    for nic in p["networkProfile"]["networkInterfaces"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if nic["properties"]["deleteOption"] == "Delete" {
            let name = nic["id"]
                .as_str()
                .unwrap_or("")
                .rsplit('/')
                .next()
                .unwrap_or("");
            inner.nics.remove(name);
        }
    }
}

fn arm_error(status: u16, code: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        [("content-type", "application/json")],
        json!({"error": {"code": code, "message": message}}).to_string(),
    )
        .into_response()
}

fn ok(status: StatusCode, value: Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn vm_json(vm: &StandInVm, view: bool) -> Value {
    let mut v = vm.body.clone();
    v["name"] = json!(vm.name);
    v["properties"]["provisioningState"] = json!(vm.provisioning);
    v["properties"]["timeCreated"] = json!(vm
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    if let Some(z) = &vm.zone {
        v["zones"] = json!([z]);
    }
    if view {
        v["properties"]["instanceView"] = view_json(vm);
    }
    v
}

fn view_json(vm: &StandInVm) -> Value {
    json!({"statuses": [
        {"code": format!("ProvisioningState/{}", vm.provisioning.to_ascii_lowercase())},
        {"code": format!("PowerState/{}", vm.power)},
    ]})
}

async fn token(
    State(s): State<AzureStandIn>,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> Response {
    s.lock().requests.push("token".into());
    if form.get("grant_type").map(String::as_str) != Some("client_credentials")
        || form.get("scope").map(String::as_str) != Some("https://management.azure.com/.default")
        || form.get("client_id") != Some(&s.client)
        || form.get("client_secret") != Some(&s.secret)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}).to_string(),
        )
            .into_response();
    }
    let mut inner = s.lock();
    inner.next += 1;
    let token = format!("standin-token-{}", inner.next);
    inner.tokens.push(token.clone());
    ok(
        StatusCode::OK,
        json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}),
    )
}

async fn put_nic(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let Ok(nic) = serde_json::from_slice::<Value>(&body) else {
        return arm_error(400, "InvalidRequestFormat", "Cannot parse the request.");
    };
    if nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
        .as_str()
        .is_none()
    {
        return arm_error(400, "InvalidRequestFormat", "A NIC needs a subnet.");
    }
    let mut inner = s.lock();
    inner.requests.push(format!("PUT nic {name}"));
    let existed = inner.nics.insert(name, nic.clone()).is_some();
    ok(
        if existed {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        },
        nic,
    )
}

async fn delete_nic(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("DELETE nic {name}"));
    let attached = inner.vms.iter().any(|v| {
        v.body
            .to_string()
            .contains(&format!("/networkInterfaces/{name}\""))
    });
    if attached {
        return arm_error(
            400,
            "NicInUse",
            "Network Interface is used by existing resource.",
        );
    }
    match inner.nics.remove(&name) {
        Some(_) => StatusCode::OK.into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn put_vm(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let Ok(vm) = serde_json::from_slice::<Value>(&body) else {
        return arm_error(400, "InvalidRequestFormat", "Cannot parse the request.");
    };
    let zone = vm["zones"][0].as_str().map(str::to_string);
    let mut inner = s.lock();
    inner.requests.push(format!(
        "PUT vm {name} zone={}",
        zone.as_deref().unwrap_or("none")
    ));
    if let Some(existing) = inner.vms.iter().find(|v| v.name == name) {
        return ok(StatusCode::OK, vm_json(existing, false));
    }
    let nic = vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"]
        .as_str()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    if !inner.nics.contains_key(&nic) {
        return arm_error(
            400,
            "InvalidResourceReference",
            &format!("Resource {nic} referenced by resource {name} was not found."),
        );
    }
    let refusal = inner.refusals.get(zone.as_deref().unwrap_or("")).cloned();
    if let Some((true, status, code, message)) = &refusal {
        return arm_error(*status, code, message);
    }
    let end = match refusal {
        Some((false, _, code, message)) => Err((code, message)),
        _ => Ok(()),
    };
    let new = StandInVm {
        name: name.clone(),
        body: vm,
        zone,
        provisioning: "Creating".into(),
        power: "starting".into(),
        created_at: Utc::now(),
    };
    inner.disks.push(name.clone());
    inner.vms.push(new.clone());
    let operation = s.operation(&mut inner, end, &name, false);
    let mut response = ok(StatusCode::CREATED, vm_json(&new, false));
    let headers = response.headers_mut();
    headers.insert("azure-asyncoperation", operation.parse().expect("a header"));
    headers.insert("retry-after", "0".parse().expect("a header"));
    response
}

async fn operation(
    State(s): State<AzureStandIn>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push("GET operation".into());
    let Some(op) = inner.operations.get_mut(&id) else {
        return arm_error(404, "NotFound", "No such operation.");
    };
    if op.looks > 0 {
        op.looks -= 1;
        let mut response = ok(StatusCode::OK, json!({"status": "InProgress"}));
        response
            .headers_mut()
            .insert("retry-after", "0".parse().expect("a header"));
        return response;
    }
    let (end, vm, delete) = (op.end.clone(), op.vm.clone(), op.delete);
    if delete {
        if let Some(gone) = inner.vms.iter().find(|v| v.name == vm).cloned() {
            remove(&mut inner, &gone);
        }
        return ok(StatusCode::OK, json!({"status": "Succeeded"}));
    }
    let state = match &end {
        Ok(()) => ("Succeeded", "running"),
        Err(_) => ("Failed", "deallocated"),
    };
    if let Some(v) = inner
        .vms
        .iter_mut()
        .find(|v| v.name == vm && v.provisioning == "Creating")
    {
        v.provisioning = state.0.into();
        v.power = state.1.into();
    }
    ok(
        StatusCode::OK,
        match end {
            Ok(()) => json!({"status": "Succeeded"}),
            Err((code, message)) => {
                json!({"status": "Failed", "error": {"code": code, "message": message}})
            }
        },
    )
}

/// Looking moves deleting VMs on: they are gone.
fn settle(inner: &mut Inner) {
    let deleting: Vec<StandInVm> = inner
        .vms
        .iter()
        .filter(|v| v.provisioning == "Deleting")
        .cloned()
        .collect();
    for vm in deleting {
        remove(inner, &vm);
    }
}

async fn list_vms(State(s): State<AzureStandIn>, headers: HeaderMap) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push("LIST vms".into());
    settle(&mut inner);
    let all: Vec<Value> = inner.vms.iter().map(|v| vm_json(v, false)).collect();
    ok(StatusCode::OK, json!({"value": all}))
}

async fn get_vm(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let inner = s.lock();
    match inner.vms.iter().find(|v| v.name == name) {
        Some(vm) => ok(
            StatusCode::OK,
            vm_json(
                vm,
                q.get("$expand").map(String::as_str) == Some("instanceView"),
            ),
        ),
        None => arm_error(
            404,
            "ResourceNotFound",
            &format!("The Resource 'Microsoft.Compute/virtualMachines/{name}' was not found."),
        ),
    }
}

async fn instance_view(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("GET instanceView {name}"));
    match inner.vms.iter().find(|v| v.name == name) {
        Some(vm) => ok(StatusCode::OK, view_json(vm)),
        None => arm_error(404, "ResourceNotFound", "Not found."),
    }
}

async fn delete_vm(
    State(s): State<AzureStandIn>,
    Path((_, _, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("DELETE vm {name}"));
    let Some(vm) = inner.vms.iter_mut().find(|v| v.name == name) else {
        return StatusCode::NO_CONTENT.into_response();
    };
    vm.provisioning = "Deleting".into();
    let operation = s.operation(&mut inner, Ok(()), &name, true);
    let mut response = StatusCode::ACCEPTED.into_response();
    response
        .headers_mut()
        .insert("azure-asyncoperation", operation.parse().expect("a header"));
    response
}

async fn skus(State(s): State<AzureStandIn>, headers: HeaderMap) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    s.lock().requests.push("LIST skus".into());
    ok(
        StatusCode::OK,
        serde_json::from_str(SKUS).expect("the SKUs parse"),
    )
}

async fn shutdown(State(s): State<AzureStandIn>, Path(name): Path<String>) -> StatusCode {
    s.stop(&name);
    StatusCode::NO_CONTENT
}
