//! Shopify's authorization code grant, which runs per shop
//! (docs/decisions/connect-shopify.md): the user names the shop, the browser consents at
//! `https://{shop}/admin/oauth/authorize`, the callback is signed by Shopify with the
//! app's client secret (`hmac`), and the code is exchanged at
//! `https://{shop}/admin/oauth/access_token`. No PKCE.
//!
//! The shop is the host the client secret is sent to, so [`Shop::parse`] takes nothing but
//! a `*.myshopify.com` name, and nothing in this module takes another host: there is no
//! switch that widens it.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use sha2::Sha256;
use url::Url;

use crate::authorize::{granted, Exchanged};
use crate::http::HttpClient;
use crate::oauth2::TokenEndpointPolicy;
use crate::FetchError;

/// The domain every shop's own host ends with.
const SHOP_SUFFIX: &str = ".myshopify.com";
/// The longest shop name: one DNS label.
const MAX_SHOP_NAME_BYTES: usize = 63;
/// The callback parameter that carries Shopify's signature.
const HMAC_PARAM: &str = "hmac";

/// A shop's own domain, `NAME.myshopify.com`, lower-cased: the only host the flow sends a
/// browser, a code or the client secret to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shop {
    domain: String,
    origin: Url,
}

impl Shop {
    /// The shop a user typed: `^[a-z0-9][a-z0-9-]*\.myshopify\.com$` once trimmed and
    /// lower-cased. Anything else (another domain, a scheme, a path, a port) is refused
    /// with a message saying what to type.
    pub fn parse(input: &str) -> Result<Shop, String> {
        let domain = input.trim().to_ascii_lowercase();
        let refused = || {
            format!(
                "{:?} is not a shop's address; type it as NAME.myshopify.com",
                crate::quote::truncated(input.trim(), 64)
            )
        };
        let name = domain.strip_suffix(SHOP_SUFFIX).ok_or_else(refused)?;
        let valid = name
            .bytes()
            .next()
            .is_some_and(|first| first.is_ascii_alphanumeric())
            && name.len() <= MAX_SHOP_NAME_BYTES
            && name
                .bytes()
                .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
        if !valid {
            return Err(refused());
        }
        let origin = Url::parse(&format!("https://{domain}/")).map_err(|_| refused())?;
        Ok(Shop { domain, origin })
    }

    /// The domain, e.g. `example.myshopify.com`.
    pub fn as_str(&self) -> &str {
        &self.domain
    }

    /// `https://{shop}/`: the base of the shop's Admin API.
    pub fn origin(&self) -> &Url {
        &self.origin
    }

    /// `path` on the shop.
    fn url(&self, path: &str) -> Url {
        let mut url = self.origin.clone();
        url.set_path(path);
        url
    }
}

/// A Shopify app, as the authorization code grant needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShopifyApp {
    /// The app's client id (Shopify's "API key").
    pub client_id: String,
    /// The environment variable that holds the client secret, which also signs callbacks.
    pub client_secret_env: String,
    /// Comma-separated access scopes, e.g. `read_orders`.
    pub scope: String,
}

impl ShopifyApp {
    /// `https://{shop}/admin/oauth/authorize` with `client_id`, `scope`, `redirect_uri` and
    /// `state`.
    pub fn authorization_url(&self, shop: &Shop, redirect_uri: &str, state: &str) -> Url {
        let mut url = shop.url("/admin/oauth/authorize");
        url.query_pairs_mut()
            .append_pair("client_id", &self.client_id)
            .append_pair("scope", &self.scope)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("state", state);
        url
    }

    /// Whether Shopify signed the callback's `query` with the client secret.
    pub fn callback_is_signed(&self, query: &str) -> Result<bool, FetchError> {
        let secret = self.client_secret()?;
        Ok(signed_by(query, secret.expose_secret().as_bytes()))
    }

    /// Exchanges `code` once at `https://{shop}/admin/oauth/access_token` (`client_id`,
    /// `client_secret`, `code`). The connection's account is the shop. No secret is in an
    /// error.
    pub async fn exchange_code(
        &self,
        client: &HttpClient,
        shop: &Shop,
        code: &SecretString,
    ) -> Result<Exchanged, FetchError> {
        let secret = self.client_secret()?;
        let form = [
            ("client_id", self.client_id.as_str()),
            ("client_secret", secret.expose_secret()),
            ("code", code.expose_secret()),
        ];
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let policy = TokenEndpointPolicy { what: "the code" };
        let result = client
            .post_form_with(
                shop.url("/admin/oauth/access_token"),
                headers,
                &form,
                &policy,
            )
            .await
            .and_then(|response| {
                let body = response.value();
                read_answer(shop, (&response.url, response.status, &body), Utc::now())
            });
        let secrets = [secret.expose_secret(), code.expose_secret()];
        result.map_err(|error| error.redact_secrets(secrets))
    }

