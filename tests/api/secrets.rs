//! Secrets at rest: credentials sealed in the database (and nowhere in clear in a SQLite
//! file, its WAL or freed pages), swapped rows refused, wrong and too open keys refused
//! before anything is written, rotation that can be stopped and run again, and commands
//! that only read needing no secret.

use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
};
use serde_json::json;
use tributary::credentials::StoredCredentials;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, sync_run};
use tributary::secrets::Keyring;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{
    backend, cursor_provider, mount_cursor_listing, run, spawn_app, test_key, tributary, Backend,
    TestApp,
};

/// Where the database keeps its bytes: on SQLite the file, its WAL and shared memory as
/// they are on disk; on a server, every stored credentials column.
async fn stored_bytes(app: &TestApp) -> Vec<(String, Vec<u8>)> {
    match backend() {
        Backend::Sqlite => ["test.db", "test.db-wal", "test.db-shm"]
            .iter()
            .map(|name| {
                let bytes = std::fs::read(app.dir.path().join(name)).unwrap_or_default();
                (name.to_string(), bytes)
            })
            .collect(),
        _ => connection::Entity::find()
            .all(&app.db)
            .await
            .expect("connections")
            .into_iter()
            .map(|row| {
                (
                    format!("{}@{}", row.user_id, row.provider),
                    row.credentials.into_bytes(),
                )
            })
            .collect(),
    }
}

/// Fails naming the place where any of `secrets` is stored in clear.
pub async fn assert_nowhere_in_clear(app: &TestApp, secrets: &[&str]) {
    let stored = stored_bytes(app).await;
    assert!(!stored.is_empty());
    for (place, bytes) in &stored {
        for secret in secrets {
            let found = bytes
                .windows(secret.len())
                .any(|window| window == secret.as_bytes());
            assert!(!found, "{secret:?} is stored in clear in {place}");
        }
    }
}

async fn status_json(config: &std::path::Path) -> serde_json::Value {
    let status = run(tributary(config).args(["secrets", "status", "--json"]));
    assert_eq!(status.code, 0, "{}", status.stderr);
    serde_json::from_str(&status.stdout).expect("status JSON")
}

#[tokio::test]
async fn credentials_stored_in_clear_are_sealed_at_the_first_start_with_a_key_leaving_no_copy() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, std::time::Duration::ZERO).await;
    // A database from before sealing: written in clear, rewritten twice, and with freed
    // content left as it was.
    if backend() == Backend::Sqlite {
        app.execute("PRAGMA secure_delete = OFF").await;
    }
    let clear = |token: &str| {
        StoredCredentials {
            token: Some(token.to_string()),
            refresh_token: Some(format!("{token}-refresh")),
            ..StoredCredentials::default()
        }
        .to_column()
    };
    let legacy =
        connection::ActiveModel::new_connection("legacy", "acme", false, clear("legacy-0-9c1d"))
            .insert(app.db.main())
            .await
            .unwrap();
    for token in ["legacy-1-9c1d-longer", "legacy-2-9c1d-longer-still"] {
        let mut active: connection::ActiveModel = legacy.clone().into();
        active.credentials = Set(clear(token));
        active.update(app.db.main()).await.unwrap();
    }
    if backend() == Backend::Sqlite {
        let wal = std::fs::read(app.dir.path().join("test.db-wal")).unwrap_or_default();
        let held = |secret: &str| wal.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(held("legacy-0-9c1d"), "the WAL holds the first version");
    }
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let before = status_json(&config).await;
    assert_eq!(before["in_clear"], 1, "{before}");

    let sync = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(sync.code, 0, "{}\n{}", sync.stdout, sync.stderr);
    assert!(
        sync.stdout.contains("alice@acme succeeded"),
        "{}",
        sync.stdout
    );

    let after = status_json(&config).await;
    let key_id = app.db.secrets().current_key_id().unwrap().to_string();
    assert_eq!(after["in_clear"], 0, "{after}");
    assert_eq!(after["sealed_by_key_id"][&key_id], 2, "{after}");
    assert_eq!(
        app.stored_credentials("legacy", "acme")
            .await
            .token
            .as_deref(),
        Some("legacy-2-9c1d-longer-still")
    );
    assert_nowhere_in_clear(
        &app,
        &[
            "legacy-0-9c1d",
            "legacy-1-9c1d",
            "legacy-2-9c1d",
            "token-alice",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_users_row_fails_that_run_and_leaks_nothing() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, std::time::Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 3, std::time::Duration::ZERO).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice", "bob"]))
        .await;
    let rows = connection::Entity::find()
        .order_by_asc(connection::Column::UserId)
        .all(&app.db)
        .await
        .unwrap();
    let mut bob: connection::ActiveModel = rows[1].clone().into();
    bob.credentials = Set(rows[0].credentials.clone());
    bob.update(app.db.main()).await.unwrap();

    let runs = app.sync(&settings).await;
    assert_eq!(runs[0].status, RunStatus::Succeeded, "{:?}", runs[0].error);
    assert_eq!(runs[1].status, RunStatus::Failed);
    let error = runs[1].error.clone().unwrap_or_default();
    assert!(
        error.contains("bob@acme") && error.contains("cannot be decrypted"),
        "{error}"
    );
    assert!(!error.contains("token-"), "{error}");
    let requests = app.api.received_requests().await.unwrap_or_default();
    assert_eq!(
        requests.len(),
        1,
        "only alice's run reached the API, with her own token"
    );
    let records = app.records().await;
    assert!(records.iter().all(|r| r.user_id == "alice") && records.len() == 3);
}

