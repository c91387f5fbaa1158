//! What `connections.credentials` holds, and turning it into [`Credentials`] for a run.
//!
//! The column is JSON with two parts. The *source* is what the config or
//! `tributary connections add` gave: an environment variable's name (`token_env`,
//! `refresh_token_env`) or a literal (`token`, `refresh_token`), and `expires_at`. The
//! *refreshed* part (`oauth`) is written by the pipeline after an OAuth refresh and wins
//! over the source, because the API may have rotated the refresh token the source names.
//! When the source changes (an operator put in new credentials), the refreshed part is
//! dropped.
//!
//! A column that holds a secret itself (a literal or a refreshed token) is stored sealed
//! under the secrets key ([`crate::secrets`]); one that only names environment variables
//! is stored as plain JSON and needs no key. [`StoredCredentials::from_column`] and
//! [`StoredCredentials::to_column_for`] are the only ways the column is read and written.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use tributary_providers::Credentials;

use crate::config::{ConfigError, ConnectionSettings, Settings, REDACTED};
use crate::entities::connection;
use crate::secrets::{sealed_key_id, Binding, Keyring, SecretsError};

// Written here rather than beside the entity, so that `entities` names nothing of ours
// but the config.
impl connection::Model {
    /// The row its sealed credentials are bound to.
    pub fn binding(&self) -> Binding<'_> {
        Binding {
            user_id: &self.user_id,
            provider: &self.provider,
        }
    }
}

/// The JSON stored in `connections.credentials`. Its `Debug` shows which parts are set,
/// never a token.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredCredentials {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_token_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// The credentials an OAuth refresh returned, newest first in precedence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<RefreshedCredentials>,
}

/// Credentials written back after an OAuth refresh.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshedCredentials {
    pub token: Option<String>,
    pub refresh_token: Option<String>,
    pub expires_at: Option<i64>,
}

impl StoredCredentials {
    /// The source part for a connection listed in the config.
    pub(crate) fn from_config(connection: &ConnectionSettings) -> StoredCredentials {
        StoredCredentials {
            token_env: connection.token_env.clone(),
            token: connection
                .token
                .as_ref()
                .map(|t| t.expose_secret().to_string()),
            refresh_token_env: connection.refresh_token_env.clone(),
            refresh_token: connection
                .refresh_token
                .as_ref()
                .map(|t| t.expose_secret().to_string()),
            expires_at: connection.expires_at,
            oauth: None,
        }
    }

    /// Reads the column. The message never contains the column's text (it holds secrets).
    pub fn parse(column: &str) -> Result<StoredCredentials, String> {
        serde_json::from_str(column).map_err(|error| {
            format!(
                "the connection's stored credentials are not in the expected form (line {}, column {})",
                error.line(),
                error.column()
            )
        })
    }

    /// Reads the column of `binding`'s row, opening it with `keyring` when sealed. The
    /// message names the connection and never contains the column's text. Public so that
    /// tests can check what a connection's row holds.
    pub fn from_column(
        keyring: &Keyring,
        binding: Binding<'_>,
        column: &str,
    ) -> Result<StoredCredentials, String> {
        let text = keyring
            .open(binding, column)
            .map_err(|error| error.to_string())?;
        StoredCredentials::parse(&text).map_err(|message| format!("{binding}: {message}"))
    }

    /// The column for `binding`'s row: plain JSON when it holds no secret itself, else
    /// sealed under the current key (refused without one unless `allow_plaintext`).
    pub fn to_column_for(
        &self,
        keyring: &Keyring,
        binding: Binding<'_>,
    ) -> Result<String, SecretsError> {
        let json = zeroize::Zeroizing::new(self.to_column());
        if !self.holds_secrets() {
            return Ok(json.to_string());
        }
        keyring.seal(binding, &json, &format!("the credentials of {binding}"))
    }

    /// Whether any secret is held here rather than named by an environment variable.
    pub fn holds_secrets(&self) -> bool {
        let oauth = self
            .oauth
            .as_ref()
            .is_some_and(|o| o.token.is_some() || o.refresh_token.is_some());
        self.token.is_some() || self.refresh_token.is_some() || oauth
    }

    /// How a stored column holds its credentials, for `connections list`: described when
    /// it can be read, else only the key it was sealed with.
    pub fn describe_column(keyring: &Keyring, binding: Binding<'_>, column: &str) -> String {
        let key_id = sealed_key_id(column);
        match (
            StoredCredentials::from_column(keyring, binding, column),
            key_id,
        ) {
            (Ok(stored), Some(id)) => format!("{}; sealed with key {id}", stored.describe()),
            (Ok(stored), None) if stored.holds_secrets() => {
                format!("{}; IN CLEAR", stored.describe())
            }
            (Ok(stored), None) => stored.describe(),
            (Err(_), Some(id)) if !keyring.knows(id) => format!("sealed with key {id}"),
            (Err(message), _) => message,
        }
    }

