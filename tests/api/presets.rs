//! Presets through config.toml and the pipeline: `preset = "NAME"` with only the
//! connection and the overrides its documentation asks for.

use serde_json::json;
use tributary::pipeline::RunStatus;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, spawn_app, TestApp};

fn gitlab(app: &TestApp) -> String {
    format!(
        "[providers.gl]\npreset = \"gitlab_issues\"\nbase_url = \"{}/api/v4\"\n\
         path = \"/projects/3/issues\"\nschedule = \"0 * * * * *\"\n{}",
        app.api.uri(),
        connections("gl", &["alice"])
    )
}

fn issue(id: u64, updated_at: &str) -> serde_json::Value {
    json!({"id": id, "iid": id, "project_id": 3, "title": format!("Issue {id}"),
           "state": "opened", "updated_at": updated_at})
}

#[tokio::test]
async fn a_preset_syncs_with_only_the_connection_and_its_overrides() {
    let app = spawn_app().await;
    let issues = || {
        Mock::given(method("GET"))
            .and(path("/api/v4/projects/3/issues"))
            .and(header("private-token", "token-alice"))
            .and(query_param("scope", "all"))
            .and(query_param("order_by", "updated_at"))
            .and(query_param("sort", "desc"))
            .and(query_param("per_page", "100"))
    };
    issues()
        .and(query_param_is_missing("updated_after"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("ratelimit-remaining", "1999")
                .set_body_json(json!([
                    issue(2, "2026-11-02T10:00:00Z"),
                    issue(1, "2026-11-01T10:00:00Z")
                ])),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app.settings(&gitlab(&app)).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (first.status, first.counts.inserted),
        (RunStatus::Succeeded, 2)
    );

    issues()
        .and(query_param("updated_after", "2026-11-02T10:00:00Z"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            issue(3, "2026-11-03T10:00:00Z"),
            issue(2, "2026-11-02T10:00:00Z")
        ])))
        .expect(1)
        .mount(&app.api)
        .await;
    let second = app.sync_one(&settings).await;
    assert_eq!(
        (
            second.status,
            second.counts.inserted,
            second.counts.unchanged
        ),
        (RunStatus::Succeeded, 1, 1)
    );
    app.api.verify().await;
    assert_eq!(app.record_ids().await, ["1", "2", "3"]);
}

#[tokio::test]
async fn an_unknown_preset_or_a_missing_required_key_is_refused_naming_the_key() {
    let app = spawn_app().await;
    let parse = |table: &str| {
        tributary::config::Settings::parse(
            &app.dir.path().join("config.toml"),
            &app.config_text(table),
            None,
            &|_| true,
        )
    };
    let unknown = parse("[providers.x]\npreset = \"nope\"\nschedule = \"0 * * * * *\"\n")
        .expect_err("unknown preset");
    let message = unknown.to_string();
    assert!(
        message.contains("key `providers.x.preset`") && message.contains("gitlab_issues"),
        "{message}"
    );
    let missing =
        parse("[providers.shop]\npreset = \"shopify_orders\"\nschedule = \"0 * * * * *\"\n")
            .expect_err("base_url is the shop's own");
    let message = missing.to_string();
    assert!(
        message.contains("key `providers.shop.preset`") && message.contains("base_url"),
        "{message}"
    );
}
