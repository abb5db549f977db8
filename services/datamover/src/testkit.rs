//! For tests (here and in other crates): real object-store servers on free ports, each
//! stopped when dropped. No test skips when one is missing: it fails saying how to
//! install it (`scripts/test` installs all three).
//!
//! - S3: moto's server, `MERIDIAN_MOTO_SERVER` or `moto_server` on `PATH`
//!   (`pip install 'moto[server]'`).
//! - Google Cloud Storage: `gcp-storage-emulator`, `MERIDIAN_GCS_EMULATOR` or on `PATH`
//!   (`pip install gcp-storage-emulator`).
//! - Azure Blob: Azurite, `MERIDIAN_AZURITE_BLOB` or `azurite-blob` on `PATH`
//!   (`npm install azurite`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::Sha256;

/// A server process on a free port, stopped when dropped.
pub struct Peer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The program `variable` names, else `name` on `PATH`; panics with `install` otherwise.
fn program(variable: &str, name: &str, install: &str) -> String {
    if let Ok(path) = std::env::var(variable) {
        return path;
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| {
            panic!(
                "this test needs {name}: install it with `{install}` (scripts/test does), or set {variable}"
            )
        })
}

impl Peer {
    /// Starts `program` with the arguments `args` gives for a free port, and waits until
    /// the port answers.
    fn start(program: String, args: impl FnOnce(u16) -> Vec<String>) -> Peer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&program)
            .args(args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        let peer = Peer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{program} did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        peer
    }

    /// One plain HTTP/1.1 request: the status and the body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        use std::io::{Read, Write};
        let host = self.url.trim_start_matches("http://");
        // A server may take a moment past opening its port to take requests.
        let mut tries = 0;
        let mut stream = loop {
            match std::net::TcpStream::connect(host) {
                Ok(stream) => break stream,
                Err(e) if tries < 30 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("reach {host}: {e}"),
            }
        };
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).expect("send");
        stream.write_all(body).expect("send the body");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("read");
        let split = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP answer");
        let head = String::from_utf8_lossy(&answer[..split]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        let mut rest = answer[split + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            rest = unchunk(&rest);
        }
        (status, rest)
    }
}

/// moto's S3 server.
pub struct Moto(pub Peer);

impl Moto {
    pub fn start() -> Moto {
        let bin = program(
            "MERIDIAN_MOTO_SERVER",
            "moto_server",
            "python3 -m pip install 'moto[server]'",
        );
        Moto(Peer::start(bin, |port| {
            vec![
                "-H".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ]
        }))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.0.url
    }

