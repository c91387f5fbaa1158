//! Deserializing and validating `kind = "rest"` configurations.

use serde::Deserialize;
use serde_json::json;

use super::provider_config;
use crate::rest::{Auth, PaginationType, RestConfig};
use crate::{IdSpec, ProviderConfig};

fn rest(value: serde_json::Value) -> RestConfig {
    let config = provider_config(value).unwrap();
    let ProviderConfig::Rest(config) = config else {
        panic!("expected a rest config, got {config:?}");
    };
    config
}

/// `validate()`'s message for a config of `base` with `extra` merged in.
fn invalid(extra: serde_json::Value) -> String {
    let mut value = json!({"kind": "rest", "base_url": "https://api.example.com"});
    if let (Some(base), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
        base.extend(extra);
    }
    provider_config(value).unwrap().validate().unwrap_err()
}

#[test]
fn the_documented_toml_works_as_written() {
    let text = r#"
        [providers.acme]
        kind = "rest"
        base_url = "http://127.0.0.1:8080"
        path = "/v1/items"
        records_path = "data"
        id_field = "id"
        auth = "bearer"
        [providers.acme.pagination]
        type = "cursor"
        cursor_path = "next_cursor"
        cursor_param = "cursor"
        page_size_param = "limit"
        page_size = 100
        [providers.acme.query]
        team = "core"
        [providers.acme.headers]
        X-Client = "tributary"
    "#;
    let document: toml::Table = toml::from_str(text).unwrap();
    let table = document["providers"]["acme"].clone();
    let config = ProviderConfig::deserialize(table).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kind(), "rest");
    assert!(config.needs_token());
    let ProviderConfig::Rest(rest) = config else {
        panic!("expected a rest config, got {config:?}");
    };
    assert_eq!(
        rest.endpoint().unwrap().as_str(),
        "http://127.0.0.1:8080/v1/items"
    );
    assert_eq!(rest.pagination.kind, PaginationType::Cursor);
    assert_eq!(rest.pagination.cursor_param.as_deref(), Some("cursor"));
    assert_eq!(rest.query["team"], "core");
    assert_eq!(rest.headers["X-Client"], "tributary");
    assert_eq!(rest.id_spec(), IdSpec::Field("id".into()));
}

#[test]
fn provider_config_deserializes_through_the_kind_tag() {
    let config = rest(json!({
        "kind": "rest",
        "base_url": "https://api.example.com/v2/",
        "path": "items",
        "key_fields": ["date", "type"],
        "auth": {"header": "X-Api-Key"},
        "pagination": {"type": "page", "first_page": 0, "page_size_param": "per_page", "page_size": 50},
    }));
    assert_eq!(
        config.endpoint().unwrap().as_str(),
        "https://api.example.com/v2/items"
    );
    assert_eq!(
        config.id_spec(),
        IdSpec::KeyFields(vec!["date".into(), "type".into()])
    );
    assert_eq!(
        config.auth,
        Auth::Header {
            name: "X-Api-Key".into()
        }
    );
    assert_eq!(config.pagination.kind, PaginationType::Page);
    assert_eq!(config.pagination.first_page(), 0);
    assert_eq!(config.pagination.page_param(), "page");
    assert_eq!(config.pagination.page_size, 50);
    assert!(config.validate().is_ok());

    let minimal = rest(json!({"kind": "rest", "base_url": "http://h"}));
    assert_eq!(minimal.auth, Auth::Bearer);
    assert_eq!(minimal.pagination.kind, PaginationType::None);
    assert_eq!(minimal.pagination.page_size, 100);
    assert_eq!(minimal.id_spec(), IdSpec::Field("id".into()));
    assert_eq!(minimal.endpoint().unwrap().as_str(), "http://h/");
}

#[test]
fn unknown_keys_are_rejected_by_name() {
    let error = provider_config(json!({
        "kind": "rest", "base_url": "http://h", "colour": "red",
    }))
    .unwrap_err();
    assert!(
        error.to_string().contains("unknown field `colour`"),
        "{error}"
    );
    let error = provider_config(json!({
        "kind": "rest", "base_url": "http://h", "pagination": {"type": "cursor", "cursor_pth": "x"},
    }))
    .unwrap_err();
    assert!(
        error.to_string().contains("unknown field `cursor_pth`"),
        "{error}"
    );
    let error = provider_config(json!({"kind": "soap", "base_url": "http://h"})).unwrap_err();
    assert!(error.to_string().contains("soap"), "{error}");
}

