//! Presets through config.toml and the pipeline: `preset = "NAME"` with only the
//! connection and the keys the preset requires, run twice against an emulation of its
//! API (the query asked exactly, the documented auth header, two pages in the API's own
//! pagination), so the second run shows the cursor sent and only what is new inserted.

use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{header, method, path};
use wiremock::{Match, Mock, Request, ResponseTemplate};

use crate::helpers::{spawn_app, TestApp};

/// The four changes each emulated account holds, oldest first, as UTC times; each API's
/// own records write them in its own way.
const CHANGED: [&str; 4] = [
    "2026-11-01T10:00:00Z",
    "2026-11-02T10:00:00Z",
    "2026-11-03T10:00:00Z",
    "2026-11-04T10:00:00Z",
];
/// The newest change the first run reads: what the second run asks from.
const CURSOR: &str = "2026-11-03T10:00:00Z";

/// One answer of an emulated API: the query it is asked with, exactly, and what it says.
struct Page {
    /// Sorted, as [`ExactQuery`] compares it.
    query: Vec<(String, String)>,
    answer: ResponseTemplate,
}

/// A preset twice through config and the pipeline against its API's emulation. The
/// first run reads records 1 to 3 over two pages; the second is asked from the newest
/// change of the first and finds 3 again (the boundary tie) and 4, which is new.
struct TwoRuns {
    /// The `[providers.NAME]` table: the preset, its required keys, the connection.
    table: String,
    path: &'static str,
    /// Headers every request carries: the documented auth header and any other.
    headers: Vec<(&'static str, &'static str)>,
    first: Vec<Page>,
    second: Vec<Page>,
}

/// `query` and one parameter more.
fn plus<'a>(
    query: &[(&'a str, &'a str)],
    name: &'a str,
    value: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut query = query.to_vec();
    query.push((name, value));
    query
}

fn page(query: &[(&'static str, &str)], answer: ResponseTemplate) -> Page {
    let mut query: Vec<(String, String)> = query
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    query.sort();
    Page { query, answer }
}

/// Matches a request whose query parameters are exactly these: none missing, no other.
struct ExactQuery(Vec<(String, String)>);

impl Match for ExactQuery {
    fn matches(&self, request: &Request) -> bool {
        let mut sent: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        sent.sort();
        sent == self.0
    }
}

async fn mount(app: &TestApp, at: &str, headers: &[(&str, &str)], pages: Vec<Page>) {
    app.api.reset().await;
    for Page { query, answer } in pages {
        let mut mock = Mock::given(method("GET"))
            .and(path(at))
            .and(ExactQuery(query));
        for (name, value) in headers {
            mock = mock.and(header(*name, *value));
        }
        mock.respond_with(answer).expect(1).mount(&app.api).await;
    }
}

async fn assert_second_run_inserts_only_what_is_new(emulate: fn(&TestApp) -> TwoRuns) {
    let app = spawn_app().await;
    let TwoRuns {
        table,
        path,
        headers,
        first,
        second,
    } = emulate(&app);
    let settings = app.settings(&table).await;

    mount(&app, path, &headers, first).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted),
        (RunStatus::Succeeded, 3),
        "{run:?}"
    );
    app.api.verify().await;

    mount(&app, path, &headers, second).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted, run.counts.updated),
        (RunStatus::Succeeded, 1, 0),
        "{run:?}"
    );
    // Record 3, the boundary tie, is read again and left as it is (Freshdesk's second
    // run reads record 4 twice as well).
    assert!(run.counts.unchanged >= 1, "{run:?}");
    app.api.verify().await;
    assert_eq!(app.record_ids().await, ["1", "2", "3", "4"]);
}

/// A `[providers.PRESET]` table naming the preset, with `keys` and alice's connection.
fn table(preset: &str, keys: &str, token: &str) -> String {
    format!(
        "[providers.{preset}]\npreset = \"{preset}\"\n{keys}\nschedule = \"0 * * * * *\"\n\
         [[providers.{preset}.connections]]\nuser_id = \"alice\"\ntoken = \"{token}\"\n"
    )
}

