//! Connect by a pasted key to providers other than Stripe: `rest` providers with a bearer
//! token, a header, HTTP basic (a fixed user, or USER:PASSWORD) or a query parameter,
//! and the Freshdesk and Pipedrive presets. The key is checked with one request that
//! carries it as the provider's docs say, then sealed and its first sync queued; a
//! refused key is said on the page and stores nothing.

use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{
    assert_no_secret_in, connections_of, csrf_of, get, jobs_of, open, post, session_for, sessions,
    RETURN_URL,
};
use crate::daemon::{eventually, runs_of};
use crate::helpers::{spawn_app, TestApp};
use crate::http::Served;

/// Where a provider expects its key in a request.
#[derive(Clone)]
enum Carried {
    /// A header and its exact value.
    Header(&'static str, String),
    /// A query parameter and its value.
    Query(&'static str, &'static str),
}

/// One key-taking provider, as its docs say it takes the key.
struct KeyCase {
    /// The `[providers.NAME]` table's name.
    name: &'static str,
    /// The table's keys other than the name, schedule and base URL.
    table: &'static str,
    /// The path under the provider's base URL of its listing's first page.
    listing: &'static str,
    /// The listing's empty first page.
    empty: &'static str,
    key: &'static str,
    carried: Carried,
}

fn basic(pair: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn cases() -> Vec<KeyCase> {
    vec![
        KeyCase {
            name: "bearer",
            table: "kind = \"rest\"\npath = \"/items\"\nauth = \"bearer\"",
            listing: "/items",
            empty: "[]",
            key: "bearer-key-0123456789",
            carried: Carried::Header("authorization", "Bearer bearer-key-0123456789".into()),
        },
        KeyCase {
            name: "header",
            table: "kind = \"rest\"\npath = \"/items\"\nauth = { header = \"X-Api-Key\" }",
            listing: "/items",
            empty: "[]",
            key: "header-key-0123456789",
            carried: Carried::Header("x-api-key", "header-key-0123456789".into()),
        },
        KeyCase {
            name: "basic_user",
            table: "kind = \"rest\"\npath = \"/items\"\nauth = { basic = \"api\" }",
            listing: "/items",
            empty: "[]",
            key: "basic-password-0123456789",
            carried: Carried::Header("authorization", basic("api:basic-password-0123456789")),
        },
        KeyCase {
            name: "basic_pair",
            table: "kind = \"rest\"\npath = \"/items\"\nauth = \"basic\"",
            listing: "/items",
            empty: "[]",
            key: "someone@example.com:pair-password-0123",
            carried: Carried::Header(
                "authorization",
                basic("someone@example.com:pair-password-0123"),
            ),
        },
        KeyCase {
            name: "query",
            table: "kind = \"rest\"\npath = \"/items\"\nauth = { query = \"api_key\" }",
            listing: "/items",
            empty: "[]",
            key: "query-key-0123456789",
            carried: Carried::Query("api_key", "query-key-0123456789"),
        },
        // Freshdesk: the API key as the basic user and X as the password, the token
        // "API_KEY:X" (providers/presets/freshdesk_tickets.toml).
        KeyCase {
            name: "freshdesk",
            table: "preset = \"freshdesk_tickets\"",
            listing: "/api/v2/tickets",
            empty: "[]",
            key: "fd0123456789abcdefgh:X",
            carried: Carried::Header("authorization", basic("fd0123456789abcdefgh:X")),
        },
        // Pipedrive's API v2 takes the API token in the x-api-token header.
        KeyCase {
            name: "pipedrive",
            table: "preset = \"pipedrive_deals\"",
            listing: "/deals",
            empty:
                "{\"success\": true, \"data\": [], \"additional_data\": {\"next_cursor\": null}}",
            key: "pd0123456789abcdef0123456789abcdef01234567",
            carried: Carried::Header(
                "x-api-token",
                "pd0123456789abcdef0123456789abcdef01234567".into(),
            ),
        },
    ]
}

/// Each case's table, its API under `/NAME` on the app's wiremock, synced once a year.
fn providers(app: &TestApp) -> String {
    cases()
        .iter()
        .map(|case| {
            format!(
                "\n[providers.{name}]\n{table}\nbase_url = \"{uri}/{name}\"\nschedule = \"0 0 0 1 1 *\"\n\
                 [providers.{name}.http]\nmax_retries = 0\n",
                name = case.name,
                table = case.table,
                uri = app.api.uri(),
            )
        })
        .collect()
}

/// A daemon with every case's provider and Connect on.
async fn serve(app: &TestApp) -> Served {
    Served::start_with(
        app,
        &providers(app),
        "daemon",
        crate::connect::with_connect(RETURN_URL),
    )
    .await
}

/// The requests wiremock received under `/NAME`.
async fn requests_to(app: &TestApp, name: &str) -> Vec<wiremock::Request> {
    app.api
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|request| request.url.path().starts_with(&format!("/{name}/")))
        .collect()
}

/// Whether `request` carries `key` as `carried` says, and in no other place.
fn carries(request: &wiremock::Request, carried: &Carried, key: &str) -> bool {
    let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
    match carried {
        Carried::Header(name, value) => {
            request.headers.get(*name).and_then(|v| v.to_str().ok()) == Some(value.as_str())
                && query.iter().all(|(_, v)| !v.contains(key))
        }
        Carried::Query(name, value) => {
            query.contains(&(name.to_string(), value.to_string()))
                && request.headers.get("authorization").is_none()
        }
    }
}

/// A key of `case`'s provider pasted on u1's form: the answer's status, location and page.
async fn paste(
    served: &Served,
    admin: &str,
    case: &KeyCase,
    key: &str,
) -> (StatusCode, String, String) {
    let url = session_for(served, admin, "u1", case.name, RETURN_URL).await;
    let (cookie, _) = open(&url).await;
    let (status, _, form) = get(&format!("{url}/{}", case.name), Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{}: {form}", case.name);
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &csrf_of(&form))
        .append_pair("key", key)
        .finish();
    let (status, headers, page) = post(&format!("{url}/{}", case.name), Some(&cookie), body).await;
    let location = headers
        .get("location")
        .map(|value| value.to_str().expect("location").to_string())
        .unwrap_or_default();
    (status, location, page)
}

#[tokio::test]
async fn each_key_provider_checks_the_key_as_its_docs_say_then_seals_it_and_queues_its_sync() {
    let app = spawn_app().await;
    for case in cases() {
        // The key as documented gets the empty listing; any other credential a 401.
        let (carried, key) = (case.carried.clone(), case.key);
        let carried = move |request: &wiremock::Request| carries(request, &carried, key);
        Mock::given(method("GET"))
            .and(path_regex(format!("^/{}{}$", case.name, case.listing)))
            .and(carried)
            .respond_with(ResponseTemplate::new(200).set_body_raw(case.empty, "application/json"))
            .with_priority(1)
            .mount(&app.api)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(format!("^/{}/", case.name)))
            .respond_with(ResponseTemplate::new(401).set_body_string("{\"error\": \"bad key\"}"))
            .with_priority(2)
            .mount(&app.api)
            .await;
    }
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let mut secrets = Vec::new();
    for case in cases() {
        let name = case.name;
        // A refused key: said on the page, one request, nothing stored.
        let refused = format!("refused-{}", case.key);
        let (status, location, page) = paste(&served, &admin, &case, &refused).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {page}");
        assert!(location.is_empty(), "{name}");
        assert!(
            page.contains(&format!("{name} refused this key")),
            "{name}: {page}"
        );
        assert!(!page.contains(&refused), "{name}: {page}");
        assert_eq!(requests_to(&app, name).await.len(), 1, "{name}");
        assert!(connections_of(&app, "u1")
            .await
            .iter()
            .all(|row| row.provider != name));

        // The documented key: one request carrying it as documented, sealed, a sync queued.
        let (status, location, page) = paste(&served, &admin, &case, case.key).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{name}: {page}");
        assert_eq!(
            location,
            format!("{RETURN_URL}?outcome=connected"),
            "{name}"
        );
        let checked = requests_to(&app, name).await;
        assert!(
            carries(&checked[1], &case.carried, case.key),
            "{name}: {:?}",
            checked[1]
        );
        let rows = connections_of(&app, "u1").await;
        let row = rows.iter().find(|row| row.provider == name).expect(name);
        assert!(row.credentials.starts_with("sealed:"), "{name}: not sealed");
        assert!(!row.credentials.contains(case.key), "{name}");
        let stored = app.stored_credentials("u1", name).await;
        assert_eq!(stored.token.as_deref(), Some(case.key), "{name}");
        assert_eq!(
            jobs_of(&app, row.id).await.len(),
            1,
            "{name}: its first sync"
        );
        // The first sync runs with the key: one request more, so the check was one.
        eventually(Duration::from_secs(30), "the first sync", || async {
            runs_of(&app, "u1")
                .await
                .iter()
                .any(|run| run.provider == name && run.status == RunStatus::Succeeded)
        })
        .await;
        let sent = requests_to(&app, name).await;
        assert_eq!(sent.len(), 3, "{name}: {sent:?}");
        assert!(
            sent[1..]
                .iter()
                .all(|request| carries(request, &case.carried, case.key)),
            "{name}"
        );
        secrets.push(case.key.to_string());
        secrets.push(refused);
        if let Carried::Header("authorization", value) = &case.carried {
            secrets.push(value.trim_start_matches("Basic ").to_string());
        }
    }
    assert_eq!(
        sessions(&app)
            .await
            .iter()
            .filter(|(used, _)| *used)
            .count(),
        7
    );
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_no_secret_in(&served.daemon.log(), &secrets);
}

/// Freshdesk shows the API key alone, and its docs ask for it as the basic user with a
/// dummy password: a key pasted without the `:X` cannot be sent, and the page says how to
/// write it instead of blaming Freshdesk.
#[tokio::test]
async fn a_freshdesk_key_without_its_password_is_refused_on_the_page_saying_how_to_write_it() {
    let app = spawn_app().await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let freshdesk = cases()
        .into_iter()
        .find(|case| case.name == "freshdesk")
        .expect("freshdesk");
    let bare = freshdesk.key.trim_end_matches(":X");
    let (status, location, page) = paste(&served, &admin, &freshdesk, bare).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(location.is_empty());
    assert!(page.contains("USER:PASSWORD"), "{page}");
    assert!(page.contains("KEY:X"), "{page}");
    assert!(page.contains("name=\"key\""), "the form again: {page}");
    assert!(!page.contains("try again in a moment"), "{page}");
    assert!(requests_to(&app, "freshdesk").await.is_empty());
    assert!(connections_of(&app, "u1").await.is_empty());
    assert_eq!(sessions(&app).await, vec![(false, true)]);
    assert_no_secret_in(&served.daemon.log(), &[bare]);
}
