//! Resources: several streams of one rest provider, child streams listed per parent record
//! with `{parent.FIELD}` templates, what a resource inherits, and the settings validation
//! refuses.

use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, ids, invalid_rest, provider, RestProvider};
use crate::{
    FetchContext, NoCredentialStore, Page, PageItem, PagePosition, ParentRecord, Provider,
    ProviderConfig, StreamSpec,
};

/// One page of `stream` at `position`, listed for `parent` (id and JSON text) if given.
async fn fetch(
    provider: &RestProvider,
    stream: &str,
    parent: Option<(&str, &str)>,
    position: Option<&PagePosition>,
) -> Page {
    let credentials = credentials();
    let context = FetchContext {
        stream,
        parent: parent.map(|(external_id, payload)| ParentRecord {
            external_id,
            payload,
        }),
        credentials: &credentials,
        since: None,
        credential_store: &NoCredentialStore,
        base_url: None,
    };
    provider.fetch_page(&context, position).await.unwrap()
}

/// Walks `stream` (for `parent`, if given) to its end: the ids of each page.
async fn walk_pages(
    provider: &RestProvider,
    stream: &str,
    parent: Option<(&str, &str)>,
) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut position = None;
    for _ in 0..10 {
        let page = fetch(provider, stream, parent, position.as_ref()).await;
        assert_eq!(page.parent_gone, None, "{stream}");
        pages.push(ids(&page.items));
        match page.next {
            Some(next) => position = Some(next),
            None => return pages,
        }
    }
    panic!("the walk of {stream} did not end after 10 pages: {pages:?}");
}

/// The records of a page as (external id, payload), the way the pipeline stores parents.
fn stored(page: &Page) -> Vec<(String, String)> {
    page.items
        .iter()
        .filter_map(|item| match item {
            PageItem::Record(record) => Some((record.external_id.clone(), record.payload.clone())),
            PageItem::Rejected(_) | PageItem::Deleted(_) => None,
        })
        .collect()
}

/// The path and query of every request `server` received, in order.
async fn requests(server: &MockServer) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|request| match request.url.query() {
            Some(query) => format!("{}?{query}", request.url.path()),
            None => request.url.path().to_string(),
        })
        .collect()
}

/// Serves `body` at `route` when the query parameter `cursor` is `cursor` (`None`: absent).
async fn serve(server: &MockServer, route: &str, cursor: Option<&str>, body: Value) {
    let mock = Mock::given(method("GET")).and(path(route));
    let mock = match cursor {
        Some(cursor) => mock.and(query_param("cursor", cursor)),
        None => mock.and(query_param_is_missing("cursor")),
    };
    mock.respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(1)
        .mount(server)
        .await;
}

/// Two top-level resources and a child of one of them, all paged by cursor.
fn projects_users_tasks() -> Value {
    json!({
        "pagination": {"type": "cursor", "cursor_path": "next", "cursor_param": "cursor"},
        "resources": {
            "projects": {"path": "/v1/projects"},
            "users": {"path": "/v1/users", "records_path": "users", "id_field": "login"},
            "tasks": {"parent": "projects", "path": "/v1/projects/{parent.id}/tasks"},
        },
    })
}

