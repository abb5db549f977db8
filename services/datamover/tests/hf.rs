//! `hf://` model references against a local stand-in of the Hub's HTTP file API (no hub
//! is reachable here): the file list at `/api/models/{repo}/tree/{revision}`, each file
//! at `/{repo}/resolve/{revision}/{path}`, answered by a redirect as the Hub does. The
//! model's files land under the destination with their paths; an unknown revision is
//! the source's fault, named; the bearer token from `HF_TOKEN` is sent.

use std::sync::{Arc, Mutex};

use meridian_datamover::fetch::{copy, FetchError, Progress, Reach};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The stand-in: repo `org/tiny` at `main` holds `config.json` and `weights/w.bin`.
/// Returns its URL and the Authorization headers it saw.
async fn hub() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let auth = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let auth = auth.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some(line) = text
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                {
                    auth.lock().unwrap().push(line.to_string());
                }
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, headers, body): (&str, String, Vec<u8>) = match path.as_str() {
                    "/api/models/org/tiny/tree/main?recursive=true" => (
                        "200 OK",
                        "content-type: application/json\r\n".into(),
                        br#"[{"type":"file","oid":"a","size":15,"path":"config.json"},{"type":"directory","oid":"b","size":0,"path":"weights"},{"type":"file","oid":"c","size":4,"path":"weights/w.bin"}]"#.to_vec(),
                    ),
                    "/org/tiny/resolve/main/config.json" => (
                        "302 Found",
                        "location: /cdn/config.json\r\n".into(),
                        Vec::new(),
                    ),
                    "/cdn/config.json" => ("200 OK", String::new(), b"{\"layers\": 2}\n\n".to_vec()),
                    "/org/tiny/resolve/main/weights/w.bin" => ("200 OK", String::new(), vec![1, 2, 3, 4]),
                    _ => ("404 Not Found", String::new(), Vec::new()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    (url, seen)
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_comes_in_file_by_file_and_an_unknown_revision_is_named() {
    let (url, seen) = hub().await;
    std::env::set_var("HF_ENDPOINT", &url);
    std::env::set_var("HF_TOKEN", "hf_test_token");
    let http = Reach::default();
    let volume = tempfile::tempdir().unwrap();
    let copied = copy(
        &http,
        "hf://org/tiny",
        volume.path(),
        "/model/",
        &Progress::default(),
    )
    .await
    .expect("the model");
    let config = std::fs::read(volume.path().join("model/config.json")).unwrap();
    assert_eq!(config, b"{\"layers\": 2}\n\n");
    let weights = std::fs::read(volume.path().join("model/weights/w.bin")).unwrap();
    assert_eq!(weights, [1, 2, 3, 4]);
    let manifest = format!(
        "{}  config.json\n{}  weights/w.bin\n",
        sha256(&config),
        sha256(&weights)
    );
    assert_eq!(
        (copied.bytes, copied.digest),
        (19, sha256(manifest.as_bytes()))
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|h| h.ends_with("Bearer hf_test_token")),
        "the token goes with the requests"
    );

    match copy(
        &http,
        "hf://org/tiny@v9",
        volume.path(),
        "/other/",
        &Progress::default(),
    )
    .await
    {
        Err(FetchError::Source(why)) => {
            assert!(
                why.contains("hf://org/tiny@v9") && why.contains("404"),
                "{why}"
            )
        }
        other => panic!("an unknown revision is the source's fault: {other:?}"),
    }
    for bad in [
        "hf://tiny",
        "hf://org/tiny/extra",
        "hf://org/../x",
        "hf://org/tiny@",
    ] {
        assert!(
            matches!(
                copy(&http, bad, volume.path(), "/x/", &Progress::default()).await,
                Err(FetchError::Invalid(_))
            ),
            "{bad}"
        );
    }
}
