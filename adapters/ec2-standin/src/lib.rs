//! For tests only: a stand-in for EC2's Query API, for what moto's server cannot do.
//! It speaks the documented request (form-encoded `Action=…&Version=2016-11-15`) and
//! response shapes (XML, and EC2's `<Response><Errors><Error><Code>` for errors) of
//! RunInstances, DescribeInstances, TerminateInstances and DescribeInstanceTypes, with
//! state: instances launched stay until terminated; a client token given again returns
//! its instance; a zone can be told to refuse with any of EC2's capacity or limit codes;
//! a spot instance can be reclaimed (`Server.SpotInstanceTermination`).
//!
//! The real `aws-sdk-ec2` client is what talks to it, so the adapter's error mapping is
//! tested against the codes and shapes EC2 documents, not against the adapter's own
//! idea of them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::{DateTime, Utc};

/// One instance the stand-in holds.
#[derive(Debug, Clone)]
pub struct StandInInstance {
    pub id: String,
    pub instance_type: String,
    pub image: String,
    pub zone: String,
    /// `pending`, `running`, `shutting-down`, `terminated`.
    pub state: String,
    pub launched_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub state_reason: Option<(String, String)>,
    pub spot: bool,
    pub user_data: String,
    pub shutdown_behavior: Option<String>,
    pub tags: BTreeMap<String, String>,
    client_token: Option<String>,
}

#[derive(Default)]
struct Inner {
    instances: Vec<StandInInstance>,
    /// Zone → the error code and message RunInstances answers there.
    refusals: HashMap<String, (String, String)>,
    /// Every action received, in order, with the zone a RunInstances asked for.
    requests: Vec<String>,
    next: u64,
}

/// The stand-in's state, shared with its server task.
#[derive(Clone, Default)]
pub struct Ec2StandIn {
    inner: Arc<Mutex<Inner>>,
    url: String,
}

const NS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";
/// The zone RunInstances uses when asked for none.
pub const DEFAULT_ZONE: &str = "us-east-1a";

impl Ec2StandIn {
    /// Starts it on a free port of 127.0.0.1, on the current Tokio runtime.
    pub async fn start() -> Ec2StandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let standin = Ec2StandIn {
            inner: Arc::default(),
            url,
        };
        let app = Router::new()
            .route("/", post(handle))
            .with_state(standin.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        standin
    }

    /// `http://127.0.0.1:PORT`: the `endpoint_url` of a site configuration.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on RunInstances in `zone` answers `code` (HTTP 400, or 500 for
    /// `InsufficientInstanceCapacity`, as EC2 does for some capacity errors).
    pub fn refuse(&self, zone: &str, code: &str, message: &str) {
        self.lock()
            .refusals
            .insert(zone.to_string(), (code.to_string(), message.to_string()));
    }

    /// Zone `zone` has capacity again.
    pub fn accept(&self, zone: &str) {
        self.lock().refusals.remove(zone);
    }

    /// Takes a spot instance back, as EC2 does with two minutes' notice.
    pub fn reclaim(&self, id: &str) {
        let mut inner = self.lock();
        if let Some(i) = inner.instances.iter_mut().find(|i| i.id == id) {
            i.state = "terminated".into();
            i.ended_at = Some(Utc::now());
            i.state_reason = Some((
                "Server.SpotInstanceTermination".into(),
                "Server.SpotInstanceTermination: Spot instance termination".into(),
            ));
        }
    }

    /// Every instance launched, terminated ones too.
    pub fn instances(&self) -> Vec<StandInInstance> {
        self.lock().instances.clone()
    }

    /// The actions received, in order: `RunInstances us-east-1a`, `DescribeInstances`…
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }
}

/// Decodes `application/x-www-form-urlencoded`.
fn form(body: &[u8]) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// The values of a list parameter: `Prefix.1`, `Prefix.2`…
fn list(params: &BTreeMap<String, String>, prefix: &str) -> Vec<String> {
    (1..)
        .map_while(|n| params.get(&format!("{prefix}.{n}")).cloned())
        .collect()
}

fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>standin-request</RequestID></Response>",
        xml(code),
        xml(message)
    );
    (status, [("content-type", "text/xml")], body).into_response()
}

fn ok(action: &str, inner: String) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{action}Response xmlns=\"{NS}\"><requestId>standin-request</requestId>{inner}</{action}Response>"
    );
    (StatusCode::OK, [("content-type", "text/xml")], body).into_response()
}

fn state_code(state: &str) -> u32 {
    match state {
        "pending" => 0,
        "running" => 16,
        "shutting-down" => 32,
        "terminated" => 48,
        "stopping" => 64,
        _ => 80,
    }
}

