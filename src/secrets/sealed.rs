//! The sealed form of a stored secret: `sealed:v1:<key id>:<base64 of nonce and ciphertext>`.
//!
//! The associated data is the format version and the row's (user_id, provider), each
//! length-prefixed so no two bindings produce the same bytes: a sealed text moved onto
//! another row fails authentication instead of opening as that row's secret.

use aes_gcm::aead::{Aead, AeadCore, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use zeroize::Zeroizing;

use super::error::SecretsError;
use super::key::SecretKey;

/// What every sealed text starts with; the version is also in the associated data.
const PREFIX: &str = "sealed:v1:";
/// The first bytes of the associated data.
const AAD_DOMAIN: &[u8] = b"tributary sealed v1\0";
/// AES-GCM's nonce length.
const NONCE_LEN: usize = 12;

/// The row a secret belongs to: its associated data, and its name in messages.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    pub user_id: &'a str,
    pub provider: &'a str,
}

impl std::fmt::Display for Binding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.user_id, self.provider)
    }
}

impl Binding<'_> {
    fn associated_data(&self) -> Vec<u8> {
        let mut aad = AAD_DOMAIN.to_vec();
        for part in [self.user_id, self.provider] {
            // Both are bounded by their columns (255 and 64 bytes), far below u32.
            let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
            aad.extend_from_slice(&len.to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        aad
    }
}

/// What a text sealed with `key_id` starts with (`sealed:v1:` for any key when `None`).
pub fn sealed_prefix(key_id: Option<&str>) -> String {
    match key_id {
        Some(id) => format!("{PREFIX}{id}:"),
        None => PREFIX.to_string(),
    }
}

/// The key id a stored text was sealed with, or `None` when it is not sealed (clear).
pub fn sealed_key_id(stored: &str) -> Option<&str> {
    let rest = stored.strip_prefix(PREFIX)?;
    Some(rest.split_once(':').map_or(rest, |(id, _)| id))
}

/// Seals `plaintext` for `binding` under `key`, with a fresh random nonce.
pub(super) fn seal(
    key: &SecretKey,
    binding: Binding<'_>,
    plaintext: &[u8],
) -> Result<String, SecretsError> {
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = binding.associated_data();
    let payload = Payload {
        msg: plaintext,
        aad: &aad,
    };
    // GCM refuses only messages beyond its 64 GiB bound.
    let ciphertext = key
        .cipher()
        .encrypt(&nonce, payload)
        .map_err(|_| SecretsError::Encrypt {
            connection: binding.to_string(),
        })?;
    let mut body = nonce.to_vec();
    body.extend_from_slice(&ciphertext);
    Ok(format!("{PREFIX}{}:{}", key.id(), STANDARD.encode(body)))
}

/// Opens a sealed text with `key`, which must be the key its id names.
pub(super) fn open(
    key: &SecretKey,
    binding: Binding<'_>,
    stored: &str,
) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
    let malformed = || SecretsError::Malformed {
        connection: binding.to_string(),
    };
    let encoded = stored
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, body)| body)
        .ok_or_else(malformed)?;
    let body = STANDARD.decode(encoded).map_err(|_| malformed())?;
    if body.len() < NONCE_LEN {
        return Err(malformed());
    }
    let (nonce, ciphertext) = body.split_at(NONCE_LEN);
    let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| malformed())?;
    let aad = binding.associated_data();
    let payload = Payload {
        msg: ciphertext,
        aad: &aad,
    };
    key.cipher()
        .decrypt(&Nonce::from(nonce), payload)
        .map(Zeroizing::new)
        .map_err(|_| SecretsError::Decrypt {
            connection: binding.to_string(),
            key_id: key.id().to_string(),
        })
}
