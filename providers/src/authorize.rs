//! The authorization code grant (RFC 6749 §4.1) with PKCE (RFC 7636), as the Connect page
//! runs it: a provider's OAuth2 application ([`AuthorizationApp`], from its kind's
//! config), the URL the user's browser is sent to, and the one exchange of the code for
//! the connection's tokens.
//!
//! The exchange is sent once: the client retries only when no connection was made, as a
//! code is single use and a second try after an answer would be refused anyway.

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;

use crate::http::{display_url, HttpClient, HttpSettings};
use crate::oauth2::ClientAuth;
use crate::oauth2::{basic_client_auth, expiry, read_tokens, seconds, TokenEndpointPolicy};
use crate::{Credentials, FetchError};

/// The longest provider-side account id kept: ids are numbers or short names.
pub const MAX_ACCOUNT_ID_BYTES: usize = 255;

/// A provider's OAuth2 application, as the authorization code grant needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizationApp {
    /// Where the browser is sent to consent.
    pub authorize_url: Url,
    /// Where the code is exchanged for tokens.
    pub token_url: Url,
    pub client_id: String,
    /// The environment variable that holds the client secret; `None`: a public client.
    pub client_secret_env: Option<String>,
    /// `scope`, as the provider spells it (GitHub separates by spaces, Strava by commas).
    pub scope: Option<String>,
    /// Whether to send a PKCE S256 challenge and its verifier.
    pub pkce: bool,
    /// How the client authenticates at the token endpoint.
    pub client_auth: ClientAuth,
    /// A JSON pointer to the provider-side account id in the token endpoint's answer
    /// (Strava's `/athlete/id`), when the answer carries it.
    pub account_in_answer: Option<&'static str>,
}

/// What the exchange of a code gave: the connection's credentials and, when the answer
/// names it, the provider-side account.
#[derive(Debug)]
pub struct Exchanged {
    pub credentials: Credentials,
    pub account_id: Option<String>,
}

impl AuthorizationApp {
    /// The authorization request (RFC 6749 §4.1.1, RFC 7636 §4.3): `authorize_url` with
    /// the grant's query parameters added to any it has.
    pub fn authorization_url(
        &self,
        redirect_uri: &str,
        state: &str,
        code_challenge: Option<&str>,
    ) -> Url {
        let mut url = self.authorize_url.clone();
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &self.client_id)
                .append_pair("redirect_uri", redirect_uri);
            if let Some(scope) = &self.scope {
                query.append_pair("scope", scope);
            }
            query.append_pair("state", state);
            if let Some(challenge) = code_challenge {
                query
                    .append_pair("code_challenge", challenge)
                    .append_pair("code_challenge_method", "S256");
            }
        }
        url
    }

    /// Exchanges `code` for tokens once (RFC 6749 §4.1.3): the same `redirect_uri` as the
    /// authorization request, and the PKCE `code_verifier`. No secret (code, verifier,
    /// client secret, tokens) is in an error.
    pub async fn exchange_code(
        &self,
        http: &HttpSettings,
        code: &SecretString,
        redirect_uri: &str,
        code_verifier: Option<&SecretString>,
    ) -> Result<Exchanged, FetchError> {
        let client_secret = self.client_secret()?;
        let client = HttpClient::new(http.clone())?;
        let code = code.expose_secret();
        let mut form: Vec<(&str, &str)> = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
        ];
        if let Some(verifier) = code_verifier {
            form.push(("code_verifier", verifier.expose_secret()));
        }
        // GitHub answers form-encoded unless asked for JSON.
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let mut basic = None;
        match (self.client_auth, &client_secret) {
            (ClientAuth::Basic, Some(secret)) => {
                let (value, encoded) = basic_client_auth(&self.client_id, secret.expose_secret())?;
                headers.insert(AUTHORIZATION, value);
                basic = Some(encoded);
            }
            (_, secret) => {
                form.push(("client_id", &self.client_id));
                if let Some(secret) = secret {
                    form.push(("client_secret", secret.expose_secret()));
                }
            }
        }
        let policy = TokenEndpointPolicy { what: "the code" };
        let result = client
            .post_form_with(self.token_url.clone(), headers, &form, &policy)
            .await
            .and_then(|response| {
                let body = response.value();
                self.read_answer(&response.url, response.status, &body, Utc::now())
            });
        let secrets = [
            Some(code),
            code_verifier.map(ExposeSecret::expose_secret),
            client_secret.as_ref().map(ExposeSecret::expose_secret),
            basic.as_deref(),
        ];
        result.map_err(|error| error.redact_secrets(secrets.into_iter().flatten()))
    }

    /// The client secret from `client_secret_env`, when the app has one.
    fn client_secret(&self) -> Result<Option<SecretString>, FetchError> {
        crate::oauth2::client_secret_from_env(
            "client_secret_env",
            self.client_secret_env.as_deref(),
        )
    }

    /// Reads a successful answer (§5.1). GitHub answers an error with 200 and an `error`
    /// field; a token without an expiry (GitHub's OAuth apps) never expires.
    fn read_answer(
        &self,
        url: &Url,
        status: u16,
        body: &Value,
        now: DateTime<Utc>,
    ) -> Result<Exchanged, FetchError> {
        let credentials = granted(url, status, body, now)?;
        let account_id = self
            .account_in_answer
            .and_then(|pointer| body.pointer(pointer))
            .and_then(account_id_of);
        if self.account_in_answer.is_some() && account_id.is_none() {
            tracing::warn!(
                token_url = %display_url(url),
                "The token endpoint's answer names no account; the connection is stored without one."
            );
        }
        Ok(Exchanged {
            credentials,
            account_id,
        })
    }
}

