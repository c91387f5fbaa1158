//! What can go wrong with a key or a sealed secret, shared by every file of `secrets`.

use std::path::PathBuf;

/// How to configure a key, for the messages that refuse to store a secret without one.
pub(crate) const HOW_TO_CONFIGURE: &str = "generate a key with `tributary secrets generate-key --out /etc/tributary/secrets.key` and name it in config.toml ([secrets] key_file = \"/etc/tributary/secrets.key\"), or put it in the TRIBUTARY_SECRETS_KEY environment variable or a systemd credential named tributary-secrets-key; or keep the secret in an environment variable (token_env)";

/// A problem with a key or a sealed secret. Messages never contain a key or a secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("cannot read the secrets key file {path}: {source}")]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the secrets key file {path} is readable by group or others (mode {mode:03o}); run `chmod 600 {path}`", path = path.display())]
    KeyFileMode { path: PathBuf, mode: u32 },
    #[error("the secrets key from {origin} is not valid: expected 32 bytes in base64 (44 characters), as `tributary secrets generate-key` writes")]
    KeyEncoding { origin: String },
    #[error("cannot write the key file {path}: {source}")]
    WriteKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} would be stored in the database in clear, and no secrets key is configured: {HOW_TO_CONFIGURE}")]
    NoKey { what: String },
    #[error("the stored credentials of {connection} were sealed with key id {key_id}, which is not configured (configured: {configured}); configure that key as key_file or in previous_key_files")]
    UnknownKey {
        connection: String,
        key_id: String,
        configured: String,
    },
    #[error("the stored credentials of {connection} cannot be decrypted with key id {key_id}: they were sealed for another connection, or altered")]
    Decrypt { connection: String, key_id: String },
    #[error("the credentials of {connection} cannot be sealed")]
    Encrypt { connection: String },
    #[error("the stored credentials of {connection} are not in the sealed form tributary writes")]
    Malformed { connection: String },
}
