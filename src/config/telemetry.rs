//! `[telemetry]`: where traces are exported (OTLP over HTTP/protobuf). Off without the
//! table.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;
use url::Url;

/// The table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetrySettings {
    endpoint: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    service_name: Option<String>,
    sampling_ratio: Option<f64>,
    #[serde(default)]
    include_user_id: bool,
}

/// `[telemetry]`. Holds the names of the headers' variables, never their values.
#[derive(Clone, Debug)]
pub(crate) struct TelemetrySettings {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318`; spans are POSTed
    /// to its `/v1/traces`.
    pub endpoint: Url,
    /// Header name → the environment variable that holds its value (an API key).
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the exported spans. Default "tributary".
    pub service_name: String,
    /// The share of traces kept, 0.0 to 1.0. Default 1.0.
    pub sampling_ratio: f64,
    /// Export the app's user id on run spans (it may be personal data). Default false.
    pub include_user_id: bool,
}

impl TelemetrySettings {
    /// The URL spans are POSTed to.
    pub(crate) fn traces_url(&self) -> String {
        let base = self.endpoint.as_str().trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_string()
        } else {
            format!("{base}/v1/traces")
        }
    }

    /// The headers, read from their variables. The error names the key and the variable,
    /// never a value.
    pub(crate) fn resolve_headers(&self) -> Result<Vec<(String, SecretString)>, (String, String)> {
        self.headers
            .iter()
            .map(|(name, var)| {
                super::secret_env::secret_from_env(var)
                    .map(|value| (name.clone(), value))
                    .map_err(|message| (format!("telemetry.headers.{name}"), message))
            })
            .collect()
    }
}

/// Checks the table; errors are `(key, message)`.
pub(super) fn parse(
    raw: RawTelemetrySettings,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<TelemetrySettings, (String, String)> {
    let at = |key: &str, message: String| (format!("telemetry.{key}"), message);
    let endpoint = raw.endpoint.ok_or_else(|| {
        at(
            "endpoint",
            "missing: expected the collector's URL, e.g. \"http://127.0.0.1:4318\"".into(),
        )
    })?;
    let endpoint =
        Url::parse(&endpoint).map_err(|error| at("endpoint", format!("not a URL: {error}")))?;
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(at(
            "endpoint",
            format!("expected an http or https URL, got {:?}", endpoint.scheme()),
        ));
    }
    if !endpoint.username().is_empty() || endpoint.password().is_some() {
        return Err(at(
            "endpoint",
            "credentials in the URL would be logged: send them in a header whose value comes from the environment (headers)".into(),
        ));
    }
    for (name, var) in &raw.headers {
        let key = format!("headers.{name}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(at(
                &key,
                "a header name is letters, digits, '-' or '_'".into(),
            ));
        }
        let is_variable = !var.is_empty()
            && !var.starts_with(|c: char| c.is_ascii_digit())
            && var
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !is_variable {
            return Err(at(
                &key,
                "expected the name of the environment variable that holds the value (A-Z, 0-9, '_'), never the value itself".into(),
            ));
        }
        if !env_is_set(var) {
            return Err(at(&key, format!("environment variable {var} is not set")));
        }
    }
    let service_name = raw.service_name.unwrap_or_else(|| "tributary".to_string());
    if service_name.trim().is_empty() {
        return Err(at("service_name", "must not be empty".into()));
    }
    let sampling_ratio = raw.sampling_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        return Err(at(
            "sampling_ratio",
            format!("must be between 0.0 and 1.0, got {sampling_ratio}"),
        ));
    }
    Ok(TelemetrySettings {
        endpoint,
        headers: raw.headers,
        service_name,
        sampling_ratio,
        include_user_id: raw.include_user_id,
    })
}
