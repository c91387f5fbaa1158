//! A backend's statements driven directly: a page's bookkeeping written in one round trip
//! or not at all, and an insert that meets the unique index. Crate-private steps, so their
//! tests live here (run on the three databases by scripts/test).

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use tributary_providers::{PagePosition, Record};

use super::{backend_for, PageBookkeeping, PageContext, StoreError};
use crate::entities::change::ChangeKind;
use crate::entities::{change, connection_stream, record, sync_run};
use crate::pipeline::changes::open_batch;
use crate::pipeline::{Checkpoint, CheckpointMove, RunCounts};
use crate::testing::{open_run, page_of, TestDb};

async fn save(test: &TestDb, page: &PageBookkeeping<'_>) -> Result<(), StoreError> {
    let txn = test.main().begin().await.expect("begin");
    let saved = backend_for(&test.db).save_bookkeeping(&txn, page).await;
    match saved {
        Ok(()) => txn.commit().await.expect("commit"),
        Err(_) => txn.rollback().await.expect("rollback"),
    }
    saved
}

async fn run_row(test: &TestDb, run_id: i64) -> sync_run::Model {
    sync_run::Entity::find_by_id(run_id)
        .one(test.main())
        .await
        .expect("query")
        .expect("run row exists")
}

async fn stream_checkpoint(test: &TestDb) -> Option<String> {
    connection_stream::Entity::find()
        .one(test.main())
        .await
        .expect("connection_streams")
        .and_then(|state| state.checkpoint)
}

/// Every column of every record as text lines, for diffing two states of the table.
async fn dump_records(test: &TestDb) -> Vec<String> {
    record::Entity::find()
        .order_by_asc(record::Column::Id)
        .all(test.main())
        .await
        .expect("records")
        .into_iter()
        .map(|r| format!("{r:?}"))
        .collect()
}

/// Counters and checkpoint are saved together or not at all: a run row or a stream row
/// that is gone is an error, and the other row is left as it was.
#[tokio::test]
async fn counters_and_checkpoint_are_saved_together_or_not_at_all() {
    let test = TestDb::new().await;
    let connection = test.alice().await;
    let run = open_run(&test.db, &connection).await;
    let (run_id, stream_id) = (run.id(), run.stream().state.id);
    let counts = RunCounts {
        pages_fetched: 3,
        fetched: 7,
        inserted: 5,
        failed: 2,
        ..RunCounts::default()
    };
    // Quotes and backslashes travel as values, never as SQL text.
    let checkpoint = Checkpoint {
        position: Some(PagePosition::Cursor {
            cursor: r#"c'3\"; --"#.to_string(),
        }),
        parent: None,
        walk_started: None,
        since: None,
        watermark: None,
    };
    let page = PageBookkeeping {
        run_id,
        counts: &counts,
        connection_id: connection.id,
        stream_id,
        checkpoint: CheckpointMove::Write(Some(&checkpoint)),
        now: chrono::Utc::now(),
        lease: None,
    };
    save(&test, &page).await.expect("saved");
    let row = run_row(&test, run_id).await;
    assert_eq!(
        (
            row.pages_fetched,
            row.records_fetched,
            row.records_inserted,
            row.records_failed
        ),
        (3, 7, 5, 2)
    );
    let stored = stream_checkpoint(&test).await;
    assert_eq!(stored, Some(checkpoint.to_column().expect("json")));

    // A run row that is gone: an error, and the checkpoint is not cleared.
    let gone_run = PageBookkeeping {
        run_id: run_id + 1000,
        checkpoint: CheckpointMove::Write(None),
        ..page
    };
    assert!(matches!(
        save(&test, &gone_run).await,
        Err(StoreError::RowGone)
    ));
    assert_eq!(stream_checkpoint(&test).await, stored);

    // A stream that is gone: an error, and the counters are left as they were.
    let more = RunCounts {
        pages_fetched: 4,
        ..counts
    };
    let gone_stream = PageBookkeeping {
        counts: &more,
        stream_id: stream_id + 1000,
        ..page
    };
    assert!(matches!(
        save(&test, &gone_stream).await,
        Err(StoreError::RowGone)
    ));
    assert_eq!(run_row(&test, run_id).await.pages_fetched, 3);
}

