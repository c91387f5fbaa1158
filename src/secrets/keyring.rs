//! The keys a process holds: the current one, which seals, and previous ones, which only
//! open what was sealed before a rotation.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::error::SecretsError;
use super::key::{SecretKey, KEY_ENV};
use super::sealed::{self, sealed_key_id, Binding};
use crate::config::SecretsSettings;

/// The name of the systemd credential (`LoadCredential=tributary-secrets-key:FILE`) read
/// from `$CREDENTIALS_DIRECTORY` when neither the variable nor `key_file` gives a key.
pub const CREDENTIAL_NAME: &str = "tributary-secrets-key";

/// Where the current key came from, for `secrets status` and the start-up log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    Environment,
    File(PathBuf),
    SystemdCredential(PathBuf),
    /// A key made for this process alone (the demo's, when none is configured).
    Ephemeral,
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Environment => write!(f, "${KEY_ENV}"),
            KeySource::File(path) => write!(f, "key_file {}", path.display()),
            KeySource::SystemdCredential(path) => {
                write!(f, "systemd credential {}", path.display())
            }
            KeySource::Ephemeral => write!(f, "an ephemeral key"),
        }
    }
}

/// The keys of this process, and whether secrets may be stored in clear without one.
#[derive(Debug, Default)]
pub struct Keyring {
    current: Option<(SecretKey, KeySource)>,
    previous: Vec<SecretKey>,
    allow_plaintext: bool,
}

impl Keyring {
    /// Writes a new key to `path` with mode 0600, refusing to overwrite a file; returns
    /// its id. A keyring loads it through `[secrets] key_file`.
    pub fn generate_key_file(path: &std::path::Path) -> Result<String, SecretsError> {
        super::key::generate_key_file(path)
    }

    /// No key at all: secrets can be read only if stored in clear, and none can be stored.
    pub fn none() -> Keyring {
        Keyring::default()
    }

    /// A keyring of one new random key that lives as long as the process: for a
    /// throwaway database (the demo's, the bench's, a test's) whose tokens are sealed as a
    /// deployment's would be.
    pub fn ephemeral() -> Keyring {
        Keyring::with_key(SecretKey::generate(), KeySource::Ephemeral)
    }

    /// Only `key`, as the current key.
    pub(crate) fn with_key(key: SecretKey, source: KeySource) -> Keyring {
        Keyring {
            current: Some((key, source)),
            ..Keyring::default()
        }
    }

