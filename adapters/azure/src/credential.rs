//! Tokens for Azure Resource Manager, from Microsoft Entra ID: a service principal's
//! client secret, a workload identity's federated token, or the machine's managed
//! identity, tried in that order as the environment provides them (the variables Azure's
//! SDKs read). Each is one documented OAuth2 request; a token is kept until five minutes
//! before it expires. Tokens and secrets never enter a log or an error message.

use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::Mutex;

/// The scope of Azure Resource Manager.
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// Where a token comes from.
#[derive(Clone)]
pub enum Source {
    /// `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`.
    ClientSecret {
        tenant: String,
        client: String,
        secret: String,
    },
    /// `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE` (Kubernetes
    /// workload identity).
    Federated {
        tenant: String,
        client: String,
        token_file: String,
    },
    /// The instance metadata service of an Azure VM; `AZURE_CLIENT_ID` picks a
    /// user-assigned identity.
    ManagedIdentity { client: Option<String> },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl Source {
    /// The first source the environment provides; managed identity when none other.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Source {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        match (
            var("AZURE_TENANT_ID"),
            var("AZURE_CLIENT_ID"),
            var("AZURE_CLIENT_SECRET"),
            var("AZURE_FEDERATED_TOKEN_FILE"),
        ) {
            (Some(tenant), Some(client), Some(secret), _) => Source::ClientSecret {
                tenant,
                client,
                secret,
            },
            (Some(tenant), Some(client), None, Some(token_file)) => Source::Federated {
                tenant,
                client,
                token_file,
            },
            (_, client, _, _) => Source::ManagedIdentity { client },
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Source::ClientSecret { .. } => "a client secret (AZURE_CLIENT_SECRET)",
            Source::Federated { .. } => "a federated token (AZURE_FEDERATED_TOKEN_FILE)",
            Source::ManagedIdentity { .. } => "the managed identity (instance metadata)",
        }
    }
}

/// Gets and keeps ARM tokens.
pub struct Credential {
    source: Source,
    /// Microsoft Entra ID, e.g. `https://login.microsoftonline.com`.
    authority: String,
    /// The instance metadata service, e.g. `http://169.254.169.254`.
    imds: String,
    http: reqwest::Client,
    cached: Mutex<Option<(String, Instant)>>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    /// Seconds; IMDS sends it as a string.
    expires_in: serde_json::Value,
}

impl Credential {
    pub fn new(source: Source, authority: &str, imds: &str, http: reqwest::Client) -> Credential {
        Credential {
            source,
            authority: authority.trim_end_matches('/').to_string(),
            imds: imds.trim_end_matches('/').to_string(),
            http,
            cached: Mutex::new(None),
        }
    }

    /// Forgets the kept token: ARM refused it.
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }

    /// A token for ARM, from the cache while it has five minutes left.
    pub async fn token(&self) -> Result<String, String> {
        let mut cached = self.cached.lock().await;
        if let Some((token, until)) = cached.as_ref() {
            if Instant::now() + Duration::from_secs(300) < *until {
                return Ok(token.clone());
            }
        }
        let (token, seconds) = self.fetch().await.map_err(|e| {
            format!(
                "cannot get an Azure token with {}: {e}",
                self.source.describe()
            )
        })?;
        *cached = Some((token.clone(), Instant::now() + Duration::from_secs(seconds)));
        Ok(token)
    }

    async fn fetch(&self) -> Result<(String, u64), String> {
        let request = match &self.source {
            Source::ClientSecret {
                tenant,
                client,
                secret,
            } => self
                .http
                .post(format!("{}/{tenant}/oauth2/v2.0/token", self.authority))
                .form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client),
                    ("client_secret", secret),
                    ("scope", ARM_SCOPE),
                ]),
            Source::Federated {
                tenant,
                client,
                token_file,
            } => {
                let assertion = std::fs::read_to_string(token_file)
                    .map_err(|e| format!("cannot read {token_file}: {e}"))?;
                self.http
                    .post(format!("{}/{tenant}/oauth2/v2.0/token", self.authority))
                    .form(&[
                        ("grant_type", "client_credentials"),
                        ("client_id", client),
                        (
                            "client_assertion_type",
                            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                        ),
                        ("client_assertion", assertion.trim()),
                        ("scope", ARM_SCOPE),
                    ])
            }
            Source::ManagedIdentity { client } => {
                let mut query = vec![
                    ("api-version", "2018-02-01"),
                    ("resource", "https://management.azure.com/"),
                ];
                if let Some(c) = client {
                    query.push(("client_id", c));
                }
                self.http
                    .get(format!("{}/metadata/identity/oauth2/token", self.imds))
                    .header("Metadata", "true")
                    .query(&query)
            }
        };
        let response = request
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            // Entra's error and its description; never the request, which holds the secret.
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            return Err(format!(
                "{status}: {} {}",
                v["error"].as_str().unwrap_or(""),
                v["error_description"].as_str().unwrap_or("")
            ));
        }
        let answer: TokenAnswer =
            serde_json::from_str(&text).map_err(|e| format!("not a token answer: {e}"))?;
        let seconds = match &answer.expires_in {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        }
        .unwrap_or(300);
        Ok((answer.access_token, seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_picks_the_source_as_azures_sdks_do() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(matches!(
            Source::from_env(env(&[
                ("AZURE_TENANT_ID", "t"),
                ("AZURE_CLIENT_ID", "c"),
                ("AZURE_CLIENT_SECRET", "s")
            ])),
            Source::ClientSecret { .. }
        ));
        assert!(matches!(
            Source::from_env(env(&[
                ("AZURE_TENANT_ID", "t"),
                ("AZURE_CLIENT_ID", "c"),
                ("AZURE_FEDERATED_TOKEN_FILE", "/f")
            ])),
            Source::Federated { .. }
        ));
        assert!(matches!(
            Source::from_env(env(&[("AZURE_CLIENT_ID", "c")])),
            Source::ManagedIdentity { client: Some(_) }
        ));
        // The secret never shows.
        let shown = format!(
            "{:?}",
            Source::from_env(env(&[
                ("AZURE_TENANT_ID", "t"),
                ("AZURE_CLIENT_ID", "c"),
                ("AZURE_CLIENT_SECRET", "hunter2")
            ]))
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
