//! `[api]`: the HTTP API the daemon serves beside its work. Off when the table is absent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tributary_providers::bounds::{count_in, duration_in};

use super::budget::BudgetWindow;
use super::tls::{self, TlsFiles};

/// The ranges of the `[api]` values.
pub(crate) mod limits {
    use std::time::Duration;

    /// `api.max_body_bytes`: from 1 KiB (a small JSON body) to 64 MiB.
    pub const MAX_BODY_BYTES: (usize, usize) = (1024, 64 * 1024 * 1024);
    /// `api.request_timeout`: one request, from its head to the end of its answer.
    pub const REQUEST_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_secs(600));
    /// `api.rate_limit`'s requests per window.
    pub const RATE_LIMIT_REQUESTS: (u64, u64) = (1, 1_000_000_000);
    /// `api.rate_limit`'s window: a second to a day, in whole seconds.
    pub const RATE_LIMIT_WINDOW: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(86_400));
}

/// `[api]`.
#[derive(Clone, Debug)]
pub(crate) struct ApiSettings {
    /// The address the API listens on, e.g. "127.0.0.1:8080". Bind it to loopback and put
    /// a reverse proxy with TLS in front, or set `tls_cert` and `tls_key`
    /// (docs/operations.md).
    pub listen: SocketAddr,
    /// `tls_cert` and `tls_key`: serve HTTPS with this PEM certificate chain and private
    /// key, relative paths taken from config.toml's folder; plain HTTP when `None`. Read at
    /// start only, so a renewed certificate takes a restart.
    pub tls: Option<TlsFiles>,
    /// The largest request body; a larger one is refused with 413.
    pub max_body_bytes: usize,
    /// The longest a request may take; a slower one is answered 503.
    pub request_timeout: Duration,
    /// Each key's requests per window, counted in the database so that every instance
    /// shares the count; one more is answered 429 with `Retry-After`.
    pub rate_limit: BudgetWindow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApiSettings {
    listen: Option<SocketAddr>,
    #[serde(default = "default_max_body_bytes")]
    max_body_bytes: usize,
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    request_timeout: Duration,
    /// `"N/second"`, `"N/minute"`, `"N/hour"`, `"N/day"` or `"N/<duration>"` (`"100/15m"`).
    #[serde(default = "default_rate_limit")]
    rate_limit: String,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

fn default_rate_limit() -> String {
    "600/minute".to_string()
}

/// `"N/unit"` as a window of `N` requests.
pub(crate) fn parse_rate_limit(text: &str) -> Result<BudgetWindow, String> {
    let expected = || {
        format!(
            "expected \"N/second\", \"N/minute\", \"N/hour\", \"N/day\" or \"N/<duration>\" such as \"600/minute\", got {text:?}"
        )
    };
    let (count, per) = text.split_once('/').ok_or_else(expected)?;
    let requests: u64 = count.trim().parse().map_err(|_| expected())?;
    let per = match per.trim() {
        "second" => Duration::from_secs(1),
        "minute" => Duration::from_secs(60),
        "hour" => Duration::from_secs(3_600),
        "day" => Duration::from_secs(86_400),
        other => humantime_serde::re::humantime::parse_duration(other).map_err(|_| expected())?,
    };
    let (min, max) = limits::RATE_LIMIT_REQUESTS;
    count_in(requests, min, max).map_err(|message| format!("requests {message}"))?;
    let (min, max) = limits::RATE_LIMIT_WINDOW;
    duration_in(per, min, max).map_err(|message| format!("window {message}"))?;
    if per.subsec_nanos() != 0 {
        return Err(format!("the window must be whole seconds, got {text:?}"));
    }
    Ok(BudgetWindow { requests, per })
}

fn default_max_body_bytes() -> usize {
    1024 * 1024
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Checks the table, taking relative paths from `config_dir`; errors are `(key, message)`.
pub(super) fn parse(
    raw: RawApiSettings,
    config_dir: &Path,
) -> Result<ApiSettings, (String, String)> {
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
    let rate_limit = parse_rate_limit(&raw.rate_limit)
        .map_err(|message| ("api.rate_limit".to_string(), message))?;
    let tls = tls::files(raw.tls_cert, raw.tls_key, config_dir)?;
    Ok(ApiSettings {
        listen,
        tls,
        max_body_bytes: raw.max_body_bytes,
        request_timeout: raw.request_timeout,
        rate_limit,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_rate_limit;
    use std::time::Duration;

    #[test]
    fn a_rate_limit_reads_as_requests_per_window_and_bad_ones_name_the_form() {
        let window = parse_rate_limit("600/minute").expect("valid");
        assert_eq!(
            (window.requests, window.per),
            (600, Duration::from_secs(60))
        );
        let window = parse_rate_limit("100/15m").expect("valid");
        assert_eq!(
            (window.requests, window.per),
            (100, Duration::from_secs(900))
        );
        for bad in [
            "600",
            "x/minute",
            "0/minute",
            "5/fortnight",
            "5/1500ms",
            "5/2days",
        ] {
            let message = parse_rate_limit(bad).expect_err(bad);
            assert!(
                message.contains(bad) || message.contains("between"),
                "{bad}: {message}"
            );
        }
    }
}
