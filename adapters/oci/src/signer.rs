//! OCI's request signatures: draft-cavage HTTP signatures with `rsa-sha256`, as OCI's
//! "Request Signatures" documentation specifies them. GET, HEAD and DELETE sign `date
//! (request-target) host`; POST and PUT also sign `content-length content-type
//! x-content-sha256`, the body's SHA-256 in base64. The key id is
//! `<tenancy>/<user>/<fingerprint>`.

use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::sha2::{Digest, Sha256};
use rsa::signature::{SignatureEncoding, Signer as _};
use rsa::RsaPrivateKey;

/// Signs requests with one API key. The key stays in memory; `Debug` shows only its id.
pub struct Signer {
    key_id: String,
    key: SigningKey<Sha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The headers a signed request carries, beside its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub date: String,
    /// For a request with a body: its SHA-256, base64.
    pub content_sha256: Option<String>,
    pub authorization: String,
}

/// What is signed of a request's body.
#[derive(Debug, Clone, Copy)]
pub struct Body<'a> {
    pub bytes: &'a [u8],
    pub content_type: &'a str,
}

impl Signer {
    /// A signer for the API key of `user` in `tenancy` (OCIDs) with `fingerprint`,
    /// from its private key in PEM (PKCS#1 `RSA PRIVATE KEY` or PKCS#8 `PRIVATE KEY`;
    /// an encrypted key is not supported).
    pub fn new(tenancy: &str, user: &str, fingerprint: &str, pem: &str) -> Result<Signer, String> {
        if pem.contains("ENCRYPTED") {
            return Err(
                "the API key is encrypted with a passphrase; not supported: give an unencrypted key file"
                    .into(),
            );
        }
        let key = RsaPrivateKey::from_pkcs1_pem(pem)
            .or_else(|_| RsaPrivateKey::from_pkcs8_pem(pem))
            .map_err(|e| format!("the API key is not an RSA private key in PEM: {e}"))?;
        Ok(Signer {
            key_id: format!("{tenancy}/{user}/{fingerprint}"),
            key: SigningKey::<Sha256>::new(key),
        })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Signs a request: `method` (any case), `target` its path and query as sent
    /// (`/20160918/instances?compartmentId=…`), `host` its Host header (with the port
    /// when not the scheme's), `date` an HTTP date, and its body for POST and PUT.
    pub fn sign(
        &self,
        method: &str,
        target: &str,
        host: &str,
        date: &str,
        body: Option<Body<'_>>,
    ) -> Signed {
        let content_sha256 = body.map(|b| base64(&Sha256::digest(b.bytes)));
        let (headers, text) = signing_string(
            method,
            target,
            host,
            date,
            body.zip(content_sha256.as_deref())
                .map(|(b, sha)| (b.bytes.len(), b.content_type, sha)),
        );
        let signature = base64(&self.key.sign(text.as_bytes()).to_bytes());
        Signed {
            date: date.to_string(),
            content_sha256,
            authorization: format!(
                "Signature version=\"1\",headers=\"{headers}\",keyId=\"{}\",algorithm=\"rsa-sha256\",signature=\"{signature}\"",
                self.key_id
            ),
        }
    }
}

/// The headers signed, and the text signed: one `name: value` line each, in that order.
/// `body` is the length, content type and SHA-256 (base64) of a POST's or PUT's body.
pub fn signing_string(
    method: &str,
    target: &str,
    host: &str,
    date: &str,
    body: Option<(usize, &str, &str)>,
) -> (String, String) {
    let method = method.to_ascii_lowercase();
    let mut headers = vec!["date", "(request-target)", "host"];
    let mut lines = vec![
        format!("date: {date}"),
        format!("(request-target): {method} {target}"),
        format!("host: {host}"),
    ];
    if let Some((length, content_type, sha)) = body {
        headers.extend(["content-length", "content-type", "x-content-sha256"]);
        lines.push(format!("content-length: {length}"));
        lines.push(format!("content-type: {content_type}"));
        lines.push(format!("x-content-sha256: {sha}"));
    }
    (headers.join(" "), lines.join("\n"))
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
