//! `[operator]`: the read-only operator page (docs/decisions/operator-page.md), served on
//! its own listener beside the API's. Off when the table is absent.

use std::net::SocketAddr;

use serde::Deserialize;

/// `[operator]`.
#[derive(Clone, Debug)]
pub(crate) struct OperatorSettings {
    /// Where the page listens; loopback unless `public`, as a reverse proxy in front of
    /// the API would make every peer look local.
    pub listen: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOperatorSettings {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    #[serde(default)]
    public: bool,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7171))
}

/// Checks the table; errors are `(key, message)`.
pub(super) fn parse(raw: RawOperatorSettings) -> Result<OperatorSettings, (String, String)> {
    if !raw.listen.ip().is_loopback() && !raw.public {
        return Err((
            "operator.listen".to_string(),
            format!(
                "{} is not a loopback address: the page shows every connection's state, so reach it through an SSH tunnel to 127.0.0.1, or set public = true and serve it behind TLS",
                raw.listen
            ),
        ));
    }
    Ok(OperatorSettings { listen: raw.listen })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<OperatorSettings, (String, String)> {
        parse(toml::from_str(text).expect("TOML"))
    }

    #[test]
    fn loopback_is_the_default_and_another_address_needs_public() {
        assert_eq!(parsed("").expect("valid").listen, default_listen());
        let (key, message) = parsed("listen = \"0.0.0.0:7171\"").expect_err("refused");
        assert_eq!(key, "operator.listen");
        assert!(message.contains("public = true"), "{message}");
        let public = parsed("listen = \"0.0.0.0:7171\"\npublic = true").expect("valid");
        assert_eq!(public.listen.port(), 7171);
    }
}
