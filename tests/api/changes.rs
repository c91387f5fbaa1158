//! The change feed: every insert and content update becomes a change, readable in order
//! behind a cursor (commit order where the clock ticks, the order transactions began
//! writing on PostgreSQL), with no change twice and none missed, even when transactions
//! commit out of the order in which they began writing; an unchanged re-sync adds none;
//! a cursor older than the retention is refused with a message to resync.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, EntityTrait,
    PaginatorTrait, QueryFilter, QueryOrder, Statement, TransactionTrait,
};
use serde_json::{json, Value};
use tributary::config::{DatabaseSettings, WriteMode};
use tributary::entities::change::ChangeKind;
use tributary::entities::{change, change_batch, change_clock, connection};
use tributary::pipeline::changes::{self, Cursor, FeedChange, FeedCursor, FeedError, FeedQuery};
use tributary::pipeline::{PageExpectation, PageStoreCounts, Run, RunPage};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, Record, RecordStage, RejectedRecord};

use crate::helpers::{
    backend, cursor_provider, items, mount_cursor_listing, mount_cursor_pages, open_run, read_feed,
    run, spawn_app, tributary, Backend, TestApp, LOCK_WAITS_POLL,
};

/// Every change after `since` committed so far, read `limit` at a time, and the cursor
/// after them.
async fn read_all(db: &DatabaseConnection, since: Cursor, limit: u64) -> (Vec<FeedChange>, Cursor) {
    read_feed(db, since, limit).await
}

/// `position` as a reader of `db`'s feed holds it: the text `changes` prints.
async fn issued(db: &DatabaseConnection, position: Cursor) -> String {
    FeedCursor::issued_by(db, position)
        .await
        .expect("the database's id")
        .to_string()
}

/// The position of a cursor `changes` printed.
fn position(text: &str) -> Cursor {
    text.parse::<FeedCursor>().expect("a cursor").position
}

/// The (external id, kind) of each change, in feed order.
fn kinds(changes: &[FeedChange]) -> Vec<(String, ChangeKind)> {
    changes
        .iter()
        .map(|change| (change.external_id.clone(), change.kind))
        .collect()
}

/// The clock's seq.
async fn clock(app: &TestApp) -> i64 {
    change_clock::Entity::find_by_id(1)
        .one(&app.db)
        .await
        .expect("clock")
        .expect("the clock's row")
        .seq
}

async fn batch_count(app: &TestApp) -> u64 {
    change_batch::Entity::find()
        .count(&app.db)
        .await
        .expect("batches")
}

#[tokio::test]
async fn a_first_sync_records_each_insert_and_an_unchanged_resync_records_nothing() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "k", 3, 4, Duration::ZERO).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 12);

    let (feed, head) = read_all(&app.db, Cursor::START, 5).await;
    let mut expected: Vec<String> = (0..12).map(|n| format!("k{n}")).collect();
    expected.sort();
    let mut seen: Vec<String> = feed.iter().map(|c| c.external_id.clone()).collect();
    seen.sort();
    assert_eq!(seen, expected, "each record once");
    assert!(feed.iter().all(|c| c.kind == ChangeKind::Inserted));
    assert!(feed.iter().all(|c| c.run_id == first.run_id && !c.deleted));
    let stored: HashMap<String, String> = app
        .records()
        .await
        .into_iter()
        .map(|r| (r.external_id, r.payload))
        .collect();
    for change in &feed {
        assert_eq!(change.payload.as_ref(), stored.get(&change.external_id));
        assert_eq!((&*change.user_id, &*change.provider), ("alice", "acme"));
        assert!(change.committed_at.is_some());
    }
    // Each page of the listing is one batch, stamped in the order the pages committed.
    assert_eq!(batch_count(&app).await, 3);
    let seqs = app.batch_seqs().await;
    assert_eq!(seqs.len(), 3);
    if backend() == Backend::Postgres {
        // Transaction ids: the head is past the last batch, and the clock never ticks.
        assert!(head >= Cursor::after_batch(seqs[2]), "{head:?} {seqs:?}");
        assert_eq!(clock(&app).await, 0);
    } else {
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(clock(&app).await, 3);
        assert_eq!(head, Cursor::after_batch(3));
    }

    let again = app.sync_one(&settings).await;
    assert_eq!((again.counts.unchanged, again.counts.inserted), (12, 0));
    assert_eq!(
        batch_count(&app).await,
        3,
        "an unchanged re-sync opens no batch"
    );
    assert_eq!(app.batch_seqs().await, seqs, "and takes no seq");
    if backend() != Backend::Postgres {
        assert_eq!(clock(&app).await, 3, "and does not tick the clock");
    }
    let (after, next) = read_all(&app.db, head, 5).await;
    assert!(after.is_empty(), "{after:?}");
    // On PostgreSQL the head moves with every transaction that ends, changes or not.
    assert!(next >= head);
    if backend() != Backend::Postgres {
        assert_eq!(next, head);
    }
}

