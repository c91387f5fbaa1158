//! `[api] tls_cert` and `tls_key`: the API's own TLS. Read when the daemon or
//! `check-config` starts, so that a missing, malformed or mismatched file stops it before
//! anything is served.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use zeroize::Zeroizing;

/// The two files, resolved against config.toml's folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// PEM: the server's certificate first, then its chain.
    pub cert: PathBuf,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Both keys or neither; a relative path is taken from `config_dir`. Errors are
/// `(key, message)`.
pub(super) fn files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    config_dir: &Path,
) -> Result<Option<TlsFiles>, (String, String)> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert: config_dir.join(cert),
            key: config_dir.join(key),
        })),
        (Some(_), None) => Err((
            "api.tls_key".to_string(),
            "missing: tls_cert and tls_key go together (the PEM private key of tls_cert's certificate)".to_string(),
        )),
        (None, Some(_)) => Err((
            "api.tls_cert".to_string(),
            "missing: tls_cert and tls_key go together (the PEM certificate chain of tls_key's key)".to_string(),
        )),
    }
}

/// The TLS server's configuration from the two files: TLS 1.2 and 1.3, HTTP/1.1, on the
/// aws-lc-rs provider. Errors are `(key, message)`, the message naming the file.
pub(super) fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, (String, String)> {
    let cert_error = |message: String| ("api.tls_cert".to_string(), message);
    let key_error = |message: String| ("api.tls_key".to_string(), message);
    let cert_text = std::fs::read(&files.cert)
        .map_err(|error| cert_error(format!("cannot read {}: {error}", files.cert.display())))?;
    let chain = CertificateDer::pem_slice_iter(&cert_text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| cert_error(pem_problem(&files.cert, &error)))?;
    if chain.is_empty() {
        return Err(cert_error(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            files.cert.display()
        )));
    }
    let key_text = Zeroizing::new(
        std::fs::read(&files.key)
            .map_err(|error| key_error(format!("cannot read {}: {error}", files.key.display())))?,
    );
    let key = PrivateKeyDer::from_pem_slice(&key_text).map_err(|error| match error {
        pem::Error::NoItemsFound => key_error(format!(
            "{} holds no PEM private key (-----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
            files.key.display()
        )),
        error => key_error(pem_problem(&files.key, &error)),
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| cert_error(format!("no TLS version to offer: {error}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| match error {
            rustls::Error::InconsistentKeys(_) => key_error(format!(
                "{} is not the private key of the certificate in {}",
                files.key.display(),
                files.cert.display()
            )),
            error => key_error(format!(
                "{} and {} do not make a TLS identity: {error}",
                files.cert.display(),
                files.key.display()
            )),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What is wrong with a PEM file, without quoting it (the key's file holds a secret).
fn pem_problem(path: &Path, error: &pem::Error) -> String {
    let what = match error {
        pem::Error::MissingSectionEnd { .. } => "a section has no -----END line",
        pem::Error::IllegalSectionStart { .. } => "a -----BEGIN line is malformed",
        pem::Error::Base64Decode(_) => "a section is not valid base64",
        pem::Error::SectionTooLarge => "a section is larger than 256 MB",
        pem::Error::NoItemsFound => "nothing of the expected kind",
        _ => "it cannot be read",
    };
    format!("{} is not valid PEM: {what}", path.display())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{files, server_config};

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("written");
        path
    }

    #[test]
    fn a_relative_path_is_taken_from_the_config_folder_and_one_key_alone_is_refused() {
        let dir = Path::new("/etc/tributary");
        let both = files(Some("cert.pem".into()), Some("/keys/key.pem".into()), dir)
            .expect("valid")
            .expect("on");
        assert_eq!(both.cert, Path::new("/etc/tributary/cert.pem"));
        assert_eq!(both.key, Path::new("/keys/key.pem"));
        assert_eq!(files(None, None, dir), Ok(None));
        let (key, message) = files(Some("c.pem".into()), None, dir).expect_err("alone");
        assert_eq!(key, "api.tls_key");
        assert!(message.contains("missing"), "{message}");
        let (key, _) = files(None, Some("k.pem".into()), dir).expect_err("alone");
        assert_eq!(key, "api.tls_cert");
    }

    #[test]
    fn a_matching_pair_loads_and_every_bad_file_is_named_with_its_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("one");
        let other =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("other");
        let cert = write(dir.path(), "cert.pem", &one.cert.pem());
        let key = write(dir.path(), "key.pem", &one.signing_key.serialize_pem());
        let other_key = write(dir.path(), "other.pem", &other.signing_key.serialize_pem());
        let garbage = write(dir.path(), "garbage.pem", "not a certificate\n");
        let broken = write(
            dir.path(),
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        );
        let missing = dir.path().join("missing.pem");
        let load = |cert: &Path, key: &Path| {
            server_config(&super::TlsFiles {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
            })
        };

        let config = load(&cert, &key).expect("a matching pair");
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);

        let secret = one.signing_key.serialize_pem();
        for (cert, key, field, file) in [
            (&missing, &key, "api.tls_cert", &missing),
            (&garbage, &key, "api.tls_cert", &garbage),
            (&broken, &key, "api.tls_cert", &broken),
            (&cert, &missing, "api.tls_key", &missing),
            (&cert, &garbage, "api.tls_key", &garbage),
            (&cert, &cert, "api.tls_key", &cert),
            (&cert, &other_key, "api.tls_key", &other_key),
        ] {
            let (named, message) = load(cert, key).expect_err("refused");
            assert_eq!(named, field, "{message}");
            assert!(
                message.contains(&file.display().to_string()),
                "{field}: {message}"
            );
            assert!(!message.contains(secret.trim()), "{message}");
        }
        let (_, message) = load(&cert, &other_key).expect_err("mismatch");
        assert!(message.contains("is not the private key"), "{message}");
    }
}