#[tokio::test]
async fn a_wrong_key_refuses_to_start_naming_the_key_and_writes_nothing() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, std::time::Duration::ZERO).await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let config = app.write_config(&providers);
    let first = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(first.code, 0, "{}", first.stderr);
    let stored_before = connection::Entity::find().all(&app.db).await.unwrap();
    let runs_before = sync_run::Entity::find().all(&app.db).await.unwrap().len();

    let other = tempfile::tempdir().unwrap();
    let (other_key, other_keyring) = test_key(other.path());
    let text = app.config_text(&providers).replace(
        &app.key_file.display().to_string(),
        &other_key.display().to_string(),
    );
    let wrong = app.dir.path().join("wrong-key.toml");
    std::fs::write(&wrong, text).unwrap();
    let sync = run(tributary(&wrong).args(["sync", "--quiet"]));
    assert_eq!(sync.code, 1, "{}", sync.stderr);
    let key_id = app.db.secrets().current_key_id().unwrap().to_string();
    assert!(
        sync.stderr.contains("alice@acme")
            && sync.stderr.contains(&key_id)
            && sync.stderr.contains("not configured")
            && sync
                .stderr
                .contains(other_keyring.current_key_id().unwrap()),
        "{}",
        sync.stderr
    );
    assert_eq!(
        connection::Entity::find().all(&app.db).await.unwrap(),
        stored_before
    );
    assert_eq!(
        sync_run::Entity::find().all(&app.db).await.unwrap().len(),
        runs_before
    );
}