/// A JSON array of the records `ids`, each written by `record` from its id and the time
/// of its change in [`CHANGED`].
fn records(
    ids: &[usize],
    record: impl Fn(usize, &'static str) -> serde_json::Value,
) -> serde_json::Value {
    ids.iter().map(|&id| record(id, CHANGED[id - 1])).collect()
}

fn ok(body: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

fn link_next(url: String) -> String {
    format!("<{url}>; rel=\"next\"")
}

/// Shopify writes times in the shop's zone: the cursor is sent in UTC.
fn shopify(app: &TestApp) -> TwoRuns {
    let orders = |ids: &[usize]| {
        let orders = records(ids, |id, changed| {
            let local = changed.replace("T10:", "T05:").replace('Z', "-05:00");
            json!({"id": id, "name": format!("#100{id}"), "financial_status": "paid",
                   "updated_at": local})
        });
        json!({ "orders": orders })
    };
    let path = "/admin/api/2025-10/orders.json";
    let next = format!(
        "{}{path}?limit=250&page_info=eyJsYXN0X2lkIjoyfQ",
        app.api.uri()
    );
    TwoRuns {
        table: table(
            "shopify_orders",
            &format!("base_url = \"{}\"", app.api.uri()),
            "token-alice",
        ),
        path,
        headers: vec![("X-Shopify-Access-Token", "token-alice")],
        first: vec![
            page(
                &[("status", "any"), ("limit", "250")],
                ok(orders(&[1, 2]))
                    .insert_header("X-Shopify-Shop-Api-Call-Limit", "1/40")
                    .insert_header("Link", link_next(next).as_str()),
            ),
            page(
                &[("limit", "250"), ("page_info", "eyJsYXN0X2lkIjoyfQ")],
                ok(orders(&[3])).insert_header("X-Shopify-Shop-Api-Call-Limit", "2/40"),
            ),
        ],
        second: vec![page(
            &[
                ("status", "any"),
                ("limit", "250"),
                ("updated_at_min", CURSOR),
            ],
            ok(orders(&[3, 4])),
        )],
    }
}

fn gitlab(app: &TestApp) -> TwoRuns {
    let issues = |ids: &[usize]| {
        records(ids, |id, changed| {
            json!({"id": id, "iid": id, "project_id": 3, "state": "opened",
                   "title": format!("Issue {id}"), "updated_at": changed})
        })
    };
    let listing = [
        ("scope", "all"),
        ("order_by", "updated_at"),
        ("sort", "desc"),
        ("per_page", "100"),
    ];
    let path = "/api/v4/projects/3/issues";
    let next = format!(
        "{}{path}?order_by=updated_at&page=2&per_page=100&scope=all&sort=desc",
        app.api.uri()
    );
    TwoRuns {
        table: table(
            "gitlab_issues",
            &format!(
                "base_url = \"{}/api/v4\"\npath = \"/projects/3/issues\"",
                app.api.uri()
            ),
            "token-alice",
        ),
        path,
        headers: vec![("PRIVATE-TOKEN", "token-alice")],
        first: vec![
            page(
                &listing,
                ok(issues(&[3, 2]))
                    .insert_header("RateLimit-Remaining", "1999")
                    .insert_header("Link", link_next(next).as_str()),
            ),
            page(
                &plus(&listing, "page", "2"),
                ok(issues(&[1])).insert_header("RateLimit-Remaining", "1998"),
            ),
        ],
        second: vec![page(
            &plus(&listing, "updated_after", CURSOR),
            ok(issues(&[4, 3])),
        )],
    }
}

/// Freshdesk serves no page past 300, so the preset reads oldest change first and asks
/// each page from the newest change read; a page size of 2 shows that with few tickets.
fn freshdesk(app: &TestApp) -> TwoRuns {
    let tickets = |ids: &[usize]| {
        records(ids, |id, changed| {
            json!({"id": id, "subject": "Printer on fire", "status": 2,
                   "updated_at": changed})
        })
    };
    let asked = |since: &'static str| {
        [
            ("order_by", "updated_at"),
            ("order_type", "asc"),
            ("per_page", "2"),
            ("page", "1"),
            ("updated_since", since),
        ]
    };
    let path = "/api/v2/tickets";
    let next = format!(
        "{}{path}?order_by=updated_at&order_type=asc&per_page=2&updated_since=2000-01-01T00%3A00%3A00Z&page=2",
        app.api.uri()
    );
    TwoRuns {
        table: table(
            "freshdesk_tickets",
            &format!(
                "base_url = \"{}\"\npagination = {{ page_size = 2 }}",
                app.api.uri()
            ),
            "key-alice:X",
        ),
        path,
        // base64("key-alice:X"): the API key as the user, X as the password.
        headers: vec![("Authorization", "Basic a2V5LWFsaWNlOlg=")],
        first: vec![
            page(
                &asked("2000-01-01T00:00:00Z"),
                ok(tickets(&[1, 2]))
                    .insert_header("X-Ratelimit-Remaining", "699")
                    .insert_header("Link", link_next(next).as_str()),
            ),
            // A full page goes on, from its newest change; a short one is the end.
            page(&asked(CHANGED[1]), ok(tickets(&[2, 3]))),
            page(&asked(CURSOR), ok(tickets(&[3]))),
        ],
        second: vec![
            page(&asked(CURSOR), ok(tickets(&[3, 4]))),
            page(&asked(CHANGED[3]), ok(tickets(&[4]))),
        ],
    }
}

fn harvest(app: &TestApp) -> TwoRuns {
    let entries = |ids: &[usize], next: Option<String>| {
        json!({
            "time_entries": records(ids, |id, changed| json!({"id": id, "hours": 1.5,
                "spent_date": "2026-11-01", "updated_at": changed})),
            "per_page": 2000, "total_pages": 1 + usize::from(next.is_some()),
            "links": {"next": next}
        })
    };
    let next = format!("{}/v2/time_entries?page=2&per_page=2000", app.api.uri());
    TwoRuns {
        table: table(
            "harvest_time_entries",
            &format!(
                "base_url = \"{}/v2\"\nheaders = {{ \"Harvest-Account-Id\" = \"123456\" }}",
                app.api.uri()
            ),
            "token-alice",
        ),
        path: "/v2/time_entries",
        headers: vec![
            ("Authorization", "Bearer token-alice"),
            ("Harvest-Account-Id", "123456"),
        ],
        first: vec![
            page(&[], ok(entries(&[1, 2], Some(next)))),
            page(
                &[("page", "2"), ("per_page", "2000")],
                ok(entries(&[3], None)),
            ),
        ],
        second: vec![page(
            &[("updated_since", CURSOR)],
            ok(entries(&[3, 4], None)),
        )],
    }
}

/// Asana writes milliseconds; the cursor goes out in whole seconds, which an inclusive
/// parameter makes a re-read, never a gap.
fn asana(app: &TestApp) -> TwoRuns {
    let tasks = |ids: &[usize], offset: Option<&str>| {
        json!({
            "data": records(ids, |id, changed| json!({"gid": id.to_string(),
                "name": "Write the docs", "resource_type": "task",
                "modified_at": changed.replace('Z', ".147Z")})),
            "next_page": offset.map(|offset| json!({"offset": offset,
                "path": format!("/tasks?project=1200&limit=100&offset={offset}")}))
        })
    };
    let fields = "name,resource_subtype,completed,completed_at,assignee,assignee.name,due_on,\
                  due_at,start_on,created_at,modified_at,notes,parent,memberships.section.name,\
                  tags.name,permalink_url";
    let listing = [
        ("project", "1200"),
        ("limit", "100"),
        ("opt_fields", fields),
    ];
    TwoRuns {
        table: table(
            "asana_tasks",
            &format!(
                "base_url = \"{}/api/1.0\"\nquery = {{ project = \"1200\" }}",
                app.api.uri()
            ),
            "token-alice",
        ),
        path: "/api/1.0/tasks",
        headers: vec![("Authorization", "Bearer token-alice")],
        first: vec![
            page(
                &listing,
                ok(tasks(&[1, 2], Some("eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ9"))),
            ),
            page(
                &plus(&listing, "offset", "eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ9"),
                ok(tasks(&[3], None)),
            ),
        ],
        second: vec![page(
            &plus(&listing, "modified_since", CURSOR),
            ok(tasks(&[3, 4], None)),
        )],
    }
}

fn pipedrive(app: &TestApp) -> TwoRuns {
    let deals = |ids: &[usize], next: Option<&str>| {
        json!({
            "success": true,
            "data": records(ids, |id, changed| json!({"id": id, "title": "Deal",
                "value": 5000, "update_time": changed})),
            "additional_data": {"next_cursor": next}
        })
    };
    let listing = [
        ("sort_by", "update_time"),
        ("sort_direction", "asc"),
        ("limit", "500"),
    ];
    TwoRuns {
        table: table(
            "pipedrive_deals",
            &format!("base_url = \"{}/api/v2\"", app.api.uri()),
            "token-alice",
        ),
        path: "/api/v2/deals",
        headers: vec![("x-api-token", "token-alice")],
        first: vec![
            page(
                &listing,
                ok(deals(&[1, 2], Some("eyJmaWVsZCI6ImlkIn0")))
                    .insert_header("x-ratelimit-remaining", "79")
                    .insert_header("x-ratelimit-reset", "2"),
            ),
            page(
                &plus(&listing, "cursor", "eyJmaWVsZCI6ImlkIn0"),
                ok(deals(&[3], None)),
            ),
        ],
        second: vec![page(
            &plus(&listing, "updated_since", CURSOR),
            ok(deals(&[3, 4], None)),
        )],
    }
}

#[tokio::test]
async fn shopify_orders_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(shopify).await;
}

