//! The client profile: the API's address and a token, in one file only its owner may
//! read (`client.json` under `$MERIDIAN_CONFIG_DIR`, else `$XDG_CONFIG_HOME/meridian`,
//! else `~/.config/meridian`). `meridian up` writes it on first start; the CLI reads it
//! when neither `--server`/`MERIDIAN_SERVER` nor `--token`/`MERIDIAN_TOKEN` says
//! otherwise.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Where a Meridian API listens unless told otherwise.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7373";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub server: String,
    pub token: String,
}

/// The profile's path, when there is a home to put it in.
pub fn path() -> Option<PathBuf> {
    let dir = std::env::var_os("MERIDIAN_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CONFIG_HOME")
                .filter(|d| !d.is_empty())
                .map(|d| PathBuf::from(d).join("meridian"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config").join("meridian"))
        })?;
    Some(dir.join("client.json"))
}

/// The profile, if there is one that reads.
pub fn read() -> Option<Profile> {
    let text = std::fs::read_to_string(path()?).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes the profile (mode 0600); returns where.
pub fn write(profile: &Profile) -> std::io::Result<PathBuf> {
    let path = path().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no home directory for the client profile (set MERIDIAN_CONFIG_DIR)",
        )
    })?;
    let text = serde_json::to_string_pretty(profile).expect("a profile serializes");
    meridian_app::auth::write_private(&path, &(text + "\n"))?;
    Ok(path)
}

static TOKEN: OnceLock<Option<String>> = OnceLock::new();

/// The token given on the command line or in `MERIDIAN_TOKEN`, for every request.
pub fn set_token(token: Option<String>) {
    let _ = TOKEN.set(token.filter(|t| !t.is_empty()));
}

/// The API to talk to: the one named, else the profile's, else the default.
pub fn server(named: Option<&str>) -> String {
    match named {
        Some(s) => s.to_string(),
        None => read()
            .map(|p| p.server)
            .unwrap_or_else(|| DEFAULT_SERVER.to_string()),
    }
}

/// The token to send to `server`: the one given, else the profile's when the profile
/// is for that server (a token never goes to a server it was not made for).
pub fn token_for(server: &str) -> Option<String> {
    if let Some(Some(token)) = TOKEN.get() {
        return Some(token.clone());
    }
    let profile = read()?;
    (profile.server.trim_end_matches('/') == server.trim_end_matches('/')).then_some(profile.token)
}
