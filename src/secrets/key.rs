//! One 256-bit key: reading it (from a file, the environment or a systemd credential),
//! its id, and writing a new one.

use std::io::Write;
use std::path::Path;

use aes_gcm::aead::{KeyInit, OsRng};
use aes_gcm::Aes256Gcm;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::error::SecretsError;

/// The environment variable that holds the current key (base64), overriding `key_file`.
pub const KEY_ENV: &str = "TRIBUTARY_SECRETS_KEY";

/// What the key id is derived from besides the key, so the id is no hash of the key alone.
const KEY_ID_DOMAIN: &[u8] = b"tributary secrets key id v1\0";

/// A 256-bit AES key and its id.
pub struct SecretKey {
    bytes: Zeroizing<[u8; 32]>,
    id: String,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKey").field("id", &self.id).finish()
    }
}

impl SecretKey {
    /// A key from its base64 text (surrounding whitespace ignored); `origin` names where
    /// it came from in the error.
    pub fn from_base64(text: &str, origin: &str) -> Result<SecretKey, SecretsError> {
        let invalid = || SecretsError::KeyEncoding {
            origin: origin.to_string(),
        };
        let decoded = Zeroizing::new(STANDARD.decode(text.trim()).map_err(|_| invalid())?);
        let bytes: [u8; 32] = decoded.as_slice().try_into().map_err(|_| invalid())?;
        Ok(SecretKey::from_bytes(bytes))
    }

    /// Reads a key file, refusing one that group or others may read.
    pub fn from_file(path: &Path) -> Result<SecretKey, SecretsError> {
        use std::os::unix::fs::PermissionsExt;
        let read_failed = |source| SecretsError::ReadKey {
            path: path.to_path_buf(),
            source,
        };
        let mode = std::fs::metadata(path)
            .map_err(read_failed)?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretsError::KeyFileMode {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(read_failed)?);
        SecretKey::from_base64(&text, &format!("key file {}", path.display()))
    }

    /// A new random key.
    pub fn generate() -> SecretKey {
        SecretKey::from_bytes(Aes256Gcm::generate_key(OsRng).into())
    }

    fn from_bytes(bytes: [u8; 32]) -> SecretKey {
        let bytes = Zeroizing::new(bytes);
        let digest = Sha256::new()
            .chain_update(KEY_ID_DOMAIN)
            .chain_update(bytes.as_slice())
            .finalize();
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        SecretKey { bytes, id }
    }

    /// The key's id: 16 hex digits of a SHA-256 over a fixed prefix and the key. It names
    /// the key in sealed secrets and in messages, and tells nothing about the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(self.bytes.as_slice().into())
    }

    fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(self.bytes.as_slice()))
    }
}

/// Writes a new key to `path` with mode 0600, refusing to overwrite a file; returns its id.
pub(crate) fn generate_key_file(path: &Path) -> Result<String, SecretsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| SecretsError::WriteKey {
        path: path.to_path_buf(),
        source,
    };
    let key = SecretKey::generate();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(failed)?;
    let mut line = key.to_base64();
    line.push('\n');
    file.write_all(line.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    Ok(key.id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_generated_key_file_is_private_reads_back_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let id = generate_key_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(SecretKey::from_file(&path).unwrap().id(), id);
        let before = std::fs::read(&path).unwrap();
        let again = generate_key_file(&path).unwrap_err().to_string();
        assert!(again.contains("secrets.key"), "{again}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_key_file_others_may_read_is_refused_with_the_chmod_that_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        generate_key_file(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = SecretKey::from_file(&path).unwrap_err().to_string();
        assert!(
            error.contains(&format!("chmod 600 {}", path.display())),
            "{error}"
        );
        assert!(error.contains("644"), "{error}");
    }

    #[test]
    fn keys_of_the_wrong_length_or_encoding_are_refused_naming_where_they_came_from() {
        for text in [
            "",
            "not base64!",
            &STANDARD.encode([7u8; 16]),
            &STANDARD.encode([7u8; 33]),
        ] {
            let error = SecretKey::from_base64(text, "TRIBUTARY_SECRETS_KEY")
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("TRIBUTARY_SECRETS_KEY") && error.contains("32 bytes"),
                "{error}"
            );
        }
        let key =
            SecretKey::from_base64(&format!(" {}\n", STANDARD.encode([7u8; 32])), "x").unwrap();
        assert_eq!(key.id().len(), 16);
        assert!(!key.id().contains(&hex_of(&[7u8; 8])));
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