    fn client_secret(&self) -> Result<SecretString, FetchError> {
        crate::oauth2::client_secret_from_env(
            "client_secret_env",
            Some(self.client_secret_env.as_str()),
        )?
        .ok_or_else(|| FetchError::Client {
            message: "client_secret_env names no variable".to_string(),
        })
    }
}

/// The token endpoint's answer (`access_token`, `scope`, and for expiring offline tokens
/// `expires_in` and `refresh_token`) as the shop's credentials.
fn read_answer(
    shop: &Shop,
    response: (&Url, u16, &Value),
    now: DateTime<Utc>,
) -> Result<Exchanged, FetchError> {
    let (url, status, body) = response;
    Ok(Exchanged {
        credentials: granted(url, status, body, now)?,
        account_id: Some(shop.as_str().to_string()),
    })
}

/// Whether `query` carries one `hmac` that is HMAC-SHA256, keyed by `secret`, of its other
/// parameters sorted by name and written `name=value` joined by `&` (each escaped as
/// Shopify's libraries escape a query), in lowercase or uppercase hex. Compared in constant
/// time; a repeated parameter makes the message ambiguous and is refused.
pub fn signed_by(query: &str, secret: &[u8]) -> bool {
    let mut signature = None;
    let mut others: Vec<(String, String)> = Vec::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if name == HMAC_PARAM {
            if signature.replace(value.into_owned()).is_some() {
                return false;
            }
            continue;
        }
        if others.iter().any(|(seen, _)| *seen == name) {
            return false;
        }
        others.push((name.into_owned(), value.into_owned()));
    }
    let Some(signature) = signature.as_deref().and_then(hex_bytes) else {
        return false;
    };
    others.sort();
    let message = others
        .iter()
        .map(|(name, value)| format!("{}={}", escape(name), escape(value)))
        .collect::<Vec<_>>()
        .join("&");
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(message.as_bytes());
    mac.verify_slice(&signature).is_ok()
}

/// `text` percent-encoded as Node's `querystring.escape` does (which Shopify's libraries
/// sign with): all but `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => escaped.push(char::from(byte)),
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')' => {
                escaped.push(char::from(byte))
            }
            other => escaped.push_str(&format!("%{other:02X}")),
        }
    }
    escaped
}