#[tokio::test]
async fn gitlab_issues_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(gitlab).await;
}

#[tokio::test]
async fn freshdesk_tickets_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(freshdesk).await;
}

#[tokio::test]
async fn harvest_time_entries_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(harvest).await;
}

#[tokio::test]
async fn asana_tasks_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(asana).await;
}

#[tokio::test]
async fn pipedrive_deals_second_run_inserts_only_what_is_new() {
    assert_second_run_inserts_only_what_is_new(pipedrive).await;
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
    // A Shopify app's connections bring their shops' origins: base_url is waived.
    let app_table = |app: &str| {
        format!(
            "[providers.shop]\npreset = \"shopify_orders\"\nschedule = \"0 * * * * *\"\n\
             auth = {{ shopify_app = {{ {app} }} }}\n"
        )
    };
    let good = "client_id = \"api-key-1\", client_secret_env = \"SHOP_SECRET\", scope = \"read_orders,read_customers\"";
    let settings = parse(&app_table(good)).expect("a Shopify app");
    let adapter = &settings.providers["shop"].adapter;
    let shopify_app = adapter.shopify_app().expect("the app");
    assert_eq!(
        (shopify_app.client_id.as_str(), shopify_app.scope.as_str()),
        ("api-key-1", "read_orders,read_customers")
    );
    assert!(!adapter.takes_key());
    assert!(adapter.authorization().is_none());
    for (app, key, says) in [
        (
            "client_secret_env = \"S\", scope = \"read_orders\"",
            "providers.shop.auth",
            "auth.shopify_app.client_id is required",
        ),
        (
            "client_id = \"a\", client_secret_env = \"S\", scope = \"read_orders\", token_url = \"https://x.example\"",
            "providers.shop.auth",
            "auth.shopify_app.token_url is not a key",
        ),
        (
            "client_id = \"a\", client_secret_env = \"S\", scope = 3",
            "providers.shop.auth",
            "auth.shopify_app.scope must be a string",
        ),
        (
            "client_id = \"a\", client_secret_env = \"S\", scope = \"read orders\"",
            "providers.shop",
            "auth.shopify_app.scope",
        ),
        (
            "client_id = \"\", client_secret_env = \"S\", scope = \"read_orders\"",
            "providers.shop",
            "auth.shopify_app.client_id",
        ),
        (
            "client_id = \"a\", client_secret_env = \"NOT A NAME\", scope = \"read_orders\"",
            "providers.shop",
            "auth.shopify_app.client_secret_env",
        ),
    ] {
        let message = parse(&app_table(app)).expect_err(app).to_string();
        assert!(
            message.contains("config.toml")
                && message.contains(&format!("`{key}"))
                && message.contains(says),
            "{app}: {message}"
        );
    }
    // Only a Shopify app leaves base_url out.
    let plain = parse("[providers.acme]\nkind = \"rest\"\nschedule = \"0 * * * * *\"\n")
        .expect_err("no base_url");
    let message = plain.to_string();
    assert!(
        message.contains("providers.acme") && message.contains("base_url is required"),
        "{message}"
    );
}