#[tokio::test]
async fn new_content_is_an_updated_change_with_the_current_payload() {
    let app = spawn_app().await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    app.sync_one(&settings).await;
    let (_, head) = read_all(&app.db, Cursor::START, 100).await;

    app.api.reset().await;
    let mut changed = items("k", "alice", 0..4);
    changed[1]["n"] = json!(100);
    mount_cursor_pages(&app.api, vec![(Value::Array(changed), None)]).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (
            run.counts.inserted,
            run.counts.updated,
            run.counts.unchanged
        ),
        (1, 1, 2)
    );
    let (feed, _) = read_all(&app.db, head, 100).await;
    let mut found = kinds(&feed);
    found.sort();
    assert_eq!(
        found,
        vec![
            ("k1".to_string(), ChangeKind::Updated),
            ("k3".to_string(), ChangeKind::Inserted),
        ]
    );
    let updated = feed.iter().find(|c| c.external_id == "k1").expect("k1");
    let payload: Value =
        serde_json::from_str(updated.payload.as_deref().expect("payload")).expect("json");
    assert_eq!(payload["n"], 100, "the record's content as it is now");
    assert!(feed.iter().all(|c| c.run_id == run.run_id));
}

/// `tributary changes ARGS...` against `config`, its JSON output parsed.
fn changes_json(config: &std::path::Path, args: &[&str]) -> Value {
    let output = run(tributary(config).arg("changes").arg("--json").args(args));
    assert_eq!(output.code, 0, "{}", output.stderr);
    serde_json::from_str(&output.stdout).expect("changes --json prints JSON")
}

#[tokio::test]
async fn the_cli_prints_changes_as_json_and_the_cursor_it_prints_reads_on_without_repeats() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "k", 2, 3, Duration::ZERO).await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let config = app.write_config(&providers);
    let first = app.sync_one(&settings).await;

    let mut cursor: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let mut args = vec!["--limit", "2"];
        if let Some(cursor) = &cursor {
            args.extend(["--since", cursor.as_str()]);
        }
        let page = changes_json(&config, &args);
        let changes = page["changes"].as_array().expect("changes").clone();
        assert!(changes.len() <= 2, "{page}");
        for change in &changes {
            assert_eq!(change["kind"], "inserted");
            assert_eq!(change["user_id"], "alice");
            assert_eq!(change["provider"], "acme");
            assert_eq!(change["run_id"], first.run_id);
            assert_eq!(change["deleted"], false);
            // The payload is the record itself, not a string holding it.
            assert_eq!(change["payload"]["id"], change["external_id"]);
            assert!(change["cursor"]
                .as_str()
                .expect("cursor")
                .starts_with("c2."));
            assert!(change["committed_at"].is_string());
            seen.push(change["external_id"].as_str().expect("id").to_string());
        }
        let next = page["next_cursor"]
            .as_str()
            .expect("next_cursor")
            .to_string();
        assert!(next.starts_with("c2."), "{next}");
        cursor = Some(next);
        if changes.is_empty() {
            break;
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "no change twice: {seen:?}");
    assert_eq!(sorted, ["k0", "k1", "k2", "k3", "k4", "k5"]);

    // The head is where the reader stopped; a change after it is all the next read finds.
    let head = run(tributary(&config).args(["changes", "--head"]));
    assert_eq!(head.code, 0, "{}", head.stderr);
    let head = head.stdout.trim().to_string();
    if backend() == Backend::Postgres {
        // The head follows the server's transactions, which go on.
        assert!(position(&head) >= position(cursor.as_deref().expect("a cursor")));
    } else {
        assert_eq!(Some(&head), cursor.as_ref());
    }
    app.api.reset().await;
    let mut changed = items("k", "alice", 0..3);
    changed[2]["n"] = json!("new");
    mount_cursor_pages(&app.api, vec![(Value::Array(changed), None)]).await;
    app.sync_one(&settings).await;
    let (_, caught_up) = read_all(&app.db, position(&head), 100).await;
    assert!(caught_up > position(&head));
    let after = changes_json(&config, &["--since", &head]);
    let after = after["changes"].as_array().expect("changes");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(
        (&after[0]["external_id"], &after[0]["kind"]),
        (&json!("k2"), &json!("updated"))
    );
    assert_eq!(after[0]["payload"]["n"], "new");

    // The table names each change and ends with the cursor to pass next.
    let table = run(tributary(&config).args(["changes", "--since", &head]));
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.contains("updated") && table.stdout.contains("k2"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("Next cursor: c2."),
        "{}",
        table.stdout
    );
    let filtered = changes_json(&config, &["--provider", "other"]);
    assert_eq!(filtered["changes"], json!([]));
}

#[tokio::test]
async fn a_malformed_cursor_is_refused_naming_it() {
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    for cursor in ["nonsense", "c1.!!", "c1.AAAA"] {
        let output = run(tributary(&config).args(["changes", "--since", cursor]));
        assert_eq!(output.code, 2, "{cursor}: {}", output.stderr);
        assert!(
            output.stderr.contains("malformed change cursor"),
            "{cursor}: {}",
            output.stderr
        );
    }
}

