//! A connection's credentials as a provider receives them. Their own file, below `http`
//! (whose `FetchError` hands back the credentials a failed refresh keeps) and `page`.

use secrecy::SecretString;

/// The credentials of one connection, resolved for one run. `Debug` never shows a secret.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The API token (bearer token, API key or OAuth access token), if the provider needs one.
    pub token: Option<SecretString>,
    /// OAuth2: the refresh token that buys a new access token (rotated on every refresh by
    /// some APIs, e.g. Strava).
    pub refresh_token: Option<SecretString>,
    /// OAuth2: when `token` expires, in seconds since the Unix epoch.
    pub expires_at: Option<i64>,
}

impl Credentials {
    /// Whether the two hold the same secrets (used to tell whether another run already
    /// refreshed them).
    pub fn same_as(&self, other: &Credentials) -> bool {
        use secrecy::ExposeSecret;
        let secret = |s: &Option<SecretString>| s.as_ref().map(|s| s.expose_secret().to_string());
        secret(&self.token) == secret(&other.token)
            && secret(&self.refresh_token) == secret(&other.refresh_token)
            && self.expires_at == other.expires_at
    }
}