#[tokio::test]
async fn a_rotation_stopped_halfway_and_run_again_leaves_every_row_on_the_new_key() {
    let app = spawn_app().await;
    let users = ["alice", "bob", "carol"];
    for user in users {
        mount_cursor_listing(&app.api, user, user, 1, 2, std::time::Duration::ZERO).await;
    }
    let providers = cursor_provider("acme", &app.api.uri(), &users);
    app.settings(&providers).await;
    let old_id = app.db.secrets().current_key_id().unwrap().to_string();

    let new_dir = tempfile::tempdir().unwrap();
    let (new_key, _) = test_key(new_dir.path());
    let rotated = Keyring::load(
        &tributary::config::SecretsSettings {
            key_file: Some(new_key.clone()),
            previous_key_files: vec![app.key_file.clone()],
            ..Default::default()
        },
        &|_| None,
    )
    .unwrap();
    let new_id = rotated.current_key_id().unwrap().to_string();
    // The first row rewritten under the new key and the others not yet, as a rotation
    // killed between two rows' statements leaves them.
    let first = connection::Entity::find()
        .order_by_asc(connection::Column::Id)
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    let stored =
        StoredCredentials::from_column(app.db.secrets(), first.binding(), &first.credentials)
            .unwrap();
    let resealed = stored.to_column_for(&rotated, first.binding()).unwrap();
    let mut row: connection::ActiveModel = first.into();
    row.credentials = Set(resealed);
    row.update(&app.db).await.unwrap();

    let config = app.dir.path().join("rotating.toml");
    let rotating = format!(
        "[database]\nurl = \"{}\"\n[secrets]\nkey_file = \"{}\"\nprevious_key_files = [\"{}\"]\n{providers}",
        app.database_url,
        new_key.display(),
        app.key_file.display()
    );
    std::fs::write(&config, &rotating).unwrap();
    let status = status_json(&config).await;
    assert_eq!(status["sealed_by_key_id"][&new_id], 1, "{status}");
    assert_eq!(status["sealed_by_key_id"][&old_id], 2, "{status}");

    let rotate = run(tributary(&config).args(["secrets", "rotate"]));
    assert_eq!(rotate.code, 0, "{}", rotate.stderr);
    assert!(
        rotate
            .stdout
            .contains(&format!("Re-sealed 2 connection(s) under key {new_id}")),
        "{}",
        rotate.stdout
    );
    let again = run(tributary(&config).args(["secrets", "rotate"]));
    assert!(
        again.stdout.contains("Re-sealed 0 connection(s)"),
        "{}",
        again.stdout
    );
    let status = status_json(&config).await;
    assert_eq!(
        status["sealed_by_key_id"],
        json!({ new_id.clone(): 3 }),
        "{status}"
    );

    // Without the old key, every run still opens its credentials.
    let only_new = app.dir.path().join("only-new.toml");
    std::fs::write(
        &only_new,
        rotating.replace(
            &format!("previous_key_files = [\"{}\"]\n", app.key_file.display()),
            "",
        ),
    )
    .unwrap();
    let sync = run(tributary(&only_new).args(["sync", "--quiet"]));
    assert_eq!(sync.code, 0, "{}\n{}", sync.stdout, sync.stderr);
    assert_eq!(
        sync.stdout.matches("succeeded").count(),
        3,
        "{}",
        sync.stdout
    );
    assert_nowhere_in_clear(&app, &["token-alice", "token-bob", "token-carol"]).await;
}

#[tokio::test]
async fn a_key_file_others_can_read_is_refused_with_the_chmod_that_fixes_it() {
    use std::os::unix::fs::PermissionsExt;
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    std::fs::set_permissions(&app.key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [&["sync", "--quiet"][..], &["check-config"][..]] {
        let output = run(tributary(&config).args(args));
        assert_eq!(output.code, 2, "{args:?}: {}", output.stderr);
        let chmod = format!("chmod 600 {}", app.key_file.display());
        assert!(output.stderr.contains(&chmod), "{}", output.stderr);
    }
    assert!(connection::Entity::find()
        .all(&app.db)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn commands_that_only_read_need_no_token_variable_and_no_key() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, std::time::Duration::ZERO).await;
    let sealing = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    assert_eq!(run(tributary(&sealing).args(["sync", "--quiet"])).code, 0);

    // The same database, now with no key and a token variable that is not set.
    let config = app.dir.path().join("read-only.toml");
    let text = format!(
        "[database]\nurl = \"{}\"\n{}",
        app.database_url,
        cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
            "token = \"token-alice\"",
            "token_env = \"TRIBUTARY_TEST_UNSET_TOKEN\""
        )
    );
    std::fs::write(&config, text).unwrap();
    for args in [
        &["migrate"][..],
        &["runs"][..],
        &["errors", "--open"][..],
        &["changes"][..],
        &["changes", "--head"][..],
        &["notifications"][..],
        &["connections", "list"][..],
        &["secrets", "status"][..],
    ] {
        let output = run(tributary(&config)
            .args(args)
            .env_remove("TRIBUTARY_TEST_UNSET_TOKEN"));
        assert_eq!(output.code, 0, "{args:?}: {}", output.stderr);
        if args[0] == "connections" {
            assert!(
                output.stdout.contains("sealed with key"),
                "{}",
                output.stdout
            );
        }
        if args == ["changes"] {
            // The sync's three records, each an `inserted` change.
            assert_eq!(
                output.stdout.matches(" inserted ").count(),
                3,
                "{}",
                output.stdout
            );
        }
    }
    let check = run(tributary(&config).arg("check-config"));
    assert_eq!(check.code, 2);
    assert!(
        check
            .stderr
            .contains("TRIBUTARY_TEST_UNSET_TOKEN is not set"),
        "{}",
        check.stderr
    );
}