#[tokio::test]
async fn a_huge_malformed_cursor_is_quoted_short() {
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let huge = format!("c1.{}", "x".repeat(100_000));
    let output = run(tributary(&config).args(["changes", "--since", &huge]));
    assert_eq!(
        output.code,
        2,
        "{}",
        &output.stderr[..500.min(output.stderr.len())]
    );
    assert!(
        output.stderr.contains("malformed change cursor") && output.stderr.contains("c1.xxx"),
        "{}",
        &output.stderr[..500.min(output.stderr.len())]
    );
    // The value is quoted twice (clap's echo and the reason): each a short prefix.
    assert!(
        output.stderr.len() < 2_000,
        "{} bytes of error",
        output.stderr.len()
    );
}

#[tokio::test]
async fn a_cursor_older_than_the_retention_is_refused_with_a_resync_message() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let config = app.write_config(&providers);
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    app.sync_one(&settings).await;
    let (_, after_first) = read_all(&app.db, Cursor::START, 100).await;
    app.api.reset().await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..4)), None)]).await;
    app.sync_one(&settings).await;

    // The first run's batch committed two days ago; the retention is a day.
    let first_seq = app.batch_seqs().await[0];
    let two_days_ago = chrono::Utc::now() - chrono::Duration::days(2);
    change_batch::Entity::update_many()
        .col_expr(change_batch::Column::CommittedAt, Expr::value(two_days_ago))
        .filter(change_batch::Column::Seq.eq(first_seq))
        .exec(&app.db)
        .await
        .expect("backdated");
    // The sweep takes only batches a reader may read already: wait until both are.
    read_all(&app.db, after_first, 100).await;
    let swept = changes::sweep_expired_changes(&app.db, Duration::from_secs(24 * 60 * 60))
        .await
        .expect("swept");
    assert_eq!(
        (swept.batches, swept.changes, swept.swept_seq),
        (1, 3, Some(first_seq))
    );
    assert_eq!(
        change::Entity::find()
            .count(&app.db)
            .await
            .expect("changes"),
        1,
        "the second run's change is kept"
    );

    // From the start, or from inside the swept batch: changes are gone, and it says so.
    let inside = Cursor {
        seq: first_seq,
        ordinal: 1,
    };
    for since in [Cursor::START, inside] {
        let since = issued(&app.db, since).await;
        let output = run(tributary(&config).args(["changes", "--since", &since]));
        assert_eq!(output.code, 3, "{since:?}: {}", output.stderr);
        assert!(
            output
                .stderr
                .contains("older than the change feed's retention")
                && output.stderr.contains("copy the records table again"),
            "{}",
            output.stderr
        );
    }
    let query = FeedQuery {
        since: Some(Cursor::START),
        provider: None,
        user_id: None,
        limit: 10,
    };
    let refused = changes::read_changes(&app.db, &query).await;
    assert!(
        matches!(refused, Err(FeedError::Expired { swept, .. }) if swept == first_seq),
        "{refused:?}"
    );

    // A reader that had read the whole swept batch lost nothing and reads on.
    read_all(&app.db, after_first, 100).await;
    let page = changes_json(&config, &["--since", &issued(&app.db, after_first).await]);
    let kept = page["changes"].as_array().expect("changes");
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0]["external_id"], "k3");

    // A cursor from beyond this database's head is refused too.
    // Past the head and every stored batch (on PostgreSQL a batch may be above the head).
    let head = Cursor::head(&app.db).await.expect("head");
    let newest = app.batch_seqs().await.last().copied().unwrap_or(0);
    let ahead = issued(
        &app.db,
        Cursor::after_batch(head.seq.max(newest) + 1_000_000),
    )
    .await;
    let output = run(tributary(&config).args(["changes", "--since", &ahead]));
    assert_eq!(output.code, 3, "{}", output.stderr);
    assert!(
        output
            .stderr
            .contains("is ahead of this database's change feed"),
        "{}",
        output.stderr
    );
}

/// Every deployment sweeps once the retention has passed: a reader that asks for the
/// whole feed (no `--since`) then reads from the first change kept, not an error.
#[tokio::test]
async fn a_read_without_a_cursor_starts_at_the_first_change_kept_after_a_sweep() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let config = app.write_config(&providers);
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    app.sync_one(&settings).await;
    app.api.reset().await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..5)), None)]).await;
    app.sync_one(&settings).await;
    let seqs = app.batch_seqs().await;
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    change_batch::Entity::update_many()
        .col_expr(
            change_batch::Column::CommittedAt,
            Expr::value(chrono::Utc::now() - chrono::Duration::days(2)),
        )
        .filter(change_batch::Column::Seq.eq(seqs[0]))
        .exec(&app.db)
        .await
        .expect("backdated");
    read_all(&app.db, Cursor::START, 100).await;
    let swept = changes::sweep_expired_changes(&app.db, Duration::from_secs(24 * 60 * 60))
        .await
        .expect("swept");
    assert_eq!(swept.swept_seq, Some(seqs[0]));

    let page = changes_json(&config, &[]);
    let kept: Vec<(&str, &str)> = page["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|change| {
            (
                change["external_id"].as_str().expect("id"),
                change["kind"].as_str().expect("kind"),
            )
        })
        .collect();
    assert_eq!(kept, [("k3", "inserted"), ("k4", "inserted")]);
    let table = run(tributary(&config).arg("changes"));
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(table.stdout.contains("k3"), "{}", table.stdout);

    let query = FeedQuery {
        since: None,
        provider: None,
        user_id: None,
        limit: 1,
    };
    let first = changes::read_changes(&app.db, &query).await.expect("read");
    assert_eq!(
        kinds(&first.changes),
        [("k3".to_string(), ChangeKind::Inserted)]
    );
    let (rest, _) = read_all(&app.db, first.next, 100).await;
    assert_eq!(kinds(&rest), [("k4".to_string(), ChangeKind::Inserted)]);
}

