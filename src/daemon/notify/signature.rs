//! The `Tributary-Signature` header, in Stripe's scheme: `t=<unix seconds>,v1=<hex
//! HMAC-SHA256 of "<t>.<body>">`. Signing the timestamp with the body lets a receiver
//! reject a replayed request by its age.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Tributary-Signature";
/// The header that carries the delivery id, for receivers to deduplicate on.
pub const DELIVERY_HEADER: &str = "Tributary-Delivery";

/// The header value for `body` sent at `timestamp` (Unix seconds).
pub fn signature(secret: &SecretString, timestamp: i64, body: &str) -> String {
    // HMAC takes a key of any length, so this never fails.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let digest = mac.finalize().into_bytes();
    format!("t={timestamp},v1={}", const_hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hmac_of_the_timestamp_a_dot_and_the_body() {
        // Computed with `openssl dgst -sha256 -hmac`, as docs/operations.md verifies.
        let secret = SecretString::from("whsec_0123456789abcdef");
        assert_eq!(
            signature(&secret, 1_700_000_000, "{\"run_id\":7}"),
            "t=1700000000,v1=72fbd4eec59ce6952796e6e677a3f4c4acebf20c9fde983646bde046be2e648d"
        );
    }
}