/// The credentials a token endpoint's successful answer (§5.1) grants: a token without an
/// expiry never expires.
pub(crate) fn granted(
    url: &Url,
    status: u16,
    body: &Value,
    now: DateTime<Utc>,
) -> Result<Credentials, FetchError> {
    refusal(status, body)?;
    let (access_token, refresh_token) = read_tokens(url, body)?;
    let expires_at = expiry(
        body.get("expires_at").and_then(seconds),
        body.get("expires_in").and_then(seconds),
        now,
    );
    Ok(Credentials {
        token: Some(access_token),
        refresh_token,
        expires_at,
    })
}

/// The token endpoint's refusal of a code, when its answer is one: an `error` field,
/// which GitHub sends with a 200.
fn refusal(status: u16, body: &Value) -> Result<(), FetchError> {
    match body.get("error").and_then(Value::as_str) {
        Some(error) => Err(FetchError::Unauthorized {
            status,
            message: format!(
                "the token endpoint refused the code: {}",
                crate::quote::truncated(error.trim(), 200)
            ),
        }),
        None => Ok(()),
    }
}

/// An account id as the API gives it, a number or a string, kept when it is short and
/// printable.
pub fn account_id_of(value: &Value) -> Option<String> {
    let text = match value {
        Value::Number(number) => number.to_string(),
        Value::String(text) => text.trim().to_string(),
        _ => return None,
    };
    let printable = text.chars().all(|c| !c.is_control());
    (!text.is_empty() && text.len() <= MAX_ACCOUNT_ID_BYTES && printable).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> AuthorizationApp {
        AuthorizationApp {
            authorize_url: Url::parse("https://auth.example/authorize?prompt=consent")
                .expect("URL"),
            token_url: Url::parse("https://auth.example/token").expect("URL"),
            client_id: "client 1".to_string(),
            client_secret_env: None,
            scope: Some("read,activity:read_all".to_string()),
            pkce: true,
            client_auth: ClientAuth::Post,
            account_in_answer: Some("/athlete/id"),
        }
    }

    #[test]
    fn the_authorization_url_keeps_the_endpoints_query_and_adds_the_grants() {
        let url =
            app().authorization_url("https://sync.example/connect/callback", "s1", Some("c1"));
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let expected = [
            ("prompt", "consent"),
            ("response_type", "code"),
            ("client_id", "client 1"),
            ("redirect_uri", "https://sync.example/connect/callback"),
            ("scope", "read,activity:read_all"),
            ("state", "s1"),
            ("code_challenge", "c1"),
            ("code_challenge_method", "S256"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn an_answer_gives_tokens_an_expiry_only_when_it_has_one_and_the_account_it_names() {
        let url = Url::parse("https://auth.example/token").expect("URL");
        let now = Utc::now();
        let body =
            serde_json::json!({"access_token": "a", "token_type": "bearer", "athlete": {"id": 42}});
        let exchanged = app().read_answer(&url, 200, &body, now).expect("tokens");
        assert_eq!(exchanged.credentials.expires_at, None);
        assert_eq!(exchanged.account_id.as_deref(), Some("42"));
        let body = serde_json::json!({"access_token": "a", "expires_in": 600});
        let exchanged = app().read_answer(&url, 200, &body, now).expect("tokens");
        assert_eq!(
            exchanged.credentials.expires_at,
            Some(now.timestamp() + 600)
        );
        assert_eq!(exchanged.account_id, None);
        let refused = serde_json::json!({"error": "bad_verification_code"});
        let error = app()
            .read_answer(&url, 200, &refused, now)
            .expect_err("refused");
        assert!(
            error.to_string().contains("bad_verification_code"),
            "{error}"
        );
    }
}