/// Two databases' feeds number their changes alike (on PostgreSQL the databases of one
/// cluster even share the transaction ids that number them), so a cursor carries the
/// database that issued it: read on another database it is refused with exit 3, never
/// answered with that database's changes. A cursor of the previous release, which names
/// no database, is refused the same way with a message saying how to start again.
#[tokio::test]
async fn a_cursor_from_another_database_is_refused_with_a_resync_message() {
    let issuer = spawn_app().await;
    let other = spawn_app().await;
    let mut configs = Vec::new();
    for (app, prefix) in [(&issuer, "a"), (&other, "b")] {
        let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
        let settings = app.settings(&providers).await;
        mount_cursor_pages(&app.api, vec![(json!(items(prefix, "alice", 0..3)), None)]).await;
        app.sync_one(&settings).await;
        // Until every change is readable (on PostgreSQL other tests' transactions hold
        // the head back), so that the read below stops after the first change.
        read_all(&app.db, Cursor::START, 100).await;
        configs.push(app.write_config(&providers));
    }
    let (issuer_config, other_config) = (&configs[0], &configs[1]);
    assert_ne!(
        FeedCursor::issued_by(&issuer.db, Cursor::START)
            .await
            .expect("id")
            .database,
        FeedCursor::issued_by(&other.db, Cursor::START)
            .await
            .expect("id")
            .database,
        "each database draws its own id"
    );

    let first = changes_json(issuer_config, &["--limit", "1"]);
    assert_eq!(first["changes"][0]["external_id"], "a0");
    let cursor = first["next_cursor"].as_str().expect("next_cursor");
    let elsewhere = run(tributary(other_config).args(["changes", "--json", "--since", cursor]));
    assert_eq!(
        elsewhere.code, 3,
        "{}{}",
        elsewhere.stdout, elsewhere.stderr
    );
    assert!(
        elsewhere
            .stderr
            .contains("was issued by another database's change feed")
            && elsewhere.stderr.contains("tributary changes --head"),
        "{}",
        elsewhere.stderr
    );
    assert_eq!(elsewhere.stdout, "", "none of the other database's changes");
    // On the database that issued it, it reads on.
    let rest = changes_json(issuer_config, &["--since", cursor]);
    let rest: Vec<&str> = rest["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|change| change["external_id"].as_str().expect("id"))
        .collect();
    assert_eq!(rest, ["a1", "a2"]);

    // The previous release's form of the same position names no database.
    let legacy = FeedCursor {
        database: None,
        position: position(cursor),
    }
    .to_string();
    assert!(legacy.starts_with("c1."), "{legacy}");
    for config in [issuer_config, other_config] {
        let output = run(tributary(config).args(["changes", "--since", &legacy]));
        assert_eq!(output.code, 3, "{}{}", output.stdout, output.stderr);
        assert!(
            output.stderr.contains("earlier release of tributary")
                && output.stderr.contains("tributary changes --head"),
            "{}",
            output.stderr
        );
    }
}

/// Inserts a record row by hand (an import, or a stream's record), deleted already when
/// `deleted`; returns its id.
async fn raw_record(
    app: &TestApp,
    (user, provider, id): (&str, &str, &str),
    payload: &str,
    updated_minutes_ago: i64,
    deleted: bool,
) -> i64 {
    use sea_orm::{ActiveModelTrait, Set};
    let at = chrono::Utc::now() - chrono::Duration::minutes(updated_minutes_ago);
    tributary::entities::record::ActiveModel {
        user_id: Set(user.to_string()),
        provider: Set(provider.to_string()),
        external_id: Set(id.to_string()),
        payload: Set(payload.to_string()),
        content_hash: Set(sha256_hex(payload.as_bytes())),
        first_seen_run_id: Set(0),
        last_seen_run_id: Set(0),
        created_at: Set(at),
        updated_at: Set(at),
        deleted_at: Set(deleted.then_some(at)),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("record inserted")
    .id
}

/// Each change as (user, provider, external id, kind, deleted now, run id), sorted.
fn summary(changes: &[FeedChange]) -> Vec<(String, String, String, ChangeKind, bool, i64)> {
    let mut summary: Vec<_> = changes
        .iter()
        .map(|change| {
            (
                change.user_id.clone(),
                change.provider.clone(),
                change.external_id.clone(),
                change.kind,
                change.deleted,
                change.run_id,
            )
        })
        .collect();
    summary.sort();
    summary
}

/// `connections remove --delete-records` removes records outside any run: each live one
/// is a `deleted` change (run id 0), in every namespace of the connection, so that a
/// follower of the feed deletes them too; nobody else's records change.
#[tokio::test]
async fn removing_a_connection_with_its_records_is_a_deleted_change_for_each() {
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let added = run(tributary(&config)
        .args(["connections", "add", "--provider", "acme", "--user", "bob"])
        .args(["--token-stdin"])
        .write_stdin("token-bob\n"));
    assert_eq!(added.code, 0, "{}", added.stderr);
    for key in [
        ("bob", "acme", "b1"),
        ("bob", "acme", "b2"),
        ("bob", "acme.things", "t1"),
    ] {
        raw_record(&app, key, "{}", 1, false).await;
    }
    // Its `deleted` change was read when it was marked.
    raw_record(&app, ("bob", "acme", "gone"), "{}", 1, true).await;
    raw_record(&app, ("alice", "acme", "b1"), "{}", 1, false).await;
    raw_record(&app, ("bob", "acmex", "b1"), "{}", 1, false).await;
    let (_, reader) = read_all(&app.db, Cursor::START, 100).await;

    let removed = run(tributary(&config).args([
        "connections",
        "remove",
        "--provider",
        "acme",
        "--user",
        "bob",
        "--delete-records",
    ]));
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert!(
        removed.stdout.contains("and its 4 record(s)"),
        "{}",
        removed.stdout
    );
    let (feed, _) = read_all(&app.db, reader, 100).await;
    let deleted = |provider: &str, id: &str| {
        let (user, provider, id) = ("bob".into(), provider.into(), id.into());
        (user, provider, id, ChangeKind::Deleted, true, 0)
    };
    assert_eq!(
        summary(&feed),
        [
            deleted("acme", "b1"),
            deleted("acme", "b2"),
            deleted("acme.things", "t1")
        ]
    );
    let left: Vec<(String, String)> = app
        .records()
        .await
        .into_iter()
        .map(|record| (record.user_id, record.provider))
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&("bob".to_string(), "acme".to_string())));
}