#[tokio::test]
async fn a_child_resource_lists_each_parents_records_across_pages() {
    let server = MockServer::start().await;
    serve(
        &server,
        "/v1/projects",
        None,
        json!({"data": [{"id": 1, "name": "one"}], "next": "p2"}),
    )
    .await;
    serve(
        &server,
        "/v1/projects",
        Some("p2"),
        json!({"data": [{"id": "a b/c"}], "next": null}),
    )
    .await;
    serve(
        &server,
        "/v1/users",
        None,
        json!({"users": [{"login": "ann"}, {"login": "bob"}]}),
    )
    .await;
    serve(
        &server,
        "/v1/projects/1/tasks",
        None,
        json!({"data": [{"id": 11}, {"id": 12}], "next": "t2"}),
    )
    .await;
    serve(
        &server,
        "/v1/projects/1/tasks",
        Some("t2"),
        json!({"data": [{"id": 13}], "next": ""}),
    )
    .await;
    serve(
        &server,
        "/v1/projects/a%20b%2Fc/tasks",
        None,
        json!({"data": [{"id": 21}]}),
    )
    .await;
    let provider = provider(&server, projects_users_tasks());

    // The pipeline stores the parent stream first, then walks its records in order.
    let first = fetch(&provider, "projects", None, None).await;
    let second = fetch(&provider, "projects", None, first.next.as_ref()).await;
    assert_eq!(second.next, None);
    let parents: Vec<(String, String)> =
        stored(&first).into_iter().chain(stored(&second)).collect();
    assert_eq!(parents[0], ("1".into(), r#"{"id":1,"name":"one"}"#.into()));
    assert_eq!(parents[1].0, "a b/c");
    let users = walk_pages(&provider, "users", None).await;
    assert_eq!(users, [["ann", "bob"]]);
    let mut tasks = Vec::new();
    for (external_id, payload) in &parents {
        tasks.push(walk_pages(&provider, "tasks", Some((external_id, payload))).await);
    }
    assert_eq!(
        tasks,
        [vec![vec!["11", "12"], vec!["13"]], vec![vec!["21"]]]
    );
    assert_eq!(
        requests(&server).await,
        [
            "/v1/projects",
            "/v1/projects?cursor=p2",
            "/v1/users",
            "/v1/projects/1/tasks",
            "/v1/projects/1/tasks?cursor=t2",
            "/v1/projects/a%20b%2Fc/tasks",
        ]
    );
}

#[tokio::test]
async fn a_child_resources_query_and_headers_carry_the_parents_fields() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/tasks"))
        .and(query_param("project", "7"))
        .and(query_param("owner", "ann & co"))
        .and(query_param("raw", "{literal}"))
        .and(query_param("team", "core"))
        .and(header("X-Owner", "ann & co"))
        .and(header("X-Project", "project-7"))
        .and(header("X-Client", "tributary"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": 1}]})))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({
            "query": {"team": "core"},
            "headers": {"X-Client": "tributary"},
            "fields": ["owner.login"],
            "resources": {"tasks": {
                "parent": "records",
                "path": "/v1/tasks",
                "query": {"project": "{parent.id}", "owner": "{parent.owner.login}",
                          "raw": "{{literal}}"},
                "headers": {"X-Owner": "{parent.owner.login}", "X-Project": "project-{parent.id}"},
            }},
        }),
    );
    let parent = r#"{"id": 7, "owner": {"login": "ann & co"}}"#;
    let page = fetch(&provider, "tasks", Some(("7", parent)), None).await;
    assert_eq!(ids(&page.items), ["1"]);
    let received = server.received_requests().await.unwrap();
    assert_eq!(
        received[0].url.query(),
        Some("owner=ann+%26+co&project=7&raw=%7Bliteral%7D&team=core")
    );
}

#[tokio::test]
async fn resources_inherit_the_top_level_keys_they_do_not_set() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/inherits"))
        .and(query_param("team", "core"))
        .and(query_param("page", "1"))
        .and(query_param("limit", "2"))
        .and(header("X-Client", "tributary"))
        .and(header("X-Trace", "top"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": 1}, {"id": 2}]})),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/v1/inherits"))
        .and(query_param("page", "2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": 3}]})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/v1/overrides"))
        .and(query_param("team", "ops"))
        .and(query_param("q", "open"))
        .and(query_param_is_missing("page"))
        .and(query_param_is_missing("limit"))
        .and(header("X-Client", "tributary"))
        .and(header("X-Trace", "own"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"items": [{"key": "k1", "id": 9}]})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({
            "query": {"team": "core"},
            "headers": {"X-Client": "tributary", "X-Trace": "top"},
            "pagination": {"type": "page", "page_size_param": "limit", "page_size": 2},
            "resources": {
                "inherits": {"path": "/v1/inherits"},
                "overrides": {
                    "path": "/v1/overrides",
                    "records_path": "items",
                    "id_field": "key",
                    "pagination": {"type": "none"},
                    "query": {"team": "ops", "q": "open"},
                    "headers": {"x-trace": "own"},
                },
            },
        }),
    );
    assert_eq!(
        walk_pages(&provider, "inherits", None).await,
        [vec!["1", "2"], vec!["3"]]
    );
    assert_eq!(walk_pages(&provider, "overrides", None).await, [["k1"]]);
    let received = server.received_requests().await.unwrap();
    let trace: Vec<_> = received[2].headers.get_all("x-trace").iter().collect();
    assert_eq!(
        trace,
        ["own"],
        "the resource's header replaces the top-level one"
    );
}

