//! A change made during a run to a record on a page the run already read: the next run
//! asks from no later than the moment the walk began, so the change is fetched even when
//! the API lists in an order other than the cursor's (Shopify's orders, by id).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::helpers::{connections, spawn_app, TestApp};

const START: &str = "2024-01-01T00:00:00Z";

fn rest(app: &TestApp) -> String {
    format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\nid_field = \"id\"\n\
         incremental = {{ cursor_field = \"updated_at\", param = \"updated_since\", \
         start = \"{START}\" }}\n\
         [providers.acme.pagination]\ntype = \"has_more\"\nafter_param = \"after\"\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    )
}

/// An API listing by id, one record a page, filtering by `updated_since`. During the
/// first run, `a` changes a second after its page was served, and `b` (on the next page)
/// changes just before its page is served, so `b` carries the newest time of the run.
#[derive(Clone, Default)]
struct ListedById(Arc<Mutex<Vec<Listed>>>);

/// A record's id and `updated_at`.
type Listed = (&'static str, DateTime<Utc>);

impl ListedById {
    fn updated_at(&self, id: &str) -> Option<DateTime<Utc>> {
        let records = self.0.lock().unwrap();
        records
            .iter()
            .find(|(own, _)| *own == id)
            .map(|(_, at)| *at)
    }
}

impl Respond for ListedById {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let param = |name: &str| {
            request
                .url
                .query_pairs()
                .find(|(own, _)| own == name)
                .map(|(_, value)| value.into_owned())
        };
        let since: DateTime<Utc> = param("updated_since").unwrap().parse().unwrap();
        let after = param("after");
        let mut records = self.0.lock().unwrap();
        let first_run = since.to_rfc3339_opts(SecondsFormat::Secs, true) == START;
        if first_run && after.is_none() {
            // Served as it is now; it changes while the answer is on its way.
            let served = page(&records[..1], true);
            records[0].1 = Utc::now() + Duration::from_secs(1);
            return served.set_delay(Duration::from_secs(2));
        }
        if first_run {
            records[1].1 = Utc::now();
        }
        let mut listed = records
            .iter()
            .filter(|(id, at)| *at >= since && after.as_deref().is_none_or(|after| *id > after));
        let this: Vec<_> = listed.next().into_iter().cloned().collect();
        page(&this, listed.next().is_some())
    }
}

fn page(records: &[Listed], has_more: bool) -> ResponseTemplate {
    let data: Vec<_> = records
        .iter()
        .map(|(id, at)| {
            json!({"id": id, "updated_at": at.to_rfc3339_opts(SecondsFormat::Millis, true)})
        })
        .collect();
    ResponseTemplate::new(200).set_body_json(json!({"data": data, "has_more": has_more}))
}

#[tokio::test]
async fn a_change_to_a_page_already_read_is_fetched_by_the_next_run() {
    let app = spawn_app().await;
    let long_ago: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    let api = ListedById::default();
    api.0
        .lock()
        .unwrap()
        .extend([("a", long_ago), ("b", long_ago)]);
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(api.clone())
        .mount(&app.api)
        .await;
    let settings = app.settings(&rest(&app)).await;
    let walk_began = Utc::now();
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (first.status, first.counts.inserted),
        (RunStatus::Succeeded, 2)
    );
    let changed_a = api.updated_at("a").unwrap();
    assert!(changed_a > walk_began, "a changed during the run");
    let stored_a = || async {
        let records = app.records().await;
        let a = records.iter().find(|record| record.external_id == "a");
        serde_json::from_str::<serde_json::Value>(&a.unwrap().payload).unwrap()["updated_at"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(stored_a().await, "2026-01-01T00:00:00.000Z");

    let second = app.sync_one(&settings).await;
    assert_eq!(second.status, RunStatus::Succeeded);
    assert_eq!(
        stored_a().await,
        changed_a.to_rfc3339_opts(SecondsFormat::Millis, true),
        "the change to a, made after its page was read, is stored by the next run"
    );
    assert_eq!(second.counts.updated, 1);
}