/// `reconcile` removes duplicate rows outside any run: each key it reconciled is a
/// `deleted` change (run id 0), whose record is the key's kept row, so that a follower
/// that copied a removed row takes the kept one instead; no other key changes.
#[tokio::test]
async fn reconcile_is_a_deleted_change_for_each_key_whose_duplicates_it_removed() {
    let app = spawn_app().await;
    let drop_index = match backend() {
        Backend::Mysql => "DROP INDEX records_user_provider_external_id_key ON records",
        _ => "DROP INDEX records_user_provider_external_id_key",
    };
    app.execute(drop_index).await;
    let duplicated = [
        ("alice", "acme", "x"),
        ("alice", "acme.things", "x"),
        ("bob", "acme", "x"),
    ];
    for key in duplicated {
        raw_record(&app, key, r#"{"v":"old"}"#, 60, false).await;
        raw_record(&app, key, r#"{"v":"new"}"#, 5, false).await;
        raw_record(&app, key, r#"{"v":"mid"}"#, 30, false).await;
    }
    raw_record(&app, ("alice", "acme", "single"), "{}", 1, false).await;
    let (_, reader) = read_all(&app.db, Cursor::START, 100).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));

    let reconciled = run(tributary(&config).args(["reconcile", "--no-audit-log"]));
    assert_eq!(reconciled.code, 0, "{}", reconciled.stderr);
    assert_eq!(app.records().await.len(), 4);
    let (feed, _) = read_all(&app.db, reader, 100).await;
    let expected: Vec<_> = duplicated
        .iter()
        .map(|(user, provider, id)| {
            let key = (user.to_string(), provider.to_string(), id.to_string());
            (key.0, key.1, key.2, ChangeKind::Deleted, false, 0)
        })
        .collect();
    assert_eq!(summary(&feed), expected);
    assert!(
        feed.iter()
            .all(|change| change.payload.as_deref() == Some(r#"{"v":"new"}"#)),
        "each shows its key's kept row: {feed:?}"
    );
}

/// After the upgrade that added the feed, `records` holds rows the feed never saw, and
/// after a sweep the feed's oldest changes are gone: `changes` says where the feed begins
/// (the cursor before its first change kept, and when that change committed), and the
/// table says how to take every record instead.
#[tokio::test]
async fn changes_says_where_the_feed_begins() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let config = app.write_config(&providers);
    // Stored before the feed existed: no change describes it.
    raw_record(&app, ("alice", "acme", "older"), "{}", 60, false).await;
    let start = |page: &Value| {
        (
            position(page["feed_start"]["cursor"].as_str().expect("a cursor")),
            page["feed_start"]["first_committed_at"].clone(),
        )
    };
    let empty = changes_json(&config, &[]);
    assert_eq!(empty["changes"], json!([]));
    assert_eq!(start(&empty), (Cursor::after_batch(0), Value::Null));
    let table = run(tributary(&config).arg("changes"));
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.contains("The feed begins at c2.")
            && table.stdout.contains("no change is kept yet")
            && table.stdout.contains("copy `records`"),
        "{}",
        table.stdout
    );

    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..2)), None)]).await;
    app.sync_one(&settings).await;
    app.api.reset().await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    app.sync_one(&settings).await;
    read_all(&app.db, Cursor::START, 100).await;
    let seqs = app.batch_seqs().await;
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    let committed = |page: &Value| {
        let (_, at) = start(page);
        let at = at.as_str().expect("a time").to_string();
        at.parse::<chrono::DateTime<chrono::Utc>>()
            .expect("RFC 3339")
    };
    let synced = changes_json(&config, &["--limit", "1"]);
    assert_eq!(start(&synced).0, Cursor::after_batch(0));
    let batches = change_batch::Entity::find()
        .order_by_asc(change_batch::Column::Seq)
        .all(&app.db)
        .await
        .expect("batches");
    assert_eq!(Some(committed(&synced)), batches[0].committed_at);

    // The first batch expires: the feed now begins after it.
    change_batch::Entity::update_many()
        .col_expr(
            change_batch::Column::CommittedAt,
            Expr::value(chrono::Utc::now() - chrono::Duration::days(2)),
        )
        .filter(change_batch::Column::Seq.eq(seqs[0]))
        .exec(&app.db)
        .await
        .expect("backdated");
    changes::sweep_expired_changes(&app.db, Duration::from_secs(24 * 60 * 60))
        .await
        .expect("swept");
    let swept = changes_json(&config, &[]);
    assert_eq!(start(&swept).0, Cursor::after_batch(seqs[0]));
    assert_eq!(Some(committed(&swept)), batches[1].committed_at);
    let from_start = changes_json(
        &config,
        &[
            "--since",
            swept["feed_start"]["cursor"].as_str().expect("a cursor"),
        ],
    );
    assert_eq!(from_start["changes"], swept["changes"]);
    assert_eq!(swept["changes"][0]["external_id"], "k2");
}

