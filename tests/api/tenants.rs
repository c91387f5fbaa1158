//! Nothing from one user lands in another's account: random users and providers whose
//! listings draw their external ids from one small shared pool (so they overlap heavily)
//! sync into one database, and every record stays with the user and provider it came
//! from. The user ids and external ids include values that differ only in case, accents,
//! trailing spaces or emoji, which a case-insensitive collation would merge.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{proptest_config, runtime, spawn_app, TestApp};

const USERS: [&str; 10] = [
    "alice", "Alice", "ALICE", "bob", "b0b", "carol", "é", "e", "😀", "😁",
];
const PROVIDERS: [&str; 3] = ["acme", "globex", "initech"];
const IDS: [&str; 10] = ["1", "2", "3", "x", "X", "x ", "é", "e", "😀", "😁"];
const PER_PAGE: usize = 3;

/// What each (user, provider) pair serves: ids from the shared pool, maybe repeated.
#[derive(Clone, Debug)]
struct World {
    users: Vec<&'static str>,
    providers: Vec<&'static str>,
    /// listings[u][p]: the ids user `u` has at provider `p`, in listing order.
    listings: Vec<Vec<Vec<&'static str>>>,
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::sample::subsequence(USERS.to_vec(), 2..=4),
        prop::sample::subsequence(PROVIDERS.to_vec(), 2..=3),
    )
        .prop_flat_map(|(users, providers)| {
            let listing = prop::collection::vec(prop::sample::select(IDS.to_vec()), 0..8);
            let listings =
                prop::collection::vec(prop::collection::vec(listing, providers.len()), users.len());
            (Just(users), Just(providers), listings)
        })
        .prop_map(|(users, providers, listings)| World {
            users,
            providers,
            listings,
        })
}

/// A record as `user` sees it at `provider`: its content names its owner.
fn record(id: &str, user: &str, provider: &str) -> Value {
    json!({"id": id, "owner": {"user": user, "provider": provider}})
}

/// The token of user `u` at provider `p` (independent of the user id's spelling).
fn token(u: usize, p: usize) -> String {
    format!("tok-{u}-{p}")
}

/// Serves every listing in pages of `PER_PAGE`, keyed on the bearer token and the
/// provider's path, and returns the providers' config tables.
async fn serve(app: &TestApp, world: &World) -> String {
    let mut config = String::new();
    for (p, provider) in world.providers.iter().enumerate() {
        config.push_str(&format!(
            "\n[providers.{provider}]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/{provider}/items\"\n\
             schedule = \"0 * * * * *\"\nrecords_path = \"data\"\nauth = \"bearer\"\n\
             [providers.{provider}.pagination]\ntype = \"cursor\"\ncursor_path = \"next\"\ncursor_param = \"after\"\n",
            app.api.uri()
        ));
        for (u, user) in world.users.iter().enumerate() {
            config.push_str(&format!(
                "[[providers.{provider}.connections]]\nuser_id = \"{user}\"\ntoken = \"{}\"\n",
                token(u, p)
            ));
            let ids = &world.listings[u][p];
            let pages: Vec<&[&str]> = if ids.is_empty() {
                vec![&[]]
            } else {
                ids.chunks(PER_PAGE).collect()
            };
            for (n, chunk) in pages.iter().enumerate() {
                let data: Vec<Value> = chunk.iter().map(|id| record(id, user, provider)).collect();
                let next = (n + 1 < pages.len()).then(|| format!("page{}", n + 1));
                let mock = Mock::given(method("GET"))
                    .and(path(format!("/{provider}/items")))
                    .and(header(
                        "authorization",
                        format!("Bearer {}", token(u, p)).as_str(),
                    ));
                let mock = if n == 0 {
                    mock.and(query_param_is_missing("after"))
                } else {
                    mock.and(query_param("after", format!("page{n}").as_str()))
                };
                mock.respond_with(
                    ResponseTemplate::new(200).set_body_json(json!({"data": data, "next": next})),
                )
                .mount(&app.api)
                .await;
            }
        }
    }
    config
}

/// Syncs every connection and checks that each record stayed with its owner.
async fn sync_and_check(app: &TestApp, world: &World) -> Result<(), TestCaseError> {
    let config = serve(app, world).await;
    let settings = app.settings(&config).await;
    let outcomes = app.sync(&settings).await;
    prop_assert_eq!(outcomes.len(), world.users.len() * world.providers.len());
    for outcome in &outcomes {
        prop_assert_eq!(outcome.status, RunStatus::Succeeded, "{:?}", outcome);
    }

    let mut served: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (u, user) in world.users.iter().enumerate() {
        for (p, provider) in world.providers.iter().enumerate() {
            for id in &world.listings[u][p] {
                served.insert((user.to_string(), provider.to_string(), id.to_string()));
            }
        }
    }
    let records = app.records().await;
    prop_assert_eq!(
        records.len(),
        served.len(),
        "one row per distinct (user, provider, id) served"
    );
    let mut stored = BTreeSet::new();
    for record in &records {
        let payload: Value = serde_json::from_str(&record.payload).unwrap();
        prop_assert_eq!(
            &payload,
            &self::record(&record.external_id, &record.user_id, &record.provider),
            "record {:?} of {:?}@{:?} holds another owner's content",
            record.external_id,
            record.user_id,
            record.provider
        );
        stored.insert((
            record.user_id.clone(),
            record.provider.clone(),
            record.external_id.clone(),
        ));
    }
    prop_assert_eq!(stored, served);
    Ok(())
}

#[test]
fn records_of_random_overlapping_tenants_stay_with_their_owner() {
    let runtime = runtime();
    let mut runner = TestRunner::new(proptest_config(16, 0x7465_6e61));
    runner
        .run(&world(), |world| {
            runtime.block_on(async {
                let app = spawn_app().await;
                sync_and_check(&app, &world).await
            })
        })
        .unwrap();
}

/// The spellings a case-insensitive, accent-insensitive, pad-space collation merges, all
/// at once: every user and id here is a key of its own.
#[tokio::test]
async fn users_and_ids_that_differ_only_in_case_accents_spaces_or_emoji_never_merge() {
    let app = spawn_app().await;
    let users = vec!["alice", "Alice", "é", "e", "😀", "😁"];
    let world = World {
        listings: vec![vec![IDS.to_vec(), IDS.to_vec()]; users.len()],
        users,
        providers: vec!["acme", "globex"],
    };
    sync_and_check(&app, &world)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(app.records().await.len(), 6 * 2 * IDS.len());
}
