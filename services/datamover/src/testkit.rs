//! For tests (here and in other crates): a real S3 server, moto's, on a free port. It is
//! found as `MERIDIAN_MOTO_SERVER`, else `moto_server` on `PATH`; `scripts/test`
//! installs it with `pip install 'moto[server]'`. No test skips when it is missing: it
//! fails with how to install it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running moto server, stopped when dropped.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> String {
    if let Ok(path) = std::env::var("MERIDIAN_MOTO_SERVER") {
        return path;
    }
    Command::new("sh")
        .args(["-c", "command -v moto_server"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| {
            panic!(
                "this test needs moto's S3 server (moto_server): install it with \
                 `python3 -m pip install 'moto[server]'` (scripts/test does), or set MERIDIAN_MOTO_SERVER"
            )
        })
}

impl Moto {
    /// Starts one and waits until it answers; panics with the reason when it cannot.
    pub fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "moto_server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// The `AWS_*` variables a process needs to reach it (test credentials).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Makes bucket `name` (an unsigned request, which moto takes).
    pub fn bucket(&self, name: &str) {
        let (status, body) = self.call("PUT", &format!("/{name}"), b"");
        assert_eq!(
            status,
            200,
            "moto refused bucket {name}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores `body` at `bucket/key`.
    pub fn put(&self, bucket: &str, key: &str, body: &[u8]) {
        let (status, answer) = self.call("PUT", &format!("/{bucket}/{key}"), body);
        assert_eq!(
            status,
            200,
            "moto refused {bucket}/{key}: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// What `bucket/key` holds, if anything.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let (status, body) = self.call("GET", &format!("/{bucket}/{key}"), b"");
        (status == 200).then_some(body)
    }

    /// One plain HTTP/1.1 request: the status and the body.
    fn call(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        use std::io::{Read, Write};
        let host = self.url.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host).expect("reach moto");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .expect("send");
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
