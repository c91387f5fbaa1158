//! A provider's `streams` read through `Settings`, as a config file reaches them.

use std::path::Path;

use crate::config::{ConfigError, Settings};

fn parse(name: &str, streams: Option<&str>) -> Result<Settings, ConfigError> {
    let streams = streams
        .map(|streams| format!("streams = {streams}\n"))
        .unwrap_or_default();
    let text = format!(
        "[database]\nurl = \"sqlite://t.db\"\n[providers.{name}]\nkind = \"github\"\n\
         schedule = \"0 * * * * *\"\n{streams}"
    );
    Settings::parse(Path::new("config.toml"), &text, None, &|_| true)
}

/// The streams a valid table syncs, as (name, namespace, parent).
fn streams(streams: Option<&str>) -> Vec<(String, String, Option<String>)> {
    let settings = parse("gh", streams).expect("valid");
    settings.providers["gh"]
        .streams
        .iter()
        .map(|stream| {
            let parent = stream.parent.as_ref().map(|parent| parent.name.clone());
            (stream.name.clone(), stream.namespace.clone(), parent)
        })
        .collect()
}

fn refused(name: &str, streams: &str) -> (String, String) {
    match parse(name, Some(streams)) {
        Err(ConfigError::Invalid { key, message, .. }) => (key, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn owned(name: &str, namespace: &str, parent: Option<&str>) -> (String, String, Option<String>) {
    (name.into(), namespace.into(), parent.map(Into::into))
}

#[test]
fn without_streams_a_provider_syncs_its_kinds_primary_stream_under_its_own_name() {
    assert_eq!(streams(None), [owned("issues", "gh", None)]);
}

#[test]
fn named_streams_run_parents_first_each_under_its_namespace() {
    assert_eq!(
        streams(Some(r#"["pull_requests", "issues", "repos"]"#)),
        [
            owned("issues", "gh", None),
            owned("repos", "gh.repos", None),
            owned("pull_requests", "gh.pull_requests", Some("repos")),
        ]
    );
}

#[test]
fn streams_the_kind_has_not_or_without_their_parent_are_refused_naming_the_key() {
    let (key, message) = refused("gh", r#"["issues", "wikis"]"#);
    assert_eq!(key, "providers.gh.streams");
    assert_eq!(
        message,
        "unknown stream \"wikis\": kind \"github\" has issues, repos, pull_requests, \
         issue_comments"
    );
    let (_, message) = refused("gh", r#"["issue_comments"]"#);
    assert_eq!(
        message,
        "stream \"issue_comments\" is listed once per stored record of \"repos\", which \
         `streams` does not list: add \"repos\""
    );
    let (_, message) = refused("gh", r#"["repos", "repos"]"#);
    assert_eq!(message, "stream \"repos\" is listed twice");
    let (_, message) = refused("gh", "[]");
    assert!(message.starts_with("expected at least one stream of kind \"github\""));
    let (_, message) = refused("gh", "\"repos\"");
    assert_eq!(message, "expected an array of stream names, got string");
    let (_, message) = refused("gh", "[1]");
    assert_eq!(message, "expected stream names as strings, got integer");
}

#[test]
fn a_namespace_longer_than_its_column_is_refused() {
    let long = "p".repeat(55);
    let (key, message) = refused(&long, r#"["issues", "repos", "pull_requests"]"#);
    assert_eq!(key, format!("providers.{long}.streams"));
    assert!(
        message.starts_with("stream \"pull_requests\" stores its records as provider \"ppp"),
        "{message}"
    );
    assert!(parse(&long, Some(r#"["issues", "repos"]"#)).is_ok());
}
