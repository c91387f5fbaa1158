//! `[api]`: the HTTP API the daemon serves beside its work. Off when the table is absent.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tributary_providers::bounds::{count_in, duration_in};

/// The ranges of the `[api]` values.
pub(crate) mod limits {
    use std::time::Duration;

    /// `api.max_body_bytes`: from 1 KiB (a small JSON body) to 64 MiB.
    pub const MAX_BODY_BYTES: (usize, usize) = (1024, 64 * 1024 * 1024);
    /// `api.request_timeout`: one request, from its head to the end of its answer.
    pub const REQUEST_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_secs(600));
}

/// `[api]`.
#[derive(Clone, Debug)]
pub(crate) struct ApiSettings {
    /// The address the API listens on, e.g. "127.0.0.1:8080". Bind it to loopback and put
    /// a reverse proxy with TLS in front (docs/operations.md).
    pub listen: SocketAddr,
    /// The largest request body; a larger one is refused with 413.
    pub max_body_bytes: usize,
    /// The longest a request may take; a slower one is answered 503.
    pub request_timeout: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApiSettings {
    listen: Option<SocketAddr>,
    #[serde(default = "default_max_body_bytes")]
    max_body_bytes: usize,
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    request_timeout: Duration,
}

fn default_max_body_bytes() -> usize {
    1024 * 1024
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Checks the table; errors are `(key, message)`.
pub(super) fn parse(raw: RawApiSettings) -> Result<ApiSettings, (String, String)> {
    let listen = raw.listen.ok_or_else(|| {
        (
            "api.listen".to_string(),
            "missing: expected a socket address such as \"127.0.0.1:8080\" (omit the [api] table to turn the API off)"
                .to_string(),
        )
    })?;
    let (min, max) = limits::MAX_BODY_BYTES;
    count_in(raw.max_body_bytes, min, max)
        .map_err(|message| ("api.max_body_bytes".to_string(), message))?;
    let (min, max) = limits::REQUEST_TIMEOUT;
    duration_in(raw.request_timeout, min, max)
        .map_err(|message| ("api.request_timeout".to_string(), message))?;
    Ok(ApiSettings {
        listen,
        max_body_bytes: raw.max_body_bytes,
        request_timeout: raw.request_timeout,
    })
}
