//! A reconnect on the Connect page, by key and by OAuth2, replaces the connection's
//! credentials and nothing else: the records, the stream's cursor and the finished runs
//! synced before it are the same rows afterwards, and the next run asks from the cursor.

use std::time::Duration;

use sea_orm::{EntityTrait, QueryOrder};
use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection_stream, record, sync_run};
use wiremock::matchers::{body_string_contains, header, method, path, query_param};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{connections_of, RETURN_URL};
use crate::daemon::eventually;
use crate::helpers::{spawn_app, TestApp};
use crate::http::Served;

const START: &str = "2024-01-01T00:00:00Z";
/// The newest `updated_at` of the first sync: the stream's cursor after it.
const NEWEST: &str = "2026-11-03T10:00:00Z";

/// How the user connects, and with what credential the listing is asked each time.
enum Way {
    /// A pasted key, `auth = "bearer"`.
    Key,
    /// The authorization code grant of a `rest` OAuth2 application.
    OAuth,
}

impl Way {
    /// The provider `acme`: incremental by `updated_at` from [`START`], synced once a year.
    fn provider(&self, app: &TestApp) -> String {
        let uri = app.api.uri();
        let auth = match self {
            Way::Key => "auth = \"bearer\"".to_string(),
            Way::OAuth => format!(
                "auth = {{ oauth2 = \"refresh_token\", token_url = \"{uri}/oauth2/token\", \
                 authorize_url = \"{uri}/oauth2/authorize\", client_id = \"acme-client\", \
                 client_secret_env = \"TEST_ACME_SECRET\" }}"
            ),
        };
        format!(
            "\n[providers.acme]\nkind = \"rest\"\nbase_url = \"{uri}\"\npath = \"/v1/items\"\n\
             schedule = \"0 0 0 1 1 *\"\nrecords_path = \"data\"\nid_field = \"id\"\n{auth}\n\
             incremental = {{ cursor_field = \"updated_at\", param = \"updated_since\", start = \"{START}\" }}\n\
             [providers.acme.http]\nmax_retries = 0\n"
        )
    }

    /// The credential of the first connect and of the reconnect.
    fn tokens(&self) -> [&'static str; 2] {
        match self {
            Way::Key => ["acme-key-first-0123", "acme-key-again-4567"],
            Way::OAuth => ["acme-access-first-0123", "acme-access-again-4567"],
        }
    }
}

/// The listing as `token` asks for it `since`, answering `items`, `times` times.
async fn mount_listing(
    app: &TestApp,
    token: &str,
    since: &str,
    items: serde_json::Value,
    times: u64,
) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", format!("Bearer {token}").as_str()))
        .and(query_param("updated_since", since))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": items})))
        .expect(times)
        .mount(&app.api)
        .await;
}

/// The token endpoint: `code-N` buys the Nth access token.
async fn mount_token_endpoint(app: &TestApp, tokens: [&str; 2]) {
    for (code, access) in ["code-first", "code-again"].into_iter().zip(tokens) {
        Mock::given(method("POST"))
            .and(path("/oauth2/token"))
            .and(body_string_contains(format!("code={code}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "access_token": access, "token_type": "Bearer", "expires_in": 3600,
                "refresh_token": format!("refresh-{access}")
            })))
            .expect(1)
            .mount(&app.api)
            .await;
    }
}

/// u1 connects `acme` the `way` given, with its `nth` credential (reconnecting `reconnect`).
async fn connect(served: &Served, admin: &str, way: &Way, nth: usize, reconnect: Option<i64>) {
    let mut body = json!({"user_id": "u1", "providers": ["acme"], "return_url": RETURN_URL});
    if let Some(id) = reconnect {
        body["reconnect"] = json!(id);
    }
    let (status, location) = match way {
        Way::OAuth => {
            let code = ["code-first", "code-again"][nth];
            let (status, location, page) =
                crate::connect_oauth::connect_with(served, admin, &body, code).await;
            assert_eq!(status, reqwest::StatusCode::SEE_OTHER, "{page}");
            (status, location)
        }
        Way::Key => {
            let (status, _, created) =
                crate::connect::post_json(served, "/v1/connect/sessions", admin, &body).await;
            assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
            let url = created["url"].as_str().expect("url");
            let (cookie, _) = crate::connect::open(url).await;
            let (_, _, form) = crate::connect::get(&format!("{url}/acme"), Some(&cookie)).await;
            let body = form_urlencoded::Serializer::new(String::new())
                .append_pair("csrf", &crate::connect::csrf_of(&form))
                .append_pair("key", way.tokens()[nth])
                .finish();
            let (status, headers, page) =
                crate::connect::post(&format!("{url}/acme"), Some(&cookie), body).await;
            assert_eq!(status, reqwest::StatusCode::SEE_OTHER, "{page}");
            (
                status,
                headers["location"].to_str().expect("location").to_string(),
            )
        }
    };
    assert_eq!(status, reqwest::StatusCode::SEE_OTHER);
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
}

