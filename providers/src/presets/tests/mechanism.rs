//! `apply`: the merge, its errors, and every preset file read with only what it requires.

use super::*;
use crate::presets::names;
use crate::rest::{Auth, PaginationType};

/// The rest config of a user's provider table.
fn rest(text: &str) -> crate::rest::RestConfig {
    match config(text).unwrap() {
        ProviderConfig::Rest(config) => config,
        other => panic!("expected a rest config, got {other:?}"),
    }
}

#[test]
fn a_table_without_preset_is_left_as_it_is() {
    let text = "kind = \"rest\"\nbase_url = \"https://api.example.com\"\n";
    let mut own = table(text);
    apply(&mut own).unwrap();
    assert_eq!(own, table(text));
}

#[test]
fn the_users_keys_win_over_the_presets() {
    let config = rest(
        r#"
        preset = "gitlab_issues"
        base_url = "https://gitlab.example.com/api/v4"
        path = "/groups/7/issues"
        auth = "bearer"
        "#,
    );
    assert_eq!(
        config.base_url.as_str(),
        "https://gitlab.example.com/api/v4"
    );
    assert_eq!(config.path, "/groups/7/issues");
    assert_eq!(config.auth, Auth::Bearer);
    // What the user left out is the preset's.
    assert_eq!(config.pagination.kind, PaginationType::Link);
}

#[test]
fn nested_tables_merge_key_by_key() {
    let config = rest(
        r#"
        preset = "gitlab_issues"
        path = "/projects/42/issues"
        query = { state = "opened", sort = "asc" }
        pagination = { page_size = 20 }
        incremental = { lookback = "5m" }
        "#,
    );
    let query: Vec<(&str, &str)> = config
        .query
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    assert_eq!(
        query,
        [
            ("order_by", "updated_at"),
            ("scope", "all"),
            ("sort", "asc"),
            ("state", "opened"),
        ]
    );
    assert_eq!(config.pagination.kind, PaginationType::Link);
    assert_eq!(
        config.pagination.page_size_param.as_deref(),
        Some("per_page")
    );
    assert_eq!(config.pagination.page_size, 20);
    let incremental = config.incremental.unwrap();
    assert_eq!(incremental.param.as_deref(), Some("updated_after"));
    assert_eq!(incremental.lookback.as_deref(), Some("5m"));
}

#[test]
fn arrays_and_values_are_replaced_whole() {
    let mut base = table(
        r#"
        key_fields = ["a", "b"]
        auth = "bearer"
        pagination = { type = "link", page_size = 100 }
        "#,
    );
    let user = table(
        r#"
        key_fields = ["c"]
        auth = { header = "X-Key" }
        pagination = "none"
        "#,
    );
    crate::presets::merge(&mut base, user.clone());
    assert_eq!(base, user);
}

#[test]
fn the_preset_and_requires_keys_are_gone_after_apply() {
    let mut own = table(&minimal("asana_tasks"));
    apply(&mut own).unwrap();
    assert!(own.get("preset").is_none());
    assert!(own.get("requires").is_none());
    assert_eq!(own["query"]["project"].as_str(), Some("1200000000000000"));
}

#[test]
fn an_unknown_preset_is_refused_with_the_list() {
    let mut own = table("preset = \"shopfy_orders\"\nbase_url = \"https://x.example\"\n");
    let before = own.clone();
    let message = apply(&mut own).unwrap_err();
    assert_eq!(
        message,
        "unknown preset \"shopfy_orders\"; the presets are: asana_tasks, freshdesk_tickets, \
         gitlab_issues, harvest_time_entries, pipedrive_deals, shopify_orders"
    );
    assert_eq!(own, before, "a refused table is left as it was");
}

#[test]
fn a_preset_that_is_not_a_string_is_refused() {
    let message = apply(&mut table("preset = 3\n")).unwrap_err();
    assert!(
        message.starts_with("preset must be a string naming a preset"),
        "{message}"
    );
    assert!(message.ends_with("not integer"), "{message}");
}

#[test]
fn another_kind_is_refused() {
    let message = apply(&mut table(
        "preset = \"gitlab_issues\"\nkind = \"github\"\n",
    ))
    .unwrap_err();
    assert!(
        message.contains("preset \"gitlab_issues\" is kind = \"rest\""),
        "{message}"
    );
    // The same kind is harmless.
    rest("preset = \"gitlab_issues\"\nkind = \"rest\"\npath = \"/issues\"\n");
}