    /// The `AWS_*` variables a process needs to reach it (test credentials).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.0.url.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Makes bucket `name` (an unsigned request, which moto takes).
    pub fn bucket(&self, name: &str) {
        let (status, body) = self.0.call("PUT", &format!("/{name}"), &[], b"");
        assert_eq!(
            status,
            200,
            "moto refused bucket {name}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores `body` at `bucket/key`.
    pub fn put(&self, bucket: &str, key: &str, body: &[u8]) {
        let (status, answer) = self.0.call("PUT", &format!("/{bucket}/{key}"), &[], body);
        assert_eq!(
            status,
            200,
            "moto refused {bucket}/{key}: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// What `bucket/key` holds, if anything.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let (status, body) = self.0.call("GET", &format!("/{bucket}/{key}"), &[], b"");
        (status == 200).then_some(body)
    }
}

/// `gcp-storage-emulator`, in memory.
pub struct GcsEmulator(pub Peer);

impl GcsEmulator {
    pub fn start() -> GcsEmulator {
        let bin = program(
            "MERIDIAN_GCS_EMULATOR",
            "gcp-storage-emulator",
            "python3 -m pip install gcp-storage-emulator",
        );
        GcsEmulator(Peer::start(bin, |port| {
            [
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--in-memory",
                "-q",
            ]
            .map(String::from)
            .to_vec()
        }))
    }

    /// The variable that points Google's libraries, and the data mover, at it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("STORAGE_EMULATOR_HOST", self.0.url.clone())]
    }

    /// Makes bucket `name` through the JSON API.
    pub fn bucket(&self, name: &str) {
        let (status, body) = self.0.call(
            "POST",
            "/storage/v1/b?project=test",
            &[("Content-Type", "application/json".into())],
            format!(r#"{{"name":"{name}"}}"#).as_bytes(),
        );
        assert_eq!(
            status,
            200,
            "the GCS emulator refused bucket {name}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores `body` at `bucket/name` (a simple upload through the JSON API).
    pub fn put(&self, bucket: &str, name: &str, body: &[u8]) {
        let (status, answer) = self.0.call(
            "POST",
            &format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"),
            &[("Content-Type", "application/octet-stream".into())],
            body,
        );
        assert_eq!(
            status,
            200,
            "the GCS emulator refused {bucket}/{name}: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// What `bucket/name` holds, if anything.
    pub fn get(&self, bucket: &str, name: &str) -> Option<Vec<u8>> {
        let name = name.replace('/', "%2F");
        let (status, body) = self.0.call(
            "GET",
            &format!("/storage/v1/b/{bucket}/o/{name}?alt=media"),
            &[],
            b"",
        );
        (status == 200).then_some(body)
    }
}

/// Azurite's Blob service, in memory, with its well-known development account.
pub struct Azurite(pub Peer);

/// Azurite's development account and its published key.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

impl Azurite {
    pub fn start() -> Azurite {
        let bin = program(
            "MERIDIAN_AZURITE_BLOB",
            "azurite-blob",
            "npm install azurite",
        );
        Azurite(Peer::start(bin, |port| {
            [
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--inMemoryPersistence",
                "--loose",
                "--skipApiVersionCheck",
                "--disableTelemetry",
            ]
            .map(String::from)
            .to_vec()
        }))
    }

    /// The `AZURE_*` variables that point the data mover at it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.0.url.clone()),
        ]
    }

    /// Makes container `name`.
    pub fn container(&self, name: &str) {
        let (status, body) = self.signed("PUT", name, &[("restype", "container")], &[], b"");
        assert_eq!(
            status,
            201,
            "Azurite refused container {name}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores `body` as blob `name` in `container`.
    pub fn put(&self, container: &str, name: &str, body: &[u8]) {
        let path = format!("{container}/{name}");
        let blob = [("x-ms-blob-type", "BlockBlob")];
        let (status, answer) = self.signed("PUT", &path, &[], &blob, body);
        assert_eq!(
            status,
            201,
            "Azurite refused {path}: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// What blob `name` in `container` holds, if anything.
    pub fn get(&self, container: &str, name: &str) -> Option<Vec<u8>> {
        let (status, body) = self.signed("GET", &format!("{container}/{name}"), &[], &[], b"");
        (status == 200).then_some(body)
    }

    /// A request signed with the account's shared key, as Azure Storage requires: `path`
    /// is under the account, `query` and `headers` (x-ms-* ones) go into the signature.
    fn signed(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let date = chrono::Utc::now()
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
        let mut signed_headers: Vec<(String, String)> = vec![
            ("x-ms-date".into(), date),
            ("x-ms-version".into(), "2021-08-06".into()),
        ];
        signed_headers.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        signed_headers.sort();
        let mut query: Vec<(&str, &str)> = query.to_vec();
        query.sort();
        let length = match body.len() {
            0 => String::new(),
            n => n.to_string(),
        };
        let mut to_sign = format!("{method}\n\n\n{length}\n\n\n\n\n\n\n\n\n");
        for (k, v) in &signed_headers {
            to_sign.push_str(&format!("{k}:{v}\n"));
        }
        to_sign.push_str(&format!("/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{path}"));
        for (k, v) in &query {
            to_sign.push_str(&format!("\n{k}:{v}"));
        }
        let signature = shared_key_signature(&to_sign);
        signed_headers.push((
            "Authorization".into(),
            format!("SharedKey {AZURITE_ACCOUNT}:{signature}"),
        ));
        let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let url = match query.is_empty() {
            true => format!("/{AZURITE_ACCOUNT}/{path}"),
            false => format!("/{AZURITE_ACCOUNT}/{path}?{}", query.join("&")),
        };
        let headers: Vec<(&str, String)> = signed_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        self.0.call(method, &url, &headers, body)
    }
}

/// A Shared Key signature: base64 of HMAC-SHA256 over `to_sign` with the account key.
fn shared_key_signature(to_sign: &str) -> String {
    use base64::Engine;
    use hmac::Mac;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(AZURITE_KEY).expect("Azurite's key is base64");
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(to_sign.as_bytes());
    b64.encode(mac.finalize().into_bytes())
}

/// The body of a chunked answer.
fn unchunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..line_end])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
    out
}