#[tokio::test]
async fn a_parent_without_a_usable_field_is_gone_and_costs_only_that_parent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/users/ann/repos"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": 1}]})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/users/gone/repos"))
        .respond_with(ResponseTemplate::new(404).set_body_string("no such user"))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({
            "fields": ["owner.login"],
            "resources": {"repos": {"parent": "records", "path": "/v1/users/{parent.owner.login}/repos"}},
        }),
    );
    let cases = [
        (r#"{"id": 1}"#, "has no field `owner.login`"),
        (
            r#"{"id": 2, "owner": {"login": null}}"#,
            "has null in `owner.login`, expected a string or an integer",
        ),
        (
            r#"{"id": 3, "owner": {"login": ["x"]}}"#,
            "has an array in `owner.login`",
        ),
        (
            r#"{"id": 4, "owner": {"login": ".."}}"#,
            "cannot be a segment",
        ),
    ];
    for (payload, expected) in cases {
        let page = fetch(&provider, "repos", Some(("p", payload)), None).await;
        let reason = page.parent_gone.unwrap();
        assert!(
            reason.starts_with("the parent record \"p\" of stream \"records\"")
                && reason.contains(expected)
                && reason.ends_with("which resources.repos.path names"),
            "{reason}"
        );
        assert!(page.items.is_empty() && page.next.is_none());
    }
    let gone = fetch(
        &provider,
        "repos",
        Some(("9", r#"{"owner": {"login": "gone"}}"#)),
        None,
    )
    .await;
    let reason = gone.parent_gone.unwrap();
    assert!(
        reason.starts_with("the API answered 404 listing the children of parent record \"9\""),
        "{reason}"
    );
    let fine = fetch(
        &provider,
        "repos",
        Some(("8", r#"{"owner": {"login": "ann"}}"#)),
        None,
    )
    .await;
    assert_eq!(
        (ids(&fine.items), fine.parent_gone),
        (vec!["1".into()], None)
    );
    assert_eq!(
        requests(&server).await,
        ["/v1/users/gone/repos", "/v1/users/ann/repos"],
        "a parent without the field is never asked for"
    );
}

#[tokio::test]
async fn a_child_stream_without_a_parent_record_or_an_unknown_stream_is_an_error() {
    let server = MockServer::start().await;
    let provider = provider(&server, projects_users_tasks());
    let credentials = credentials();
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "tasks"), None)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("listed once per record of projects"),
        "{error}"
    );
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "comments"), None)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("rest has no stream \"comments\""),
        "{error}"
    );
}

#[test]
fn streams_lists_records_first_then_the_resources_with_their_parents() {
    let text = r#"
        [providers.acme]
        kind = "rest"
        base_url = "https://api.acme.example"
        path = "/v1/items"
        records_path = "data"

        [providers.acme.resources.users]
        path = "/v1/users"

        # As the module documentation shows it.
        [providers.acme.resources.projects]
        path = "/v1/projects"
        fields = ["owner.login"]

        [providers.acme.resources.tasks]
        parent = "projects"
        path = "/v1/projects/{parent.id}/tasks"
        query = { owner = "{parent.owner.login}" }
        records_filter = { field = "status", not_in = ["deleted"] }

        [providers.acme.resources.comments]
        parent = "tasks"
        path = "/v1/tasks/{parent.id}/comments"
    "#;
    let document: toml::Table = toml::from_str(text).unwrap();
    let config = ProviderConfig::deserialize(document["providers"]["acme"].clone()).unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.streams(),
        [
            StreamSpec::top("records"),
            StreamSpec::child("comments", "tasks"),
            StreamSpec::top("projects"),
            StreamSpec::child("tasks", "projects"),
            StreamSpec::top("users"),
        ]
    );
    let minimal: ProviderConfig =
        serde_json::from_value(json!({"kind": "rest", "base_url": "https://h"})).unwrap();
    assert_eq!(minimal.streams(), [StreamSpec::top("records")]);
}

