//! Each scheme against published or independently computed (Python's `hmac`) vectors: the
//! good signature passes; a tampered byte, a wrong secret and a stale timestamp do not.

use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::SecretString;

use super::{verify, Headers, Refusal};
use crate::config::{HmacAlgorithm, HmacScheme, SignatureEncoding, WebhookScheme};

fn secrets(values: &[&str]) -> Vec<SecretString> {
    values
        .iter()
        .map(|v| SecretString::from(v.to_string()))
        .collect()
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
        .collect()
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(seconds, 0).expect("a time")
}

const GITHUB_SIGNATURE: &str =
    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

/// GitHub's documented example: secret "It's a Secret to Everybody", payload
/// "Hello, World!".
#[test]
fn github_accepts_its_documented_example_and_refuses_a_tampered_byte_or_wrong_secret() {
    let good = secrets(&["It's a Secret to Everybody"]);
    let signed = headers(&[("X-Hub-Signature-256", GITHUB_SIGNATURE)]);
    let now = at(0);
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &good,
            &signed,
            b"Hello, World!",
            now
        ),
        Ok(())
    );
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &good,
            &signed,
            b"Hello, World?",
            now
        ),
        Err(Refusal::Mismatch)
    );
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &secrets(&["another"]),
            &signed,
            b"Hello, World!",
            now
        ),
        Err(Refusal::Mismatch)
    );
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &good,
            &headers(&[]),
            b"Hello, World!",
            now
        ),
        Err(Refusal::Missing("X-Hub-Signature-256".into()))
    );
    let unprefixed = headers(&[("X-Hub-Signature-256", &GITHUB_SIGNATURE[7..])]);
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &good,
            &unprefixed,
            b"Hello, World!",
            now
        ),
        Err(Refusal::Malformed("X-Hub-Signature-256".into()))
    );
    // During a rotation the second secret is tried too.
    let rotated = secrets(&["the old one", "It's a Secret to Everybody"]);
    assert_eq!(
        verify(
            &WebhookScheme::Github,
            &rotated,
            &signed,
            b"Hello, World!",
            now
        ),
        Ok(())
    );
}

const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
const STRIPE_V1: &str = "fb22ffbfe8f82e398afe03ad6d385a59a0083f46bbd8b0ffad81467124cf7673";

#[test]
fn stripe_checks_every_v1_against_every_secret_within_five_minutes() {
    let good = secrets(&["whsec_stripe_test_secret"]);
    let header = format!(
        "t=1700000000,v1={},v1={STRIPE_V1},v0=ignored",
        "00".repeat(32)
    );
    let signed = headers(&[("Stripe-Signature", &header)]);
    let scheme = WebhookScheme::Stripe;
    assert_eq!(
        verify(&scheme, &good, &signed, STRIPE_BODY, at(1_700_000_000)),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &good, &signed, STRIPE_BODY, at(1_700_000_300)),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &good, &signed, STRIPE_BODY, at(1_699_999_700)),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &good, &signed, STRIPE_BODY, at(1_700_000_301)),
        Err(Refusal::Stale {
            tolerance: Duration::from_secs(300)
        })
    );
    let mut tampered = STRIPE_BODY.to_vec();
    tampered[8] = b'2';
    assert_eq!(
        verify(&scheme, &good, &signed, &tampered, at(1_700_000_000)),
        Err(Refusal::Mismatch)
    );
    // The timestamp is signed: moving it breaks the signature.
    let moved = headers(&[("Stripe-Signature", &format!("t=1700000001,v1={STRIPE_V1}"))]);
    assert_eq!(
        verify(&scheme, &good, &moved, STRIPE_BODY, at(1_700_000_000)),
        Err(Refusal::Mismatch)
    );
    let rotated = secrets(&["whsec_other", "whsec_stripe_test_secret"]);
    assert_eq!(
        verify(&scheme, &rotated, &signed, STRIPE_BODY, at(1_700_000_000)),
        Ok(())
    );
    let no_v1 = headers(&[("Stripe-Signature", "t=1700000000")]);
    assert_eq!(
        verify(&scheme, &good, &no_v1, STRIPE_BODY, at(1_700_000_000)),
        Err(Refusal::Malformed("Stripe-Signature".into()))
    );
}

