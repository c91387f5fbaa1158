//! Secrets at rest: the keys that encrypt stored credentials, and the sealed form they
//! are stored in.
//!
//! A stored secret is sealed with AES-256-GCM under the current key, with a fresh random
//! nonce for every write, and bound to its row: the associated data is the format
//! version and the connection's (user_id, provider), so a ciphertext copied onto another
//! row fails to open. The sealed text names the key by an id derived from it
//! ([`key::SecretKey::id`]), so several keys can be read during a rotation. This module
//! knows nothing of the database; `credentials` seals the column and
//! `connections::sealing` rewrites rows.

mod error;
mod key;
mod keyring;
mod sealed;

pub(crate) use error::SecretsError;
pub(crate) use error::HOW_TO_CONFIGURE;
pub use keyring::Keyring;
pub(crate) use sealed::Binding;
pub(crate) use sealed::{sealed_key_id, sealed_prefix};