fn instance_xml(i: &StandInInstance) -> String {
    let time = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut out = format!(
        "<item><instanceId>{}</instanceId><imageId>{}</imageId><instanceState><code>{}</code><name>{}</name></instanceState><instanceType>{}</instanceType><launchTime>{}</launchTime><placement><availabilityZone>{}</availabilityZone></placement><privateIpAddress>10.0.0.{}</privateIpAddress>",
        xml(&i.id),
        xml(&i.image),
        state_code(&i.state),
        i.state,
        xml(&i.instance_type),
        time(i.launched_at),
        xml(&i.zone),
        i.id.len() % 250 + 2,
    );
    if let Some(ended) = i.ended_at {
        out.push_str(&format!(
            "<reason>User initiated ({} GMT)</reason>",
            ended.format("%Y-%m-%d %H:%M:%S")
        ));
    }
    if let Some((code, message)) = &i.state_reason {
        out.push_str(&format!(
            "<stateReason><code>{}</code><message>{}</message></stateReason>",
            xml(code),
            xml(message)
        ));
    }
    if i.spot {
        out.push_str("<instanceLifecycle>spot</instanceLifecycle>");
    }
    out.push_str("<tagSet>");
    for (k, v) in &i.tags {
        out.push_str(&format!(
            "<item><key>{}</key><value>{}</value></item>",
            xml(k),
            xml(v)
        ));
    }
    out.push_str("</tagSet></item>");
    out
}

/// Whether `i` passes DescribeInstances' `Filter.N.*` parameters (tags and state).
fn passes(i: &StandInInstance, params: &BTreeMap<String, String>) -> bool {
    (1..)
        .map_while(|n| {
            let name = params.get(&format!("Filter.{n}.Name"))?;
            Some((name.clone(), list(params, &format!("Filter.{n}.Value"))))
        })
        .all(|(name, values)| match name.strip_prefix("tag:") {
            Some(key) => i.tags.get(key).is_some_and(|v| values.contains(v)),
            None if name == "instance-state-name" => values.contains(&i.state),
            None if name == "instance-id" => values.contains(&i.id),
            None => true,
        })
}

async fn handle(State(standin): State<Ec2StandIn>, body: Bytes) -> Response {
    let params = form(&body);
    let action = params.get("Action").cloned().unwrap_or_default();
    match action.as_str() {
        "RunInstances" => run_instances(&standin, &params),
        "DescribeInstances" => {
            standin.lock().requests.push(action.clone());
            let ids = list(&params, "InstanceId");
            let mut inner = standin.lock();
            // A launched instance is running by the next look, as on EC2 within a minute.
            for i in inner.instances.iter_mut() {
                if i.state == "pending" {
                    i.state = "running".into();
                }
                if i.state == "shutting-down" {
                    i.state = "terminated".into();
                    i.ended_at.get_or_insert_with(Utc::now);
                }
            }
            if let Some(missing) = ids
                .iter()
                .find(|id| !inner.instances.iter().any(|i| &i.id == *id))
            {
                return error(
                    StatusCode::BAD_REQUEST,
                    "InvalidInstanceID.NotFound",
                    &format!("The instance ID '{missing}' does not exist"),
                );
            }
            let items: String = inner
                .instances
                .iter()
                .filter(|i| ids.is_empty() || ids.contains(&i.id))
                .filter(|i| passes(i, &params))
                .map(|i| {
                    format!(
                        "<item><reservationId>r-{}</reservationId><ownerId>000000000000</ownerId><groupSet/><instancesSet>{}</instancesSet></item>",
                        &i.id[2..],
                        instance_xml(i)
                    )
                })
                .collect();
            ok(&action, format!("<reservationSet>{items}</reservationSet>"))
        }
        "TerminateInstances" => {
            let ids = list(&params, "InstanceId");
            let mut inner = standin.lock();
            inner
                .requests
                .push(format!("TerminateInstances {}", ids.join(",")));
            if let Some(missing) = ids
                .iter()
                .find(|id| !inner.instances.iter().any(|i| &i.id == *id))
            {
                return error(
                    StatusCode::BAD_REQUEST,
                    "InvalidInstanceID.NotFound",
                    &format!("The instance ID '{missing}' does not exist"),
                );
            }
            let mut items = String::new();
            for i in inner.instances.iter_mut().filter(|i| ids.contains(&i.id)) {
                let previous = i.state.clone();
                if i.state != "terminated" {
                    i.state = "shutting-down".into();
                    i.ended_at = Some(Utc::now());
                    i.state_reason = Some((
                        "Client.UserInitiatedShutdown".into(),
                        "Client.UserInitiatedShutdown: User initiated shutdown".into(),
                    ));
                }
                items.push_str(&format!(
                    "<item><instanceId>{}</instanceId><currentState><code>{}</code><name>{}</name></currentState><previousState><code>{}</code><name>{}</name></previousState></item>",
                    i.id,
                    state_code(&i.state),
                    i.state,
                    state_code(&previous),
                    previous
                ));
            }
            ok(&action, format!("<instancesSet>{items}</instancesSet>"))
        }
        "DescribeInstanceTypes" => {
            standin.lock().requests.push(action.clone());
            let items: String = list(&params, "InstanceType")
                .iter()
                .map(|t| {
                    format!(
                        "<item><instanceType>{}</instanceType><processorInfo><supportedArchitectures><item>x86_64</item></supportedArchitectures></processorInfo><vCpuInfo><defaultVCpus>4</defaultVCpus></vCpuInfo><memoryInfo><sizeInMiB>16384</sizeInMiB></memoryInfo></item>",
                        xml(t)
                    )
                })
                .collect();
            ok(
                &action,
                format!("<instanceTypeSet>{items}</instanceTypeSet>"),
            )
        }
        other => error(
            StatusCode::BAD_REQUEST,
            "InvalidAction",
            &format!("The action {other} is not valid for this web service (the stand-in)."),
        ),
    }
}

