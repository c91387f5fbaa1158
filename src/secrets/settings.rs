//! `[secrets]` in config.toml.

use std::path::PathBuf;

use serde::Deserialize;

/// `[secrets]`: where the key that encrypts stored credentials comes from.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsSettings {
    /// The current key: a file holding 32 random bytes in base64 (mode 0600). New and
    /// rotated secrets are sealed with it. `TRIBUTARY_SECRETS_KEY` overrides it.
    pub key_file: Option<PathBuf>,
    /// Keys that still open secrets sealed before a rotation; `tributary secrets rotate`
    /// re-seals those under the current key.
    pub previous_key_files: Vec<PathBuf>,
    /// Unsafe: store literal secrets in clear when no key is configured. Warned about at
    /// every start.
    pub allow_plaintext: bool,
}
