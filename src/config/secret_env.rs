//! Secrets read from environment variables.

use secrecy::SecretString;

/// The secret in the variable `name`. The error names the variable and what is wrong
/// with it, never its value.
pub(crate) fn secret_from_env(name: &str) -> Result<SecretString, String> {
    std::env::var(name)
        .map(SecretString::from)
        .map_err(|error| match error {
            std::env::VarError::NotPresent => format!("environment variable {name} is not set"),
            std::env::VarError::NotUnicode(_) => {
                format!("environment variable {name} is not valid UTF-8")
            }
        })
}