/// 32 bytes from 64 hex digits, else `None`.
fn hex_bytes(text: &str) -> Option<[u8; 32]> {
    let digits = text.as_bytes();
    // `from_str_radix` alone would take a sign.
    if digits.len() != 64 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The access token an exchange gave.
    fn token_of(exchanged: &Exchanged) -> Option<String> {
        let token = exchanged.credentials.token.as_ref()?;
        Some(token.expose_secret().to_string())
    }

    /// Shopify's documented example: the secret `hush` and this callback.
    const DOCUMENTED: &str = "code=0907a61c0c8d55e99db179b68161bc00&hmac=700e2dadb827fcc8609e9d5ce208b2e9cdaab9df07390d2cbca10d7c328fc4bf&shop=some-shop.myshopify.com&state=0.6784241404160823&timestamp=1337178173";

    #[test]
    fn a_shop_is_a_myshopify_domain_lower_cased_and_nothing_else() {
        for (typed, shop) in [
            ("example.myshopify.com", "example.myshopify.com"),
            (
                "  Example-Shop2.MyShopify.com ",
                "example-shop2.myshopify.com",
            ),
            ("0shop.myshopify.com", "0shop.myshopify.com"),
        ] {
            assert_eq!(
                Shop::parse(typed).map(|shop| shop.domain),
                Ok(shop.to_string())
            );
        }
        let long = format!("{}.myshopify.com", "a".repeat(64));
        for typed in [
            "",
            ".myshopify.com",
            "-shop.myshopify.com",
            "shop_1.myshopify.com",
            "a.b.myshopify.com",
            "evil.com",
            "myshopify.com",
            "shop.myshopify.com.evil.com",
            "evil.com/.myshopify.com",
            "evil.com?.myshopify.com",
            "evil.com#.myshopify.com",
            "user@shop.myshopify.com",
            "shop.myshopify.com:8443",
            "https://shop.myshopify.com",
            "shop.myshopify.com/",
            "127.0.0.1",
            long.as_str(),
        ] {
            let refused = Shop::parse(typed).expect_err(typed);
            assert!(refused.contains("NAME.myshopify.com"), "{refused}");
        }
        let shop = Shop::parse("example.myshopify.com").expect("a shop");
        assert_eq!(shop.origin().as_str(), "https://example.myshopify.com/");
    }

    #[test]
    fn the_documented_callback_is_signed_and_any_change_to_it_is_not() {
        assert!(signed_by(DOCUMENTED, b"hush"));
        // The parameters' order in the query does not matter: they are sorted.
        let reordered = "timestamp=1337178173&state=0.6784241404160823&hmac=700e2dadb827fcc8609e9d5ce208b2e9cdaab9df07390d2cbca10d7c328fc4bf&shop=some-shop.myshopify.com&code=0907a61c0c8d55e99db179b68161bc00";
        assert!(signed_by(reordered, b"hush"));
        let upper = DOCUMENTED.replace(
            "700e2dadb827fcc8609e9d5ce208b2e9cdaab9df07390d2cbca10d7c328fc4bf",
            "700E2DADB827FCC8609E9D5CE208B2E9CDAAB9DF07390D2CBCA10D7C328FC4BF",
        );
        assert!(signed_by(&upper, b"hush"));
        assert!(!signed_by(DOCUMENTED, b"another secret"));
        for tampered in [
            DOCUMENTED.replace("some-shop", "evil-shop"),
            DOCUMENTED.replace("state=0.67", "state=0.66"),
            DOCUMENTED.replace("timestamp=1337178173", "timestamp=1337178174"),
            format!("{DOCUMENTED}&host=YWRtaW4uc2hvcGlmeS5jb20"),
            DOCUMENTED.replace("&hmac=700e2dadb827fcc8609e9d5ce208b2e9cdaab9df07390d2cbca10d7c328fc4bf", ""),
            DOCUMENTED.replace("4bf&", "4b&"),
            DOCUMENTED.replace("4bf&", "4bz&"),
            DOCUMENTED.replace("hmac=70", "hmac=+0"),
            format!("{DOCUMENTED}&hmac=700e2dadb827fcc8609e9d5ce208b2e9cdaab9df07390d2cbca10d7c328fc4bf"),
            format!("{DOCUMENTED}&code=0907a61c0c8d55e99db179b68161bc00"),
        ] {
            assert!(!signed_by(&tampered, b"hush"), "{tampered}");
        }
    }

    #[test]
    fn parameters_are_escaped_as_shopifys_libraries_sign_them() {
        assert_eq!(escape("a b&c=d/é~*'()!"), "a%20b%26c%3Dd%2F%C3%A9~*'()!");
        // A signature over the escaped message, as Shopify's Node library computes it.
        let query = "host=YWRt%2Fx%3D&shop=a.myshopify.com";
        let mut mac = Hmac::<Sha256>::new_from_slice(b"hush").expect("a key");
        mac.update(b"host=YWRt%2Fx%3D&shop=a.myshopify.com");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert!(signed_by(&format!("{query}&hmac={hex}"), b"hush"));
    }

    #[test]
    fn the_authorization_url_is_on_the_shop_with_the_documented_parameters() {
        let app = ShopifyApp {
            client_id: "api-key-1".to_string(),
            client_secret_env: "UNUSED".to_string(),
            scope: "read_orders".to_string(),
        };
        let shop = Shop::parse("test-shop.myshopify.com").expect("a shop");
        let url = app.authorization_url(&shop, "https://sync.example/connect/callback", "s1");
        assert_eq!(
            url.as_str(),
            "https://test-shop.myshopify.com/admin/oauth/authorize?client_id=api-key-1&scope=read_orders&redirect_uri=https%3A%2F%2Fsync.example%2Fconnect%2Fcallback&state=s1"
        );
    }

    #[test]
    fn an_answer_gives_the_token_and_the_shop_as_the_account() {
        let shop = Shop::parse("test-shop.myshopify.com").expect("a shop");
        let url = shop.url("/admin/oauth/access_token");
        let now = Utc::now();
        // The documented answer of an offline token: no expiry.
        let body = serde_json::json!({"access_token": "f85632530bf277ec9ac6f649fc327f17", "scope": "write_orders,read_customers"});
        let exchanged = read_answer(&shop, (&url, 200, &body), now).expect("tokens");
        assert_eq!(
            token_of(&exchanged).as_deref(),
            Some("f85632530bf277ec9ac6f649fc327f17")
        );
        assert_eq!(exchanged.credentials.expires_at, None);
        assert_eq!(
            exchanged.account_id.as_deref(),
            Some("test-shop.myshopify.com")
        );
        let refused = serde_json::json!({"error": "invalid_request", "error_description": "The authorization code was not found or was already used"});
        let error = read_answer(&shop, (&url, 400, &refused), now).expect_err("refused");
        assert!(error.to_string().contains("invalid_request"), "{error}");
    }

    /// The shop the exchange test emulates.
    const TEST_SHOP: &str = "test-shop.myshopify.com";

    /// Reads one HTTP/1.1 request (head and `content-length` body) from `stream`.
    async fn read_request(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
        use tokio::io::AsyncReadExt;
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let read = stream.read(&mut chunk).await.expect("a request");
            received.extend_from_slice(&chunk[..read]);
            let text = String::from_utf8_lossy(&received).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= length || read == 0 {
                    return text;
                }
            }
            assert!(read > 0, "the connection closed mid-request");
        }
    }

    /// An emulated shop on a loopback port, over TLS with a certificate for `TEST_SHOP`:
    /// it answers one request with `answer` (JSON, `status`). Returns its address, the
    /// certificate (PEM) and the request it received.
    async fn emulated_shop(
        status: u16,
        answer: &'static str,
    ) -> (
        std::net::SocketAddr,
        String,
        tokio::task::JoinHandle<String>,
    ) {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        use tokio::io::AsyncWriteExt;
        let identity =
            rcgen::generate_simple_self_signed(vec![TEST_SHOP.to_string()]).expect("a certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            identity.signing_key.serialize_der(),
        ));
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![identity.cert.der().clone()], key)
            .expect("the certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bound");
        let address = listener.local_addr().expect("address");
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("a connection");
            let mut tls = acceptor.accept(tcp).await.expect("a TLS handshake");
            let request = read_request(&mut tls).await;
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
            tls.write_all(response.as_bytes()).await.expect("answered");
            let _ = tls.shutdown().await;
            request
        });
        (address, identity.cert.pem(), served)
    }

    /// The app's client, sending `TEST_SHOP` to `address` and trusting `certificate` alone.
    fn client_to(address: std::net::SocketAddr, certificate: &str) -> HttpClient {
        let trusted = reqwest::Certificate::from_pem(certificate.as_bytes()).expect("PEM");
        let client = reqwest::Client::builder()
            .resolve(TEST_SHOP, address)
            .tls_certs_only([trusted])
            .build()
            .expect("a client");
        let settings = crate::HttpSettings {
            max_retries: 0,
            ..crate::HttpSettings::default()
        };
        HttpClient::new(settings)
            .expect("a client")
            .with_reqwest(client)
    }

    /// An app whose client secret is in a variable cargo always sets.
    fn app() -> ShopifyApp {
        ShopifyApp {
            client_id: "api-key-1".to_string(),
            client_secret_env: "CARGO_PKG_NAME".to_string(),
            scope: "read_orders".to_string(),
        }
    }

    /// The code exchanged with an emulated shop answering `status` and `answer`: the
    /// outcome and the request the shop received.
    async fn exchange_with(
        status: u16,
        answer: &'static str,
    ) -> (Result<Exchanged, FetchError>, String) {
        let (address, certificate, served) = emulated_shop(status, answer).await;
        let shop = Shop::parse(TEST_SHOP).expect("a shop");
        let code = SecretString::from(CODE);
        let exchanged = app()
            .exchange_code(&client_to(address, &certificate), &shop, &code)
            .await;
        let request = tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .unwrap_or_else(|_| panic!("the shop received no request: {exchanged:?}"))
            .expect("the request");
        (exchanged, request)
    }

    const CODE: &str = "0907a61c0c8d55e99db179b68161bc00";

    #[tokio::test]
    async fn the_code_is_exchanged_on_the_shops_own_host_over_tls() {
        let (exchanged, request) = exchange_with(
            200,
            r#"{"access_token":"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","scope":"read_orders"}"#,
        )
        .await;
        let exchanged = exchanged.expect("exchanged");
        assert_eq!(
            token_of(&exchanged).as_deref(),
            Some("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")
        );
        assert_eq!(exchanged.account_id.as_deref(), Some(TEST_SHOP));
        let (head, body) = request.split_once("\r\n\r\n").expect("a request");
        assert!(
            head.starts_with("POST /admin/oauth/access_token HTTP/1.1"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("host: {TEST_SHOP}")),
            "{head}"
        );
        let mut fields: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        fields.sort();
        let expected = [
            ("client_id", "api-key-1"),
            ("client_secret", env!("CARGO_PKG_NAME")),
            ("code", CODE),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        assert_eq!(fields, expected);
    }

    #[tokio::test]
    async fn a_refused_code_is_an_error_that_quotes_no_secret() {
        let (exchanged, _) = exchange_with(
            400,
            r#"{"error":"invalid_request","error_description":"The authorization code was not found or was already used"}"#,
        )
        .await;
        let message = exchanged.expect_err("refused").to_string();
        assert!(!message.contains(CODE), "{message}");
        assert!(!message.contains(env!("CARGO_PKG_NAME")), "{message}");
    }
}