/// The rows a reconnect must keep: records (id, key, payload), the stream's (id,
/// cursor) and the finished runs (id, status, inserted).
type Kept = (
    Vec<(i64, String, String)>,
    Vec<(i64, Option<String>)>,
    Vec<(i64, RunStatus, i64)>,
);

async fn kept(app: &TestApp) -> Kept {
    let records = record::Entity::find()
        .order_by_asc(record::Column::Id)
        .all(&app.db)
        .await
        .expect("records")
        .into_iter()
        .map(|row| (row.id, row.external_id, row.payload))
        .collect();
    let streams = connection_stream::Entity::find()
        .order_by_asc(connection_stream::Column::Id)
        .all(&app.db)
        .await
        .expect("streams")
        .into_iter()
        .map(|row| (row.id, row.cursor))
        .collect();
    let runs = sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .expect("runs")
        .into_iter()
        .filter(|run| run.finished_at.is_some())
        .map(|run| (run.id, run.status, run.records_inserted))
        .collect();
    (records, streams, runs)
}

/// Waits until `count` runs succeeded.
async fn succeeded_runs(app: &TestApp, count: usize) {
    eventually(Duration::from_secs(30), "the runs", || async {
        sync_run::Entity::find()
            .all(&app.db)
            .await
            .expect("runs")
            .iter()
            .filter(|run| run.status == RunStatus::Succeeded)
            .count()
            == count
    })
    .await;
}

async fn a_reconnect_keeps_records_cursor_and_runs(way: Way) {
    let app = spawn_app().await;
    let [first, again] = way.tokens();
    let items = json!([
        {"id": "a", "updated_at": "2026-11-01T10:00:00Z"},
        {"id": "b", "updated_at": NEWEST}
    ]);
    // With a key, the check and the first sync ask the same first page.
    let checks = match way {
        Way::Key => 1,
        Way::OAuth => 0,
    };
    mount_listing(&app, first, START, items.clone(), 1 + checks).await;
    // After the reconnect: the new key's check asks from START; the run asks from the
    // kept cursor, never from START again.
    mount_listing(&app, again, START, items, checks).await;
    mount_listing(&app, again, NEWEST, json!([]), 1).await;
    if let Way::OAuth = way {
        mount_token_endpoint(&app, way.tokens()).await;
    }
    let served = Served::start_with_env(
        &app,
        &way.provider(&app),
        &[("TEST_ACME_SECRET", "acme-client-secret-0123")],
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    connect(&served, &admin, &way, 0, None).await;
    succeeded_runs(&app, 1).await;
    let before = kept(&app).await;
    assert_eq!(before.0.len(), 2, "{before:?}");
    assert_eq!(
        before.1[0].1.as_deref(),
        Some(format!("{{\"time\":\"{NEWEST}\"}}").as_str())
    );
    assert_eq!(before.2.len(), 1, "{before:?}");
    let id = connections_of(&app, "u1").await[0].id;

    connect(&served, &admin, &way, 1, Some(id)).await;
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.iter().map(|row| row.id).collect::<Vec<_>>(), vec![id]);
    let stored = app.stored_credentials("u1", "acme").await;
    assert_eq!(
        stored.token.as_deref(),
        Some(again),
        "only the credentials changed"
    );
    // The reconnect's first sync runs incrementally from the kept cursor.
    succeeded_runs(&app, 2).await;
    let after = kept(&app).await;
    assert_eq!(after.0, before.0, "the same records");
    assert_eq!(after.1, before.1, "the same stream and cursor");
    assert_eq!(after.2[..1], before.2[..], "the run before is kept");
    assert_eq!(after.2.len(), 2, "{after:?}");
}

#[tokio::test]
async fn a_reconnect_by_key_keeps_the_records_the_cursor_and_the_runs() {
    a_reconnect_keeps_records_cursor_and_runs(Way::Key).await;
}

#[tokio::test]
async fn a_reconnect_by_oauth_keeps_the_records_the_cursor_and_the_runs() {
    a_reconnect_keeps_records_cursor_and_runs(Way::OAuth).await;
}