/// A run whose lookup missed rows another run inserted meanwhile (it raced it) inserts
/// the same keys: the unique index turns them away as skips, not errors, whether the page
/// is one statement or a statement per record, and only the row that went in is a change.
#[tokio::test]
async fn an_insert_that_hits_the_unique_index_counts_as_a_duplicate_skip() {
    let test = TestDb::new().await;
    let connection = test.alice().await;
    let mut first = open_run(&test.db, &connection).await;
    let page = page_of(&["it_0", "it_1", "it_2"]);
    assert_eq!(first.store(page).await.expect("stored").inserted, 3);
    let before = dump_records(&test).await;

    let racing = open_run(&test.db, &connection).await;
    let context = PageContext {
        run_id: racing.id(),
        connection: &connection,
        stream: racing.stream(),
        next_checkpoint: None,
        mode: Default::default(),
        leave_checkpoint: false,
        expect: Default::default(),
        sightings: false,
        lease: None,
        version: None,
    };
    let store = backend_for(&test.db);
    for (round, (new_id, per_record)) in [("it_new_a", false), ("it_new_b", true)]
        .into_iter()
        .enumerate()
    {
        let stale = ["it_0", "it_1", new_id].map(|id| Record {
            external_id: id.to_string(),
            payload: format!("{{\"id\":\"{id}\",\"late\":true}}"),
            content_hash: "0".repeat(64),
        });
        let stale: Vec<&Record> = stale.iter().collect();
        let statements: Vec<&[&Record]> = if per_record {
            stale.chunks(1).collect()
        } else {
            vec![&stale[..]]
        };
        let txn = test.main().begin().await.expect("begin");
        let mut batch = open_batch(&txn, context.batch_owner())
            .await
            .expect("batch");
        let mut inserted = 0;
        for records in statements {
            let slot = batch.reserve(records.len()).expect("slot");
            // A conflict is not an error: the row is skipped.
            inserted += store
                .insert(&txn, &context, records, chrono::Utc::now(), slot)
                .await
                .expect("a conflict is not an error");
        }
        txn.commit().await.expect("commit");

        let duplicate = stale.len() as u64 - inserted;
        assert_eq!((inserted, duplicate), (1, 2), "per record: {per_record}");
        // Only the row that went in is a change; the keys turned away are none.
        let recorded: Vec<(String, ChangeKind)> = change::Entity::find()
            .filter(change::Column::BatchId.eq(batch.id))
            .all(test.main())
            .await
            .expect("changes")
            .into_iter()
            .map(|change| (change.external_id, change.kind))
            .collect();
        assert_eq!(recorded, vec![(new_id.to_string(), ChangeKind::Inserted)]);
        let after = dump_records(&test).await;
        assert_eq!(after.len(), 4 + round, "no second row for it_0 or it_1");
        assert_eq!(
            &after[..3],
            &before[..],
            "existing rows are left as they were"
        );
    }
}

/// A versioned write compares in its own statements: handed a stale lookup (the row as
/// it was before a newer object was stored, as PostgreSQL's page lookup can read it after
/// waiting on the lock), an older object and an older deletion write nothing over it.
#[tokio::test]
async fn a_versioned_write_with_a_stale_lookup_never_puts_an_older_object_over_a_newer_one() {
    use super::backend::{Existing, Stored};
    use super::versioned::VersionedWrite;
    use super::writes::PageChanges;
    use crate::pipeline::PageStoreCounts;
    use tributary_providers::DeletedRecord;

    let test = TestDb::new().await;
    let connection = test.alice().await;
    let mut newer = open_run(&test.db, &connection).await;
    let mut page = page_of(&["it_0"]);
    page.version = Some("00000000000000000200.0");
    assert_eq!(newer.store(page).await.expect("stored").inserted, 1);
    let before = dump_records(&test).await;
    let stored = record::Entity::find()
        .one(test.main())
        .await
        .expect("record")
        .expect("stored");

    let older = open_run(&test.db, &connection).await;
    let version = "00000000000000000100.0";
    let context = PageContext {
        run_id: older.id(),
        connection: &connection,
        stream: older.stream(),
        next_checkpoint: None,
        mode: Default::default(),
        leave_checkpoint: true,
        expect: Default::default(),
        sightings: false,
        lease: None,
        version: Some(version),
    };
    let stale: Existing = [(
        "it_0".to_string(),
        Stored::from_row(stored.id, "0".repeat(64), None),
    )]
    .into();
    let record = Record {
        external_id: "it_0".to_string(),
        payload: r#"{"id":"it_0","older":true}"#.to_string(),
        content_hash: "1".repeat(64),
    };
    let gone = DeletedRecord {
        external_id: "it_0".to_string(),
        payload: record.payload.clone(),
    };
    let backend = backend_for(&test.db);
    let txn = test.main().begin().await.expect("begin");
    let write = VersionedWrite {
        backend: backend.as_ref(),
        txn: &txn,
        context: &context,
        version,
        now: chrono::Utc::now(),
    };
    let (mut counts, mut changes, mut failed) = (
        PageStoreCounts::default(),
        PageChanges::default(),
        Vec::new(),
    );
    write
        .write(
            &stale,
            &[record],
            &[gone],
            &mut counts,
            &mut changes,
            &mut failed,
        )
        .await
        .expect("written");
    txn.commit().await.expect("commit");

    assert_eq!(
        (counts.unchanged, counts.updated, counts.deleted),
        (1, 0, 0)
    );
    assert!(failed.is_empty());
    assert_eq!(
        dump_records(&test).await,
        before,
        "the newer row is as it was"
    );
}