#[test]
fn a_missing_required_key_is_named_with_what_to_give() {
    for (preset, key) in [
        ("shopify_orders", "base_url"),
        ("freshdesk_tickets", "base_url"),
        ("harvest_time_entries", "headers.Harvest-Account-Id"),
        ("asana_tasks", "query.project"),
        ("gitlab_issues", "path"),
    ] {
        let message = apply(&mut table(&format!("preset = \"{preset}\"\n"))).unwrap_err();
        assert!(
            message.starts_with(&format!("preset \"{preset}\" needs {key}: ")),
            "{message}"
        );
    }
}

/// The least a user writes for each preset: only what its `[requires]` names.
fn minimal(preset: &str) -> String {
    let own = match preset {
        "shopify_orders" => "base_url = \"https://example.myshopify.com\"",
        "freshdesk_tickets" => "base_url = \"https://example.freshdesk.com\"",
        "harvest_time_entries" => "headers = { \"Harvest-Account-Id\" = \"123456\" }",
        "asana_tasks" => "query = { project = \"1200000000000000\" }",
        "gitlab_issues" => "path = \"/groups/7/issues\"",
        _ => "",
    };
    format!("preset = \"{preset}\"\n{own}\n")
}

#[test]
fn every_preset_parses_and_validates_with_only_what_it_requires() {
    assert_eq!(names().len(), 6);
    for preset in names() {
        let config = config(&minimal(preset)).unwrap_or_else(|err| panic!("{preset}: {err}"));
        let ProviderConfig::Rest(rest) = &config else {
            panic!("{preset}: expected kind = \"rest\", got {}", config.kind());
        };
        assert!(
            rest.base_url.scheme() == "https",
            "{preset}: {}",
            rest.base_url
        );
        assert!(rest.incremental.is_some(), "{preset} is not incremental");
        assert_ne!(rest.pagination.kind, PaginationType::None, "{preset}");
        assert!(config.needs_token(), "{preset}");
        build_provider(&config, &HttpSettings::default())
            .unwrap_or_else(|err| panic!("{preset}: {err}"));
    }
}

#[test]
fn no_preset_file_holds_a_secret_or_tributary_keys() {
    for (preset, text) in names().iter().zip(super::super::FILES) {
        let parsed: toml::Table = text.parse().unwrap();
        for key in ["token", "token_env", "connections", "schedule", "preset"] {
            assert!(!parsed.contains_key(key), "{preset} sets {key}");
        }
        // Only auth says how the token is sent; no header carries a value of its own
        // beyond the static ones the API documents.
        if let Some(headers) = parsed.get("headers").and_then(|h| h.as_table()) {
            assert!(headers.is_empty(), "{preset} sets headers {headers:?}");
        }
        assert_eq!(parsed["kind"].as_str(), Some("rest"), "{preset}");
    }
}

/// The first cells of the rows of the table whose header starts `| Preset |`.
fn preset_table(readme: &str) -> Vec<&str> {
    let mut lines = readme
        .lines()
        .skip_while(|line| !line.to_lowercase().starts_with("| preset |"))
        .skip(2);
    let mut listed = Vec::new();
    while let Some(row) = lines.next().filter(|line| line.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or_default().trim();
        listed.push(first.trim_matches('`'));
    }
    listed.sort_unstable();
    listed
}

#[test]
fn both_readmes_list_every_preset_and_no_other() {
    let presets_readme = include_str!("../../../presets/README.md");
    let root_readme = include_str!("../../../../README.md");
    assert_eq!(preset_table(presets_readme), names(), "presets/README.md");
    assert_eq!(preset_table(root_readme), names(), "README.md");
}

#[test]
fn a_required_header_is_found_in_any_case_and_sent_once() {
    let config = rest(
        "preset = \"harvest_time_entries\"\nheaders = { \"harvest-account-id\" = \"123456\" }\n",
    );
    assert_eq!(
        config.headers.get("harvest-account-id").map(String::as_str),
        Some("123456")
    );
    // A user's header replaces a preset's of the same name in another case.
    let mut base = table("[headers]\nAccept = \"application/json\"\n");
    crate::presets::merge(&mut base, table("[headers]\naccept = \"text/csv\"\n"));
    assert_eq!(base, table("[headers]\naccept = \"text/csv\"\n"));
}