    /// Reads the keys `[secrets]` and the environment name: the current key from
    /// `TRIBUTARY_SECRETS_KEY`, else `key_file`, else the systemd credential, and every
    /// previous key file. Any unreadable, too open or malformed key is an error.
    pub fn load(
        settings: &SecretsSettings,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Keyring, SecretsError> {
        let current = match (env(KEY_ENV), &settings.key_file) {
            (Some(text), _) if !text.trim().is_empty() => {
                let text = Zeroizing::new(text);
                Some((
                    SecretKey::from_base64(&text, KEY_ENV)?,
                    KeySource::Environment,
                ))
            }
            (_, Some(path)) => Some((SecretKey::from_file(path)?, KeySource::File(path.clone()))),
            _ => {
                match env("CREDENTIALS_DIRECTORY").map(|dir| Path::new(&dir).join(CREDENTIAL_NAME))
                {
                    Some(path) if path.exists() => Some((
                        SecretKey::from_file(&path)?,
                        KeySource::SystemdCredential(path),
                    )),
                    _ => None,
                }
            }
        };
        let previous = settings
            .previous_key_files
            .iter()
            .map(|path| SecretKey::from_file(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Keyring {
            current,
            previous,
            allow_plaintext: settings.allow_plaintext,
        })
    }

    /// The id of the key new secrets are sealed with, if there is one.
    pub fn current_key_id(&self) -> Option<&str> {
        self.current().map(|(id, _)| id)
    }

    /// The current key's id and where it came from.
    pub(crate) fn current(&self) -> Option<(&str, &KeySource)> {
        self.current
            .as_ref()
            .map(|(key, source)| (key.id(), source))
    }

    /// Whether `[secrets] allow_plaintext` lets secrets be stored in clear.
    pub fn allows_plaintext(&self) -> bool {
        self.allow_plaintext && self.current.is_none()
    }

    /// Whether [`Keyring::seal`] would store `what`: `Ok` with a key, or in clear when
    /// `allow_plaintext` is set.
    pub fn check_can_store(&self, what: &str) -> Result<(), SecretsError> {
        if self.current.is_some() || self.allow_plaintext {
            Ok(())
        } else {
            Err(SecretsError::NoKey {
                what: what.to_string(),
            })
        }
    }

    /// `plaintext` as it is stored for `binding`: sealed under the current key, or as it is
    /// when there is no key and `allow_plaintext` is set. `what` names it in the refusal.
    pub fn seal(
        &self,
        binding: Binding<'_>,
        plaintext: &str,
        what: &str,
    ) -> Result<String, SecretsError> {
        match &self.current {
            Some((key, _)) => sealed::seal(key, binding, plaintext.as_bytes()),
            None => {
                self.check_can_store(what)?;
                Ok(plaintext.to_string())
            }
        }
    }

    /// The text of a stored value: opened with the key it names when sealed, as it is
    /// when stored in clear.
    pub fn open(
        &self,
        binding: Binding<'_>,
        stored: &str,
    ) -> Result<Zeroizing<String>, SecretsError> {
        let Some(key_id) = sealed_key_id(stored) else {
            return Ok(Zeroizing::new(stored.to_string()));
        };
        let key = self.key(key_id).ok_or_else(|| SecretsError::UnknownKey {
            connection: binding.to_string(),
            key_id: key_id.to_string(),
            configured: self.describe_ids(),
        })?;
        let bytes = sealed::open(key, binding, stored)?;
        String::from_utf8(bytes.to_vec())
            .map(Zeroizing::new)
            .map_err(|_| SecretsError::Malformed {
                connection: binding.to_string(),
            })
    }

    /// Whether a stored value is sealed under the current key.
    pub fn is_current(&self, stored: &str) -> bool {
        match (&self.current, sealed_key_id(stored)) {
            (Some((key, _)), Some(id)) => key.id() == id,
            _ => false,
        }
    }

    /// Whether this keyring holds the key of id `key_id`.
    pub fn knows(&self, key_id: &str) -> bool {
        self.key(key_id).is_some()
    }

    fn key(&self, key_id: &str) -> Option<&SecretKey> {
        self.current
            .iter()
            .map(|(key, _)| key)
            .chain(self.previous.iter())
            .find(|key| key.id() == key_id)
    }

    /// The configured key ids, for messages: "none" when there are none.
    pub fn describe_ids(&self) -> String {
        let ids: Vec<&str> = self
            .current
            .iter()
            .map(|(key, _)| key.id())
            .chain(self.previous.iter().map(SecretKey::id))
            .collect();
        if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: Binding<'static> = Binding {
        user_id: "alice",
        provider: "strava",
    };
    const BOB: Binding<'static> = Binding {
        user_id: "bob",
        provider: "strava",
    };

    fn keyring() -> Keyring {
        Keyring::with_key(SecretKey::generate(), KeySource::Ephemeral)
    }

    #[test]
    fn a_sealed_secret_opens_for_its_row_and_names_its_key_but_not_the_secret() {
        let keys = keyring();
        let sealed = keys
            .seal(ALICE, "{\"token\":\"s3cret\"}", "a token")
            .unwrap();
        assert!(!sealed.contains("s3cret"));
        let (id, _) = keys.current().unwrap();
        assert_eq!(sealed_key_id(&sealed), Some(id));
        assert!(keys.is_current(&sealed));
        assert_eq!(
            keys.open(ALICE, &sealed).unwrap().as_str(),
            "{\"token\":\"s3cret\"}"
        );
        let again = keys
            .seal(ALICE, "{\"token\":\"s3cret\"}", "a token")
            .unwrap();
        assert_ne!(sealed, again, "every write has its own nonce");
    }

    #[test]
    fn a_sealed_secret_moved_to_another_row_fails_naming_that_connection() {
        let keys = keyring();
        let sealed = keys
            .seal(ALICE, "{\"token\":\"s3cret\"}", "a token")
            .unwrap();
        let error = keys.open(BOB, &sealed).unwrap_err().to_string();
        assert!(error.contains("bob@strava"), "{error}");
        assert!(!error.contains("s3cret"));
        let shifted = Binding {
            user_id: "alicestrava",
            provider: "",
        };
        assert!(keys.open(shifted, &sealed).is_err());
    }

    #[test]
    fn a_wrong_key_fails_naming_the_key_id_and_a_previous_key_still_opens() {
        let old = keyring();
        let sealed = old
            .seal(ALICE, "{\"token\":\"s3cret\"}", "a token")
            .unwrap();
        let error = keyring().open(ALICE, &sealed).unwrap_err().to_string();
        let (old_id, _) = old.current().unwrap();
        assert!(
            error.contains(old_id) && error.contains("alice@strava"),
            "{error}"
        );

        let dir = tempfile::tempdir().unwrap();
        let old_file = dir.path().join("old.key");
        let new_file = dir.path().join("new.key");
        let old_id = super::super::key::generate_key_file(&old_file).unwrap();
        super::super::key::generate_key_file(&new_file).unwrap();
        let before = Keyring::load(
            &SecretsSettings {
                key_file: Some(old_file.clone()),
                ..SecretsSettings::default()
            },
            &|_| None,
        )
        .unwrap();
        let sealed = before.seal(ALICE, "{}", "a token").unwrap();
        let during = Keyring::load(
            &SecretsSettings {
                key_file: Some(new_file),
                previous_key_files: vec![old_file],
                ..SecretsSettings::default()
            },
            &|_| None,
        )
        .unwrap();
        assert!(during.knows(&old_id) && !during.is_current(&sealed));
        assert_eq!(during.open(ALICE, &sealed).unwrap().as_str(), "{}");
    }

    #[test]
    fn tampering_with_any_part_of_a_sealed_secret_fails() {
        let keys = keyring();
        let sealed = keys
            .seal(ALICE, "{\"token\":\"s3cret\"}", "a token")
            .unwrap();
        let (head, body) = sealed.rsplit_once(':').unwrap();
        let mut bytes =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, body).unwrap();
        for index in [0, 12, bytes.len() - 1] {
            bytes[index] ^= 1;
            let tampered = format!(
                "{head}:{}",
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes)
            );
            assert!(keys.open(ALICE, &tampered).is_err(), "flipped byte {index}");
            bytes[index] ^= 1;
        }
        assert!(keys.open(ALICE, &format!("{head}:AAAA")).is_err());
        assert!(keys.open(ALICE, &format!("{head}:not base64")).is_err());
    }

    #[test]
    fn without_a_key_storing_is_refused_unless_plaintext_is_allowed() {
        let error = Keyring::none()
            .seal(ALICE, "{}", "the token of alice@strava")
            .unwrap_err();
        let message = error.to_string();
        assert!(message.contains("the token of alice@strava") && message.contains("generate-key"));
        let unsafe_keys = Keyring::load(
            &SecretsSettings {
                allow_plaintext: true,
                ..SecretsSettings::default()
            },
            &|_| None,
        )
        .unwrap();
        assert_eq!(unsafe_keys.seal(ALICE, "{}", "x").unwrap(), "{}");
        assert_eq!(Keyring::none().open(ALICE, "{}").unwrap().as_str(), "{}");
    }

    #[test]
    fn the_environment_wins_over_the_key_file_and_the_systemd_credential_comes_last() {
        let dir = tempfile::tempdir().unwrap();
        let credential = dir.path().join(CREDENTIAL_NAME);
        let from_credential = super::super::key::generate_key_file(&credential).unwrap();
        let directory = dir.path().display().to_string();
        let env = |name: &str| (name == "CREDENTIALS_DIRECTORY").then(|| directory.clone());
        let keys = Keyring::load(&SecretsSettings::default(), &env).unwrap();
        assert_eq!(keys.current().unwrap().0, from_credential);
        assert_eq!(
            keys.current().unwrap().1,
            &KeySource::SystemdCredential(credential)
        );

        let text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [1u8; 32]);
        let env = |name: &str| (name == KEY_ENV).then(|| text.clone());
        let settings = SecretsSettings {
            key_file: Some(dir.path().join("missing.key")),
            ..SecretsSettings::default()
        };
        let keys = Keyring::load(&settings, &env).unwrap();
        assert_eq!(keys.current().unwrap().1, &KeySource::Environment);
        let error = Keyring::load(&settings, &|_| None).unwrap_err().to_string();
        assert!(error.contains("missing.key"), "{error}");
    }
}