/// A Shopify app's provider has no `base_url` of its own: each connection is fetched from
/// its own (its shop's, which the Connect page stores), and one without is refused before
/// any request.
#[tokio::test]
async fn a_shopify_app_connection_is_fetched_from_its_own_base_url() {
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    use tributary::entities::connection;

    let app = spawn_app().await;
    // The client secret's variable: one cargo always sets.
    let table = "[providers.shop]\npreset = \"shopify_orders\"\nschedule = \"0 * * * * *\"\n\
                 auth = { shopify_app = { client_id = \"api-key-1\", client_secret_env = \"CARGO_PKG_NAME\", scope = \"read_orders\" } }\n\
                 [[providers.shop.connections]]\nuser_id = \"alice\"\ntoken = \"token-alice\"\n";
    let settings = app.settings(table).await;
    let orders = json!({"orders": [
        {"id": 1, "updated_at": "2026-11-01T05:00:00-05:00"},
        {"id": 2, "updated_at": "2026-11-02T05:00:00-05:00"},
    ]});
    Mock::given(method("GET"))
        .and(path("/admin/api/2025-10/orders.json"))
        .and(header("X-Shopify-Access-Token", "token-alice"))
        .respond_with(ok(orders))
        .expect(1)
        .mount(&app.api)
        .await;

    let refused = app.sync_one(&settings).await;
    assert_eq!(refused.status, RunStatus::Failed, "{refused:?}");
    let message = refused.error.unwrap_or_default();
    assert!(message.contains("no base_url of its own"), "{message}");
    assert!(app
        .api
        .received_requests()
        .await
        .unwrap_or_default()
        .is_empty());

    connection::Entity::update_many()
        .col_expr(connection::Column::BaseUrl, Expr::value(app.api.uri()))
        .filter(connection::Column::UserId.eq("alice"))
        .exec(&app.db)
        .await
        .expect("the shop's base");
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted),
        (RunStatus::Succeeded, 2),
        "{run:?}"
    );
    app.api.verify().await;
    assert_eq!(app.record_ids().await, ["1", "2"]);
}