#[test]
fn an_empty_required_value_is_refused_naming_the_key() {
    for (preset, own, key) in [
        (
            "harvest_time_entries",
            "headers = { \"harvest-account-id\" = \"\" }",
            "headers.harvest-account-id",
        ),
        (
            "asana_tasks",
            "query = { project = \" \" }",
            "query.project",
        ),
        ("shopify_orders", "base_url = \"\"", "base_url"),
    ] {
        let message = apply(&mut table(&format!("preset = \"{preset}\"\n{own}\n"))).unwrap_err();
        assert!(
            message.starts_with(&format!("{key} is empty; preset \"{preset}\" needs ")),
            "{message}"
        );
    }
}

/// `minimal(preset)` authenticating with OAuth2 instead of the preset's key.
fn with_oauth2(preset: &str) -> String {
    format!(
        "{}auth = {{ oauth2 = \"refresh_token\", client_id = \"app-1\", client_secret_env = \"APP_SECRET\" }}\n",
        minimal(preset)
    )
}

#[test]
fn the_presets_whose_apis_offer_oauth2_authorize_at_the_documented_endpoints() {
    use crate::oauth2::ClientAuth;
    // (preset, authorization endpoint, token endpoint, PKCE, client authentication, scope)
    let documented = [
        (
            "gitlab_issues",
            "https://gitlab.com/oauth/authorize",
            "https://gitlab.com/oauth/token",
            true,
            ClientAuth::Post,
            Some("read_api"),
        ),
        (
            "asana_tasks",
            "https://app.asana.com/-/oauth_authorize",
            "https://app.asana.com/-/oauth_token",
            true,
            ClientAuth::Post,
            None,
        ),
        (
            "harvest_time_entries",
            "https://id.getharvest.com/oauth2/authorize",
            "https://id.getharvest.com/api/v2/oauth2/token",
            false,
            ClientAuth::Post,
            None,
        ),
        (
            "pipedrive_deals",
            "https://oauth.pipedrive.com/oauth/authorize",
            "https://oauth.pipedrive.com/oauth/token",
            false,
            ClientAuth::Basic,
            None,
        ),
    ];
    for (preset, authorize, token, pkce, client_auth, scope) in documented {
        let oauth = config(&with_oauth2(preset)).unwrap_or_else(|err| panic!("{preset}: {err}"));
        let app = oauth
            .authorization()
            .unwrap_or_else(|| panic!("{preset} offers no authorization"));
        assert_eq!(app.authorize_url.as_str(), authorize, "{preset}");
        assert_eq!(app.token_url.as_str(), token, "{preset}");
        assert_eq!(app.pkce, pkce, "{preset}");
        assert_eq!(app.client_auth, client_auth, "{preset}");
        assert_eq!(app.scope.as_deref(), scope, "{preset}");
        assert_eq!(app.client_id, "app-1", "{preset}");
        assert_eq!(app.client_secret_env.as_deref(), Some("APP_SECRET"));
        // Without `auth = { oauth2 ... }` the preset keeps its key and offers no consent.
        let keyed = config(&minimal(preset)).unwrap();
        assert!(keyed.authorization().is_none(), "{preset}");
    }
}

#[test]
fn the_users_oauth2_endpoints_win_and_a_preset_without_oauth2_keeps_none_of_its_auth() {
    let own = format!(
        "{}auth = {{ oauth2 = \"refresh_token\", client_id = \"app-1\", \
         authorize_url = \"https://git.example.com/oauth/authorize\", \
         token_url = \"https://git.example.com/oauth/token\" }}\n",
        minimal("gitlab_issues")
    );
    let app = config(&own).unwrap().authorization().unwrap();
    assert_eq!(
        app.authorize_url.as_str(),
        "https://git.example.com/oauth/authorize"
    );
    assert_eq!(
        app.token_url.as_str(),
        "https://git.example.com/oauth/token"
    );
    assert!(app.pkce);
    // Freshdesk offers no OAuth2 here: the user's table is the whole `auth`.
    let own = format!(
        "{}auth = {{ oauth2 = \"refresh_token\", client_id = \"app-1\", \
         token_url = \"https://auth.example.com/token\" }}\n",
        minimal("freshdesk_tickets")
    );
    let rest = rest(&own);
    assert!(matches!(rest.auth, Auth::OAuth2(_)), "{:?}", rest.auth);
}