#[tokio::test]
async fn commands_that_only_read_succeed_when_the_key_file_cannot_be_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, std::time::Duration::ZERO).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    assert_eq!(run(tributary(&config).args(["sync", "--quiet"])).code, 0);
    let key_id = status_json(&config).await["current_key_id"]
        .as_str()
        .expect("the key's id")
        .to_string();

    let missing = app.dir.path().join("moved.key");
    std::fs::rename(&app.key_file, &missing).unwrap();
    let unreadable = || {
        std::fs::set_permissions(&missing, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::rename(&missing, &app.key_file).unwrap();
    };
    for (case, break_key) in [
        ("a missing key file", None),
        ("a key file others can read", Some(&unreadable)),
    ] {
        if let Some(break_key) = break_key {
            break_key();
        }
        let list = run(tributary(&config).args(["connections", "list"]));
        assert_eq!(list.code, 0, "{case}: {}", list.stderr);
        assert!(
            list.stdout.contains(&format!("sealed with key {key_id}")),
            "{case}: {}",
            list.stdout
        );
        let status = status_json(&config).await;
        assert_eq!(status["sealed_by_key_id"][&key_id], 1, "{case}: {status}");
        assert!(status["current_key_id"].is_null(), "{case}: {status}");
        for args in [&["changes"][..], &["notifications"][..], &["runs"][..]] {
            let output = run(tributary(&config).args(args));
            assert_eq!(output.code, 0, "{case}, {args:?}: {}", output.stderr);
        }
        // Work that needs the key is still refused.
        assert_eq!(
            run(tributary(&config).args(["sync", "--quiet"])).code,
            2,
            "{case}"
        );
    }
}

/// `connections add` of bob@acme with his token on standard input.
fn add_bob(config: &std::path::Path) -> crate::helpers::Output {
    let args = ["connections", "add", "--provider", "acme", "--user", "bob"];
    run(tributary(config)
        .args(args)
        .arg("--token-stdin")
        .write_stdin("token-bob\n"))
}

#[tokio::test]
async fn without_a_key_a_literal_secret_is_refused_unless_plaintext_is_allowed() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 3, std::time::Duration::ZERO).await;
    let keyless = |extra: &str| {
        let path = app.dir.path().join(format!("keyless{}.toml", extra.len()));
        let text = format!(
            "[database]\nurl = \"{}\"\n{extra}{}",
            app.database_url,
            cursor_provider("acme", &app.api.uri(), &[])
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let config = keyless("");
    let add = add_bob(&config);
    assert_eq!(add.code, 1, "{}", add.stderr);
    assert!(
        add.stderr.contains("no secrets key is configured") && add.stderr.contains("generate-key"),
        "{}",
        add.stderr
    );
    assert!(connection::Entity::find()
        .all(&app.db)
        .await
        .unwrap()
        .is_empty());

    let unsafe_config = keyless("[secrets]\nallow_plaintext = true\n");
    let add = add_bob(&unsafe_config);
    assert_eq!(add.code, 0, "{}", add.stderr);
    assert!(
        add.stderr.contains("allow_plaintext = true") && add.stderr.contains("unsafe"),
        "{}",
        add.stderr
    );
    let row = connection::Entity::find()
        .filter(connection::Column::UserId.eq("bob"))
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(
        row.credentials.contains("token-bob"),
        "stored in clear, as asked"
    );
}

#[tokio::test]
async fn without_a_key_an_oauth_refresh_is_refused_before_the_token_endpoint_is_asked() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_STRAVA_SECRET", "client-secret-value");
    std::env::set_var("TRIBUTARY_TEST_STRAVA_REFRESH", "env-refresh-token");
    std::env::set_var("TRIBUTARY_TEST_STRAVA_ACCESS", "env-access-token");
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&app.api)
        .await;
    let providers = format!(
        "[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"4242\"\nclient_secret_env = \"TRIBUTARY_TEST_STRAVA_SECRET\"\n\
         schedule = \"0 * * * * *\"\n\
         [[providers.strava.connections]]\nuser_id = \"alice\"\ntoken_env = \"TRIBUTARY_TEST_STRAVA_ACCESS\"\n\
         refresh_token_env = \"TRIBUTARY_TEST_STRAVA_REFRESH\"\nexpires_at = 1\n",
        uri = app.api.uri()
    );
    let settings = app.settings(&providers).await;
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(
        row.credentials.contains("TRIBUTARY_TEST_STRAVA_REFRESH"),
        "names only, in clear"
    );
    let keyless = app.db.clone().with_keyring(Keyring::none());
    let outcome = tributary::sync::sync_matching(
        &keyless,
        &settings,
        &tributary::sync::SyncFilter::default(),
        &tributary::pipeline::RunOptions::manual(),
        &tributary::pipeline::NoProgress,
    )
    .await
    .unwrap()
    .outcomes
    .remove(0);
    assert_eq!(outcome.status, RunStatus::Failed);
    let error = outcome.error.unwrap_or_default();
    assert!(
        error.contains("OAuth refresh of alice@strava") && error.contains("generate-key"),
        "{error}"
    );
    app.api.verify().await;
}