fn run_instances(standin: &Ec2StandIn, params: &BTreeMap<String, String>) -> Response {
    let zone = params
        .get("Placement.AvailabilityZone")
        .cloned()
        .or_else(|| {
            // A subnet named `subnet-<zone>` is in that zone.
            params
                .get("SubnetId")
                .and_then(|s| s.strip_prefix("subnet-"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| DEFAULT_ZONE.to_string());
    let mut inner = standin.inner.lock().unwrap_or_else(|e| e.into_inner());
    inner.requests.push(format!("RunInstances {zone}"));
    let token = params.get("ClientToken").cloned();
    if let Some(existing) = token.as_ref().and_then(|t| {
        inner
            .instances
            .iter()
            .find(|i| i.client_token.as_ref() == Some(t))
    }) {
        let item = instance_xml(existing);
        return ok(
            "RunInstances",
            format!("<reservationId>r-1</reservationId><ownerId>000000000000</ownerId><groupSet/><instancesSet>{item}</instancesSet>"),
        );
    }
    if let Some((code, message)) = inner.refusals.get(&zone) {
        let status = if code == "InsufficientInstanceCapacity" {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::BAD_REQUEST
        };
        return error(status, code, message);
    }
    for required in ["ImageId", "InstanceType", "MinCount", "MaxCount"] {
        if !params.contains_key(required) {
            return error(
                StatusCode::BAD_REQUEST,
                "MissingParameter",
                &format!("The request must contain the parameter {required}"),
            );
        }
    }
    inner.next += 1;
    let n = inner.next;
    let mut tags = BTreeMap::new();
    for spec in 1.. {
        let Some(kind) = params.get(&format!("TagSpecification.{spec}.ResourceType")) else {
            break;
        };
        if kind != "instance" {
            continue;
        }
        for t in 1.. {
            let Some(key) = params.get(&format!("TagSpecification.{spec}.Tag.{t}.Key")) else {
                break;
            };
            let value = params
                .get(&format!("TagSpecification.{spec}.Tag.{t}.Value"))
                .cloned()
                .unwrap_or_default();
            tags.insert(key.clone(), value);
        }
    }
    let instance = StandInInstance {
        id: format!("i-{n:017x}"),
        instance_type: params["InstanceType"].clone(),
        image: params["ImageId"].clone(),
        zone,
        state: "pending".into(),
        launched_at: Utc::now(),
        ended_at: None,
        state_reason: None,
        spot: params
            .get("InstanceMarketOptions.MarketType")
            .map(String::as_str)
            == Some("spot"),
        user_data: params.get("UserData").cloned().unwrap_or_default(),
        shutdown_behavior: params.get("InstanceInitiatedShutdownBehavior").cloned(),
        tags,
        client_token: token,
    };
    let item = instance_xml(&instance);
    inner.instances.push(instance);
    ok(
        "RunInstances",
        format!("<reservationId>r-{n}</reservationId><ownerId>000000000000</ownerId><groupSet/><instancesSet>{item}</instancesSet>"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_and_lists_read_in_order() {
        let p =
            form(b"Action=RunInstances&InstanceId.1=i-1&InstanceId.2=i-2&UserData=YQ%3D%3D&X=a+b");
        assert_eq!(p["UserData"], "YQ==");
        assert_eq!(p["X"], "a b");
        assert_eq!(list(&p, "InstanceId"), vec!["i-1", "i-2"]);
    }
}