/// A pool of the test's own on the app's database (on SQLite, another connection to the
/// file, so that it reads while the app's one writer is inside a transaction).
async fn pool(app: &TestApp, connections: u32) -> tributary::db::DatabasePools {
    tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: connections,
    })
    .await
    .expect("pool")
}

/// A reader that polls the feed with the last cursor it got, as an app would.
struct Poller {
    db: tributary::db::DatabasePools,
    cursor: Cursor,
    /// Every external id read, in the order read.
    seen: Vec<String>,
    limit: u64,
}

impl Poller {
    /// A poller after every change committed so far (on PostgreSQL the head alone may
    /// still be below one, held back by another test's transaction).
    async fn new(app: &TestApp) -> Poller {
        let db = pool(app, 2).await;
        let (_, cursor) = read_feed(db.main(), Cursor::START, 1_000).await;
        Poller {
            db,
            cursor,
            seen: Vec::new(),
            limit: 2,
        }
    }

    /// One read; returns the external ids it found.
    async fn poll(&mut self) -> Vec<String> {
        let query = FeedQuery {
            since: Some(self.cursor),
            provider: None,
            user_id: None,
            limit: self.limit,
        };
        let page = changes::read_changes(self.db.main(), &query)
            .await
            .expect("feed read");
        assert!(page.next >= self.cursor, "the cursor never goes back");
        self.cursor = page.next;
        let found: Vec<String> = page.changes.into_iter().map(|c| c.external_id).collect();
        self.seen.extend(found.iter().cloned());
        found
    }

