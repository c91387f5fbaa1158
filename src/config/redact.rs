//! URLs made safe to show: passwords and secret query values hidden.

/// A database URL for messages and logs: the userinfo password and every query parameter
/// that holds a secret (`password`, `sslpassword`, anything named like a key or token)
/// replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "(unparseable URL)".to_string();
    };
    if parsed.password().is_some() {
        // Setting a password only fails for URLs that cannot have one.
        let _ = parsed.set_password(Some("***"));
    }
    tributary_providers::http::hide_query_values(
        &mut parsed,
        "***",
        tributary_providers::http::is_secret_param,
    );
    parsed.to_string()
}