#[test]
fn resource_settings_that_cannot_work_are_refused_naming_the_key() {
    let with = |resources: Value| invalid_rest(json!({"resources": resources}));
    let cases = [
        (
            json!({"tasks": {"parent": "projects", "path": "/t"}}),
            "resources.tasks.parent \"projects\" is not a stream of this provider; expected \
             one of: \"records\", \"tasks\"",
        ),
        (
            json!({"a": {"parent": "b", "path": "/a"}, "b": {"parent": "a", "path": "/b"}}),
            "resources.a.parent makes the parents a cycle (a -> b -> a)",
        ),
        (
            json!({"a": {"parent": "a", "path": "/a"}}),
            "resources.a.parent makes the parents a cycle (a -> a)",
        ),
        (
            json!({"tasks": {"path": "/p/{parent.id}/tasks"}}),
            "resources.tasks.path names {parent.id}, but resources.tasks has no parent",
        ),
        (
            json!({"tasks": {"path": "/t", "query": {"p": "{parent.id}"}}}),
            "resources.tasks.query.p names {parent.id}, but resources.tasks has no parent",
        ),
        (
            json!({"tasks": {"parent": "records", "path": "/p/{parent.owner.login}"}}),
            "resources.tasks.path names {parent.owner.login}, a field the parent stream \
             \"records\" does not have",
        ),
        (
            json!({"p": {"path": "/p", "id_field": "key"},
                   "t": {"parent": "p", "path": "/t", "headers": {"X-P": "{parent.id}"}}}),
            "resources.t.headers.X-P names {parent.id}, a field the parent stream \"p\" does \
             not have: a parent has its id_field, its key_fields, its incremental.cursor_field \
             and the fields its `fields` lists; add \"id\" to resources.p.fields",
        ),
        (
            json!({"tasks": {"parent": "records", "path": "/p/{parent.id"}}),
            "resources.tasks.path has a `{` at byte 3 that is not closed",
        ),
        (
            json!({"tasks": {"parent": "records", "path": "/t", "query": {"q": "{id}"}}}),
            "resources.tasks.query.q has the placeholder `{id}`, expected `{parent.FIELD}`",
        ),
        (
            json!({"tasks": {"parent": "records", "path": "/t", "headers": {"X-A": "a}"}}}),
            "resources.tasks.headers.X-A has a `}` at byte 1 that closes no placeholder",
        ),
        (
            json!({"Tasks": {"path": "/t"}}),
            "resources.\"Tasks\" is not a valid resource name",
        ),
        (
            json!({"my-tasks": {"path": "/t"}}),
            "resources.\"my-tasks\" is not a valid resource name",
        ),
        (
            json!({"records": {"path": "/t"}}),
            "resources.records is not a valid resource name",
        ),
        (
            json!({"tasks": {"path": "/t", "pagination": {"type": "cursor"}}}),
            "resources.tasks: pagination.cursor_path is required",
        ),
        (
            json!({"tasks": {"path": "/t", "records_filter": {"field": "s"}}}),
            "resources.tasks: records_filter needs one test",
        ),
    ];
    for (resources, expected) in cases {
        let message = with(resources.clone());
        assert!(message.starts_with(expected), "{resources}:\n{message}");
    }
}

#[test]
fn templates_may_name_the_parents_id_key_cursor_and_listed_fields() {
    let valid = |extra: Value| {
        let mut value = json!({"kind": "rest", "base_url": "https://api.example.com"});
        if let (Some(base), Value::Object(extra)) = (value.as_object_mut(), extra) {
            base.extend(extra);
        }
        let config: ProviderConfig = serde_json::from_value(value).unwrap();
        config.validate()
    };
    let child = |path: &str| json!({"parent": "p", "path": path});
    let cases = [
        (json!({"path": "/p"}), "/c/{parent.id}"),
        (
            json!({"path": "/p", "id_field": "meta.uid"}),
            "/c/{parent.meta.uid}",
        ),
        (
            json!({"path": "/p", "key_fields": ["a", "b"]}),
            "/c/{parent.a}/{parent.b}",
        ),
        (
            json!({"path": "/p", "incremental": {"cursor_field": "updated_at", "param": "since"}}),
            "/c/{parent.updated_at}",
        ),
        (
            json!({"path": "/p", "fields": ["owner.login"]}),
            "/c/{parent.owner.login}",
        ),
        (
            json!({"path": "/p", "fields": ["\"a.b\""]}),
            "/c/{parent.\"a.b\"}",
        ),
        (json!({"path": "/p"}), "/c/{{literal}}/{parent.id}"),
    ];
    for (parent, path) in cases {
        let resources = json!({"resources": {"p": parent, "c": child(path)}});
        assert_eq!(valid(resources.clone()), Ok(()), "{resources}");
    }
    // The top-level id field is inherited by a resource that sets no id of its own.
    let inherited = json!({"id_field": "uid", "resources": {"p": {"path": "/p"},
                            "c": child("/c/{parent.uid}")}});
    assert_eq!(valid(inherited), Ok(()));
    // Top-level values are never templates: their braces are sent as they are.
    let literal = json!({"path": "/v1/{id}", "query": {"filter": "{\"a\":1}"}});
    assert_eq!(valid(literal), Ok(()));
}

#[tokio::test]
async fn each_stream_keys_its_records_as_its_own_settings_say() {
    let server = MockServer::start().await;
    let provider = provider(&server, projects_users_tasks());
    // Replays re-key stored payloads with the failed run's stream's spec.
    assert_eq!(
        provider.id_spec_of("users"),
        crate::IdSpec::Field("login".to_string())
    );
    assert_eq!(
        provider.id_spec_of("tasks"),
        crate::IdSpec::Field("id".to_string())
    );
    assert_eq!(provider.id_spec_of("records"), provider.id_spec());
}
