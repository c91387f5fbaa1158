//! Property tests of what an API's body can be: arbitrary bytes (non-UTF-8 included),
//! bodies over the size cap and JSON nested past the parser's limit. Each ends in a page
//! or in an error the pipeline reports, never a panic.

use proptest::prelude::*;
use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, rest_config, RestProvider};
use crate::http::{cap_body, HttpClient, HttpSettings};
use crate::{FetchContext, FetchError, Page, PageItem, Provider, RecordStage};

/// A fixed seed unless `PROPTEST_RNG_SEED` is set, so the suite is repeatable.
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x626f_6479);
    }
    config.failure_persistence = None;
    config
}

thread_local! {
    /// One API per test thread, shared by the cases of a property (which run in turn).
    static API: Api = Api::start();
}

/// A mock API and a runtime to drive it.
struct Api {
    runtime: tokio::runtime::Runtime,
    server: MockServer,
    /// Clients by body cap (building one costs more than a case).
    clients: std::cell::RefCell<std::collections::HashMap<u64, HttpClient>>,
}

impl Api {
    fn start() -> Api {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(MockServer::start());
        Api {
            runtime,
            server,
            clients: Default::default(),
        }
    }

    /// Serves `body` as the listing's only answer and fetches it once, without retries.
    fn fetch(&self, body: Vec<u8>, max_body_bytes: u64) -> Result<Page, FetchError> {
        self.runtime.block_on(async {
            self.server.reset().await;
            Mock::given(method("GET"))
                .and(path("/v1/items"))
                .respond_with(ResponseTemplate::new(200).set_body_raw(body, "application/json"))
                .mount(&self.server)
                .await;
            let client = self
                .clients
                .borrow_mut()
                .entry(max_body_bytes)
                .or_insert_with(|| {
                    HttpClient::new(HttpSettings {
                        max_retries: 0,
                        max_body_bytes,
                        ..HttpSettings::default()
                    })
                    .unwrap()
                })
                .clone();
            let provider = RestProvider::new(rest_config(&self.server, json!({})), client);
            provider
                .fetch_page(&FetchContext::full(&credentials(), "records"), None)
                .await
        })
    }
}

/// Bodies worth trying: raw bytes, JSON with raw bytes spliced in, and pages whose
/// strings hold bytes that are not UTF-8.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        (prop::collection::vec(any::<u8>(), 0..8), 0usize..40).prop_map(|(junk, at)| {
            let mut body = br#"{"data": [{"id": "a"}, {"id": 7}], "next": null}"#.to_vec();
            let at = at.min(body.len());
            body.splice(at..at, junk);
            body
        }),
        prop::collection::vec(128u8..=255, 1..4).prop_map(|bytes| {
            let mut body = br#"{"data": [{"id": ""#.to_vec();
            body.extend(bytes);
            body.extend_from_slice(br#""}]}"#);
            body
        }),
    ]
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn any_body_is_a_page_or_a_reported_error(body in body()) {
        match API.with(|api| api.fetch(body.clone(), 1 << 20)) {
            Ok(page) => {
                // Then the body was JSON with an array at `data`.
                let parsed: Value = serde_json::from_slice(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(page.items.len(), parsed["data"].as_array().unwrap().len());
            }
            Err(error @ FetchError::InvalidJson { .. }) => {
                prop_assert!(serde_json::from_slice::<Value>(&body).is_err());
                prop_assert_eq!(error.stage(), RecordStage::Parse);
                let body_text = cap_body(&body);
                prop_assert_eq!(error.body(), Some(body_text.as_str()), "the body is kept for the report");
            }
            Err(error @ FetchError::Shape { .. }) => {
                prop_assert_eq!(error.stage(), RecordStage::Parse);
                prop_assert!(error.body().is_some());
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other}"))),
        }
    }

    #[test]
    fn a_body_over_the_cap_is_refused_and_one_within_it_read_whole(
        records in 0usize..30,
        cap in prop::sample::select(vec![1u64, 16, 64, 200, 333, 600]),
    ) {
        let data: Vec<Value> = (0..records).map(|i| json!({"id": i})).collect();
        let body = json!({"data": data}).to_string().into_bytes();
        match API.with(|api| api.fetch(body.clone(), cap)) {
            Ok(page) => {
                prop_assert!(body.len() as u64 <= cap);
                prop_assert_eq!(page.items.len(), records);
            }
            Err(FetchError::BodyTooLarge { limit, .. }) => {
                prop_assert!(body.len() as u64 > cap);
                prop_assert_eq!(limit, cap);
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other}"))),
        }
    }

    /// Records are kept as text, never parsed into a tree, so nesting of any depth is
    /// stored whole (and cannot overflow the stack).
    #[test]
    fn deep_nesting_is_stored_as_sent(depth in 0usize..400) {
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let record = format!(r#"{{"id": "deep", "nested": {}}}"#, if depth == 0 { "0" } else { &nested });
        let body = format!(r#"{{"data": [{record}]}}"#);
        let page = API
            .with(|api| api.fetch(body.into_bytes(), 1 << 20))
            .map_err(|error| TestCaseError::fail(format!("depth {depth}: {error}")))?;
        match page.items.as_slice() {
            [PageItem::Record(stored)] => {
                prop_assert_eq!(stored.external_id.as_str(), "deep");
                prop_assert_eq!(&stored.payload, &record);
            }
            other => return Err(TestCaseError::fail(format!("depth {depth}: {other:?}"))),
        }
    }
}