    /// The column's JSON text, unsealed: [`StoredCredentials::to_column_for`] stores it.
    pub fn to_column(&self) -> String {
        // Serialising plain strings and integers into JSON cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// Whether the source part (everything but `oauth`) equals `other`'s.
    pub fn same_source(&self, other: &StoredCredentials) -> bool {
        StoredCredentials {
            oauth: None,
            ..self.clone()
        } == StoredCredentials {
            oauth: None,
            ..other.clone()
        }
    }

    /// Resolves environment variables into the credentials a run uses; refreshed OAuth
    /// credentials win over the source.
    pub fn resolve(&self) -> Result<Credentials, String> {
        if let Some(oauth) = &self.oauth {
            return Ok(Credentials {
                token: oauth.token.clone().map(SecretString::from),
                refresh_token: oauth.refresh_token.clone().map(SecretString::from),
                expires_at: oauth.expires_at,
            });
        }
        Ok(Credentials {
            token: secret(&self.token_env, &self.token, "token_env")?,
            refresh_token: secret(
                &self.refresh_token_env,
                &self.refresh_token,
                "refresh_token_env",
            )?,
            expires_at: self.expires_at,
        })
    }

    /// Records refreshed credentials.
    pub fn set_refreshed(&mut self, credentials: &Credentials) {
        let reveal = |s: &Option<SecretString>| s.as_ref().map(|s| s.expose_secret().to_string());
        self.oauth = Some(RefreshedCredentials {
            token: reveal(&credentials.token),
            refresh_token: reveal(&credentials.refresh_token),
            expires_at: credentials.expires_at,
        });
    }

    /// How the credentials are held, for `connections list` (never the secret itself).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (&self.token_env, &self.token) {
            (Some(var), _) => parts.push(format!("token from ${var}")),
            (None, Some(_)) => parts.push("token stored".to_string()),
            (None, None) => parts.push("no token".to_string()),
        }
        match (&self.refresh_token_env, &self.refresh_token) {
            (Some(var), _) => parts.push(format!("refresh token from ${var}")),
            (None, Some(_)) => parts.push("refresh token stored".to_string()),
            (None, None) => {}
        }
        if let Some(oauth) = &self.oauth {
            let expiry = oauth
                .expires_at
                .and_then(|at| chrono::DateTime::from_timestamp(at, 0))
                .map(|at| format!(", expires {}", at.format("%Y-%m-%d %H:%M UTC")))
                .unwrap_or_default();
            parts.push(format!("refreshed{expiry}"));
        }
        parts.join("; ")
    }
}

/// `Some("[REDACTED]")` for a set secret, for `Debug` output.
fn hidden(secret: &Option<String>) -> Option<&'static str> {
    secret.as_ref().map(|_| REDACTED)
}

impl std::fmt::Debug for StoredCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredentials")
            .field("token_env", &self.token_env)
            .field("token", &hidden(&self.token))
            .field("refresh_token_env", &self.refresh_token_env)
            .field("refresh_token", &hidden(&self.refresh_token))
            .field("expires_at", &self.expires_at)
            .field("oauth", &self.oauth)
            .finish()
    }
}

impl std::fmt::Debug for RefreshedCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefreshedCredentials")
            .field("token", &hidden(&self.token))
            .field("refresh_token", &hidden(&self.refresh_token))
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Refuses a config that gives a literal secret (`token`, `refresh_token`) when it could
/// not be stored: no key is configured and `allow_plaintext` is not set.
pub(crate) fn check_storable(settings: &Settings, keyring: &Keyring) -> Result<(), ConfigError> {
    for provider in settings.providers.values() {
        for (index, connection) in provider.connections.iter().enumerate() {
            let literal = [
                ("token", connection.token.is_some()),
                ("refresh_token", connection.refresh_token.is_some()),
            ];
            for (key, given) in literal {
                if !given {
                    continue;
                }
                let what = format!("a literal {key}");
                if let Err(error) = keyring.check_can_store(&what) {
                    return Err(ConfigError::Invalid {
                        path: settings.path.clone(),
                        key: format!("providers.{}.connections[{index}].{key}", provider.name),
                        message: error.to_string(),
                    });
                }
            }
        }
    }
    Ok(())
}

fn secret(
    env: &Option<String>,
    literal: &Option<String>,
    key: &str,
) -> Result<Option<SecretString>, String> {
    if let Some(var) = env {
        return match std::env::var(var) {
            Ok(value) if !value.trim().is_empty() => Ok(Some(SecretString::from(value))),
            _ => Err(format!(
                "credentials: environment variable {var} (from {key}) is not set or empty"
            )),
        };
    }
    Ok(literal.clone().map(SecretString::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshed_credentials_win_and_are_kept_apart_from_the_source() {
        let mut stored = StoredCredentials {
            token: Some("old-access".into()),
            refresh_token: Some("old-refresh".into()),
            expires_at: Some(10),
            ..StoredCredentials::default()
        };
        let source = stored.clone();
        stored.set_refreshed(&Credentials {
            token: Some(SecretString::from("new-access")),
            refresh_token: Some(SecretString::from("new-refresh")),
            expires_at: Some(99),
        });
        let parsed = StoredCredentials::parse(&stored.to_column()).unwrap();
        assert_eq!(parsed, stored);
        assert!(parsed.same_source(&source));
        let resolved = parsed.resolve().unwrap();
        assert_eq!(resolved.token.unwrap().expose_secret(), "new-access");
        assert_eq!(
            resolved.refresh_token.unwrap().expose_secret(),
            "new-refresh"
        );
        assert_eq!(resolved.expires_at, Some(99));
        assert!(!parsed.describe().contains("new-"), "{}", parsed.describe());
    }

    #[test]
    fn an_unreadable_column_is_reported_without_its_text() {
        let error = StoredCredentials::parse("{\"token\": \"s3cret\", \"bogus\": 1}").unwrap_err();
        assert!(!error.contains("s3cret"));
    }
}