#[test]
fn shopify_checks_a_base64_hmac_of_the_body() {
    let good = secrets(&["shopify_secret"]);
    let signed = headers(&[(
        "X-Shopify-Hmac-Sha256",
        "HkXBngMRo/tlppMNoopcz4KNfS22Q5FtteEt7Di9wOo=",
    )]);
    let scheme = WebhookScheme::Shopify;
    assert_eq!(
        verify(&scheme, &good, &signed, br#"{"id":1}"#, at(0)),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &good, &signed, br#"{"id":2}"#, at(0)),
        Err(Refusal::Mismatch)
    );
    assert_eq!(
        verify(
            &scheme,
            &secrets(&["wrong"]),
            &signed,
            br#"{"id":1}"#,
            at(0)
        ),
        Err(Refusal::Mismatch)
    );
}

#[test]
fn gitlab_compares_the_token_with_each_secret() {
    let scheme = WebhookScheme::Gitlab;
    let token = headers(&[("X-Gitlab-Token", "gitlab-token")]);
    assert_eq!(
        verify(&scheme, &secrets(&["gitlab-token"]), &token, b"{}", at(0)),
        Ok(())
    );
    assert_eq!(
        verify(
            &scheme,
            &secrets(&["old", "gitlab-token"]),
            &token,
            b"{}",
            at(0)
        ),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &secrets(&["gitlab-token2"]), &token, b"{}", at(0)),
        Err(Refusal::Mismatch)
    );
}

/// The Standard Webhooks reference libraries' test vector.
#[test]
fn standard_webhooks_accepts_the_reference_vector() {
    let scheme = WebhookScheme::Standard;
    let good = secrets(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
    let body = br#"{"test": 2432232314}"#;
    let signed = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        (
            "webhook-signature",
            "v1,bm90IHRoaXMgb25l v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ]);
    assert_eq!(
        verify(&scheme, &good, &signed, body, at(1_614_265_330)),
        Ok(())
    );
    assert_eq!(
        verify(&scheme, &good, &signed, body, at(1_614_265_330 + 301)),
        Err(Refusal::Stale {
            tolerance: Duration::from_secs(300)
        })
    );
    assert_eq!(
        verify(
            &scheme,
            &good,
            &signed,
            br#"{"test": 2432232315}"#,
            at(1_614_265_330)
        ),
        Err(Refusal::Mismatch)
    );
    let wrong = secrets(&["whsec_bm90IHRoZSBzZWNyZXQ="]);
    assert_eq!(
        verify(&scheme, &wrong, &signed, body, at(1_614_265_330)),
        Err(Refusal::Mismatch)
    );
}

fn custom(
    algorithm: HmacAlgorithm,
    encoding: SignatureEncoding,
    timestamped: bool,
) -> WebhookScheme {
    WebhookScheme::Hmac(HmacScheme {
        header: "X-Signature".into(),
        algorithm,
        encoding,
        prefix: "sig=".into(),
        timestamp_header: timestamped.then(|| "X-Timestamp".to_string()),
        tolerance: Duration::from_secs(60),
        id_header: None,
    })
}

#[test]
fn the_custom_hmac_scheme_follows_its_algorithm_encoding_prefix_and_timestamp() {
    let good = secrets(&["legacy_secret"]);
    let body = br#"{"id":1}"#;
    let base64_sha1 = custom(HmacAlgorithm::Sha1, SignatureEncoding::Base64, false);
    let signed = headers(&[("X-Signature", "sig=8Uw4D6WhwBPj+UaSIFYS4dc96PU=")]);
    assert_eq!(verify(&base64_sha1, &good, &signed, body, at(0)), Ok(()));
    let unprefixed = headers(&[("X-Signature", "8Uw4D6WhwBPj+UaSIFYS4dc96PU=")]);
    assert_eq!(
        verify(&base64_sha1, &good, &unprefixed, body, at(0)),
        Err(Refusal::Malformed("X-Signature".into()))
    );

    let timestamped = custom(HmacAlgorithm::Sha1, SignatureEncoding::Hex, true);
    let signed = headers(&[
        (
            "X-Signature",
            "sig=2591c2e259008135d0e17e8da27742ff4e50bb91",
        ),
        ("X-Timestamp", "1700000000"),
    ]);
    assert_eq!(
        verify(&timestamped, &good, &signed, body, at(1_700_000_060)),
        Ok(())
    );
    assert_eq!(
        verify(&timestamped, &good, &signed, body, at(1_700_000_061)),
        Err(Refusal::Stale {
            tolerance: Duration::from_secs(60)
        })
    );
    assert_eq!(
        verify(
            &timestamped,
            &secrets(&["other"]),
            &signed,
            body,
            at(1_700_000_000)
        ),
        Err(Refusal::Mismatch)
    );
    // A timestamp so far off that the subtraction would overflow is stale, not a panic.
    let extreme = headers(&[
        (
            "X-Signature",
            "sig=2591c2e259008135d0e17e8da27742ff4e50bb91",
        ),
        ("X-Timestamp", &i64::MIN.to_string()),
    ]);
    assert!(verify(&timestamped, &good, &extreme, body, at(1_700_000_000)).is_err());
}