#[tokio::test]
async fn generate_key_writes_a_private_key_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("new.key");
    let config = dir.path().join("absent.toml");
    let first = run(tributary(&config)
        .args(["secrets", "generate-key", "--out"])
        .arg(&key));
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stdout.contains("key id "), "{}", first.stdout);
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let written = std::fs::read(&key).unwrap();
    let again = run(tributary(&config)
        .args(["secrets", "generate-key", "--out"])
        .arg(&key));
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("new.key"), "{}", again.stderr);
    assert_eq!(std::fs::read(&key).unwrap(), written, "never overwritten");
}

/// How many connections hold a secret sealed under the new key and under the old one,
/// read in one statement: a killed rotation's last update may still commit on a server
/// after the kill, and counted in two reads that row could fall between them.
async fn sealed_under(app: &TestApp, new_id: &str, old_id: &str) -> (usize, usize) {
    let credentials: Vec<String> = connection::Entity::find()
        .select_only()
        .column(connection::Column::Credentials)
        .into_tuple()
        .all(&app.db)
        .await
        .expect("connections");
    let under = |key_id: &str| {
        let prefix = format!("sealed:v1:{key_id}:");
        credentials.iter().filter(|c| c.contains(&prefix)).count()
    };
    (under(new_id), under(old_id))
}

#[tokio::test]
async fn a_rotation_killed_mid_way_and_run_again_leaves_every_row_on_the_new_key() {
    let app = spawn_app().await;
    let users: Vec<String> = (0..1500).map(|n| format!("u{n:04}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    let providers = cursor_provider("acme", &app.api.uri(), &users);
    app.settings(&providers).await;
    let old_id = app.db.secrets().current_key_id().unwrap().to_string();
    let new_dir = tempfile::tempdir().unwrap();
    let (new_key, rotated) = test_key(new_dir.path());
    let new_id = rotated.current_key_id().unwrap().to_string();
    let config = app.dir.path().join("rotating.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{}\"\n[secrets]\nkey_file = \"{}\"\nprevious_key_files = [\"{}\"]\n{providers}",
            app.database_url,
            new_key.display(),
            app.key_file.display()
        ),
    )
    .unwrap();

    // SIGKILL the rotation as soon as its first rows are on the new key.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .args(["secrets", "rotate"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("TRIBUTARY_SECRETS_KEY")
        .env_remove("CREDENTIALS_DIRECTORY")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("rotation starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sealed_under(&app, &new_id, &old_id).await.0 == 0 && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    child.kill().expect("killed");
    let _ = child.wait();
    let (on_new, on_old) = sealed_under(&app, &new_id, &old_id).await;
    assert!(on_new > 0, "the rotation never started");
    assert_eq!(
        on_new + on_old,
        users.len(),
        "every row is on one key or the other"
    );
    eprintln!("killed with {on_new} of {} rows rotated", users.len());

    let again = run(tributary(&config).args(["secrets", "rotate"]));
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(sealed_under(&app, &new_id, &old_id).await, (users.len(), 0));
    let status = status_json(&config).await;
    assert_eq!(
        status["sealed_by_key_id"],
        json!({ new_id.clone(): users.len() }),
        "{status}"
    );
}