    /// Polls until it has read `total` changes in all, or for at most 30 s: on
    /// PostgreSQL a committed change is read once every transaction of the server that
    /// began before it has ended, and the other tests' transactions run meanwhile.
    async fn drain_to(&mut self, total: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.seen.len() < total && std::time::Instant::now() < deadline {
            if self.poll().await.is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Nothing more, however long it is read.
        self.poll().await;
    }
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// A page of records `{"id": id}`, all new.
fn page_of(names: &[&str]) -> Vec<PageItem> {
    names
        .iter()
        .map(|id| {
            let payload = format!(r#"{{"id":"{id}"}}"#);
            PageItem::Record(Record {
                external_id: id.to_string(),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .collect()
}

/// Holds back every insert into `run_errors` while other writes go on: a SHARE lock on
/// the table on PostgreSQL, and on MySQL a locking read of the (empty) table, which locks
/// the gap every new row goes into.
async fn hold_error_rows(app: &TestApp) -> DatabaseTransaction {
    let sql = match backend() {
        Backend::Postgres => "LOCK TABLE run_errors IN SHARE MODE",
        _ => "SELECT id FROM run_errors FOR UPDATE",
    };
    let txn = app.db.begin().await.expect("gate transaction");
    txn.execute_unprepared(sql).await.expect("gate closed");
    txn
}

/// Sessions waiting at [`hold_error_rows`]: on MySQL, those running an insert into
/// `run_errors` (none can finish while it holds), read from the process list, which,
/// unlike MariaDB's lock tables, is never a cached copy.
async fn error_rows_waiting(app: &TestApp) -> i64 {
    if backend() != Backend::Mysql {
        return app.lock_waits().await;
    }
    let sql = "SELECT count(*) AS n FROM information_schema.PROCESSLIST \
               WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO `run_errors`%'";
    app.db
        .query_one_raw(Statement::from_string(app.db.get_database_backend(), sql))
        .await
        .expect("process list")
        .expect("a count")
        .try_get("", "n")
        .expect("n")
}

/// Through the store path itself: alice's page writes its records and their changes,
/// then waits to write the error row of the record it set aside (the test holds
/// `run_errors`); bob's page, written meanwhile, commits first. Where the clock ticks the
/// reader reads bob's change, then alice's once her page commits, although hers have the
/// smaller ids; on PostgreSQL it reads bob's only once alice's page has ended, after hers.
#[tokio::test]
async fn a_page_that_began_first_and_commits_last_is_read_once_beside_the_page_that_overtook_it() {
    let app = spawn_app().await;
    app.settings(&cursor_provider("acme", &app.api.uri(), &["alice", "bob"]))
        .await;
    let connections = connection::Entity::find()
        .order_by_asc(connection::Column::UserId)
        .all(&app.db)
        .await
        .expect("connections");
    let (alice, bob) = (&connections[0], &connections[1]);
    let writers = pool(&app, 4).await;
    let mut alice_run = open_run(&writers, alice).await;
    let mut bob_run = open_run(&writers, bob).await;
    async fn store(run: &mut Run<'_>, items: Vec<PageItem>) -> PageStoreCounts {
        let page = RunPage {
            items,
            mode: WriteMode::Upsert,
            expect: PageExpectation::Unknown,
            ..RunPage::default()
        };
        run.store(page).await.expect("stored")
    }
    let mut alice_page = page_of(&["a1", "a2"]);
    alice_page.push(PageItem::Rejected(RejectedRecord {
        external_id: None,
        stage: RecordStage::Validate,
        message: "no id".into(),
        payload: "{}".to_string(),
    }));
    let mut poller = Poller::new(&app).await;
    poller.limit = 10;
    if backend() == Backend::Sqlite {
        // One writer at a time: the pages commit in the order they began.
        store(&mut alice_run, alice_page).await;
        store(&mut bob_run, page_of(&["b1"])).await;
        poller.drain_to(3).await;
        assert_eq!(poller.seen, ids(&["a1", "a2", "b1"]));
        return;
    }
    let postgres = backend() == Backend::Postgres;

    let gate = hold_error_rows(&app).await;
    let overtake = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while error_rows_waiting(&app).await < 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "alice's page never waited"
            );
            tokio::time::sleep(LOCK_WAITS_POLL).await;
        }
        store(&mut bob_run, page_of(&["b1"])).await;
        if postgres {
            assert!(
                poller.poll().await.is_empty(),
                "bob's page waits behind alice's"
            );
        } else {
            poller.drain_to(1).await;
            assert_eq!(poller.seen, ids(&["b1"]), "bob's page committed first");
        }
        gate.rollback().await.expect("gate opened");
    };
    let (alice_counts, ()) = tokio::join!(store(&mut alice_run, alice_page), overtake);
    assert_eq!((alice_counts.inserted, alice_counts.failed), (2, 1));
    poller.drain_to(3).await;
    match postgres {
        // In the order the pages began writing, once both have ended.
        true => assert_eq!(poller.seen, ids(&["a1", "a2", "b1"])),
        // In commit order.
        false => assert_eq!(poller.seen, ids(&["b1", "a1", "a2"])),
    }

    let batch_of = |user: &str| {
        let db = app.db.clone();
        let user = user.to_string();
        async move {
            change_batch::Entity::find()
                .filter(change_batch::Column::UserId.eq(user))
                .one(&db)
                .await
                .expect("batch")
                .expect("one batch")
        }
    };
    let (alice_batch, bob_batch) = (batch_of("alice").await, batch_of("bob").await);
    assert!(
        alice_batch.id < bob_batch.id,
        "alice's batch was opened first: an autoincrement would order it first"
    );
    match postgres {
        true => assert!(
            alice_batch.seq < bob_batch.seq,
            "its transaction began writing before bob's"
        ),
        false => assert!(
            alice_batch.seq > bob_batch.seq,
            "it was stamped after bob's"
        ),
    }
}

#[tokio::test]
async fn a_record_the_database_refuses_gets_no_change_and_the_rest_of_its_page_do() {
    let app = spawn_app().await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    app.refuse_inserts_of("k1", "no k1").await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    let first = app.sync_one(&settings).await;
    assert_eq!((first.counts.inserted, first.counts.failed), (2, 1));
    let (feed, head) = read_all(&app.db, Cursor::START, 100).await;
    assert_eq!(
        kinds(&feed),
        vec![
            ("k0".to_string(), ChangeKind::Inserted),
            ("k2".to_string(), ChangeKind::Inserted)
        ]
    );

    app.refuse_updates_of("k2", "no new k2").await;
    app.api.reset().await;
    let mut changed = items("k", "alice", 0..3);
    changed[0]["n"] = json!(10);
    changed[2]["n"] = json!(12);
    mount_cursor_pages(&app.api, vec![(Value::Array(changed), None)]).await;
    let second = app.sync_one(&settings).await;
    assert_eq!((second.counts.updated, second.counts.failed), (1, 2));
    let (feed, _) = read_all(&app.db, head, 100).await;
    assert_eq!(kinds(&feed), vec![("k0".to_string(), ChangeKind::Updated)]);
}

#[tokio::test]
async fn appended_events_are_inserted_changes_and_a_repeated_event_is_none() {
    let app = spawn_app().await;
    let providers = cursor_provider("events", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 */15 * * * *\"\nmode = \"append\"\nretention = \"30d\"",
    );
    let settings = app.settings(&providers).await;
    mount_cursor_pages(&app.api, vec![(json!(items("e", "alice", 0..2)), None)]).await;
    app.sync_one(&settings).await;
    app.api.reset().await;
    let mut again = items("e", "alice", 0..3);
    again[0]["n"] = json!("a late retry with other content");
    mount_cursor_pages(&app.api, vec![(Value::Array(again), None)]).await;
    let second = app.sync_one(&settings).await;
    assert_eq!((second.counts.inserted, second.counts.duplicate), (1, 2));

    let (feed, _) = read_all(&app.db, Cursor::START, 100).await;
    let mut found = kinds(&feed);
    found.sort();
    assert_eq!(
        found,
        ["e0", "e1", "e2"].map(|id| (id.to_string(), ChangeKind::Inserted))
    );
    assert_eq!(feed[2].run_id, second.run_id);
}

/// `changes` only reads: it needs neither the tokens' variables nor the secrets key.
#[tokio::test]
async fn the_feed_is_read_without_the_tokens_or_the_key() {
    let app = spawn_app().await;
    let config = app.dir.path().join("reader.toml");
    let text = format!(
        "[database]\nurl = \"{}\"\n{}",
        app.database_url,
        cursor_provider("acme", &app.api.uri(), &[]).replace(
            "page_size = 100\n",
            "page_size = 100\n\n[[providers.acme.connections]]\nuser_id = \"alice\"\ntoken_env = \"TRIBUTARY_TEST_UNSET_TOKEN\"\n",
        )
    );
    std::fs::write(&config, text).expect("config written");
    let head = run(tributary(&config).args(["changes", "--head"]));
    assert_eq!(head.code, 0, "{}", head.stderr);
    let head = position(head.stdout.trim());
    let page = changes_json(&config, &[]);
    assert_eq!(page["changes"], json!([]));
    let next = position(page["next_cursor"].as_str().expect("next_cursor"));
    if backend() == Backend::Postgres {
        // The head follows the transactions of the whole server, which go on.
        assert!(next >= head, "{next:?} {head:?}");
    } else {
        assert_eq!(
            (head, next),
            (Cursor::after_batch(0), Cursor::after_batch(0))
        );
    }
}

/// A PostgreSQL database restored from a logical dump into another cluster holds batches
/// stamped with the old cluster's transaction ids, above the new one's. Opening it for
/// writing moves the clock's offset past them, so the next change is read after them and
/// no stamp collides with a stored seq. Where the clock ticks, it carries on by itself.
#[tokio::test]
async fn a_restored_database_is_aligned_so_its_next_change_reads_after_the_stored_ones() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let config = app.write_config(&providers);
    app.settings(&providers).await;
    if backend() != Backend::Postgres {
        mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..2)), None)]).await;
        let sync = run(tributary(&config).args(["sync", "--quiet"]));
        assert_eq!(sync.code, 0, "{}", sync.stderr);
        assert!(!sync.stderr.contains("restored"), "{}", sync.stderr);
        return;
    }
    // A batch from the old cluster, far above this one's transaction ids.
    let restored_seq: i64 = 1_000_000_000_000;
    let (_, run_id) = app.alice_with_a_run().await;
    app.execute(&format!(
        "INSERT INTO change_batches (seq, run_id, user_id, provider, committed_at) \
         VALUES ({restored_seq}, {run_id}, 'alice', 'acme', now())"
    ))
    .await;
    let reader = Cursor::after_batch(restored_seq);

    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..2)), None)]).await;
    let sync = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(sync.code, 0, "{}", sync.stderr);
    assert!(
        sync.stderr.contains("restored into another cluster"),
        "{}",
        sync.stderr
    );
    let seqs = app.batch_seqs().await;
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    assert!(seqs[1] > restored_seq, "{seqs:?}");
    let (feed, _) = read_all(&app.db, reader, 100).await;
    assert_eq!(
        kinds(&feed),
        vec![
            ("k0".to_string(), ChangeKind::Inserted),
            ("k1".to_string(), ChangeKind::Inserted)
        ],
        "a reader past the restored batch reads the new changes"
    );
    let again = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        !again.stderr.contains("restored"),
        "aligned once, it stays aligned: {}",
        again.stderr
    );
}