#[test]
fn auth_accepts_its_forms_and_explains_otherwise() {
    let auth = |value: serde_json::Value| {
        provider_config(json!({"kind": "rest", "base_url": "http://h", "auth": value})).map(
            |config| match config {
                ProviderConfig::Rest(config) => config.auth,
                other => panic!("expected a rest config, got {other:?}"),
            },
        )
    };
    assert_eq!(auth(json!("bearer")).unwrap(), Auth::Bearer);
    assert_eq!(auth(json!("none")).unwrap(), Auth::None);
    assert_eq!(
        auth(json!({"header": "X-Api-Key"})).unwrap(),
        Auth::Header {
            name: "X-Api-Key".into()
        }
    );
    assert_eq!(
        auth(json!({"query": "api_key"})).unwrap(),
        Auth::Query {
            name: "api_key".into()
        }
    );
    assert_eq!(
        auth(json!("basic")).unwrap(),
        Auth::Basic { username: None }
    );
    assert_eq!(
        auth(json!({"basic": "api"})).unwrap(),
        Auth::Basic {
            username: Some("api".into())
        }
    );
    let app = auth(json!({"shopify_app": {"client_id": "api-key-1",
        "client_secret_env": "SHOP_SECRET", "scope": "read_orders"}}))
    .unwrap();
    assert_eq!(
        app,
        Auth::ShopifyApp(crate::shopify_app::ShopifyApp {
            client_id: "api-key-1".into(),
            client_secret_env: "SHOP_SECRET".into(),
            scope: "read_orders".into(),
        })
    );
    // Shopify's Admin API takes the token in its own header, as is.
    let (name, value) = app.header(Some("shpat_1")).unwrap().expect("a header");
    assert_eq!(
        (name.as_str(), value.to_str().unwrap()),
        ("x-shopify-access-token", "shpat_1")
    );
    assert!(app.needs_token() && app.authorization().is_none());
    let expected = r#"expected "bearer", "none", "basic", { header = "NAME" }, { query = "NAME" }, { basic = "USER" }, { oauth2 = "#;
    for bad in [
        json!("digest"),
        json!({"heder": "X"}),
        json!({}),
        json!(42),
        json!({"query": "a", "header": "b"}),
    ] {
        let error = auth(bad.clone()).unwrap_err().to_string();
        assert!(error.contains(expected), "{bad}: {error}");
    }
}

#[test]
fn validate_names_the_key_that_is_wrong() {
    let cases = [
        (
            json!({"pagination": {"type": "cursor", "cursor_param": "c"}}),
            r#"pagination.cursor_path is required when pagination.type = "cursor""#,
        ),
        (
            json!({"pagination": {"type": "cursor", "cursor_path": "next"}}),
            r#"pagination.cursor_param is required when pagination.type = "cursor""#,
        ),
        (
            json!({"pagination": {"type": "offset", "page_size": 0}}),
            "pagination.page_size must be between 1 and 100000, got 0",
        ),
        (
            json!({"pagination": {"type": "offset", "cursor_path": "next"}}),
            r#"pagination.cursor_path is set, but pagination.type = "offset" does not use it"#,
        ),
        (
            json!({"id_field": "id", "key_fields": ["a"]}),
            "id_field and key_fields are both set",
        ),
        (
            json!({"key_fields": []}),
            "key_fields must name at least one field",
        ),
        (json!({"id_field": ""}), "id_field must not be empty"),
        (
            json!({"base_url": "ftp://files.example.com"}),
            "base_url must be an http or https URL",
        ),
        (
            json!({"base_url": "https://h/?key=1"}),
            "base_url must not carry a query string",
        ),
        (
            json!({"headers": {"Bad Name": "x"}}),
            "headers.Bad Name is not a valid HTTP header name",
        ),
        (
            json!({"headers": {"authorization": "Basic x"}}),
            "headers.authorization would clash with the header auth = \"bearer\" sends",
        ),
        (
            json!({"auth": {"header": "X Key"}}),
            "auth.header \"X Key\" is not a valid HTTP header name",
        ),
        (
            json!({"auth": {"query": " "}}),
            "auth.query must name a query parameter",
        ),
        (
            json!({"auth": {"query": "key"}, "query": {"key": "x"}}),
            "query.key would clash with the parameter auth = { query = \"key\" } sends",
        ),
        (
            json!({"auth": {"query": "limit"}, "pagination": {"type": "offset", "page_size_param": "limit"}}),
            "auth.query \"limit\" is also a pagination parameter",
        ),
    ];
    for (extra, expected) in cases {
        let message = invalid(extra.clone());
        assert!(message.contains(expected), "{extra}: {message}");
    }
}

#[test]
fn needs_token_is_false_only_for_auth_none() {
    let needs = |auth: serde_json::Value| {
        provider_config(json!({"kind": "rest", "base_url": "http://h", "auth": auth}))
            .unwrap()
            .needs_token()
    };
    assert!(needs(json!("bearer")));
    assert!(needs(json!({"header": "X-Api-Key"})));
    assert!(!needs(json!("none")));
}

#[test]
fn the_endpoint_joins_base_url_and_path() {
    let endpoint = |base: &str, path: &str| {
        rest(json!({"kind": "rest", "base_url": base, "path": path}))
            .endpoint()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        endpoint("http://h/api/", "/v1/items"),
        "http://h/api/v1/items"
    );
    assert_eq!(
        endpoint("http://h/api", "v1/items"),
        "http://h/api/v1/items"
    );
    assert_eq!(endpoint("http://h:81", "/v1"), "http://h:81/v1");
}
