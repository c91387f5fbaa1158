//! Inserting a page's new records: `ON CONFLICT (user_id, provider, external_id) DO
//! NOTHING` multi-row inserts, sized for each backend, with the record-by-record retry in
//! savepoints that keeps one bad record from costing the rest.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{InsertStatement, OnConflict, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait, PaginatorTrait, QueryFilter, TransactionTrait,
};
use tributary_providers::{Record, RejectedRecord};

use crate::entities::record;
use crate::pipeline::run_errors::persist_failure;
use crate::pipeline::store::PageContext;

/// How many rows one multi-row write carries.
const INSERT_CHUNK: usize = 500;
/// Over a connection that may use TLS, about how many bytes of ids and payloads one write
/// carries. sqlx does not set `TCP_NODELAY`, so a statement written as several TLS
/// records (16 KiB each) leaves its tail to Nagle's algorithm, which waits for the
/// server's delayed ACK: about 40 ms per large statement. Statements below one TLS record
/// go out in one write. Without TLS, a page goes in one statement.
const INSERT_CHUNK_BYTES: usize = 12 * 1024;

/// How large one write statement of a page may be on this database connection.
#[derive(Clone, Copy, Debug)]
pub struct StatementLimits {
    pub rows: usize,
    pub bytes: usize,
}

impl StatementLimits {
    /// SQLite, and PostgreSQL without TLS (`sslmode=disable` or a Unix socket): one
    /// statement a page. PostgreSQL that may use TLS (sqlx's default `sslmode=prefer`)
    /// and MySQL: statements below one TLS record.
    pub fn for_database(db: &DatabaseConnection) -> StatementLimits {
        let whole_pages = StatementLimits {
            rows: INSERT_CHUNK,
            bytes: usize::MAX,
        };
        let below_one_tls_record = StatementLimits {
            rows: INSERT_CHUNK,
            bytes: INSERT_CHUNK_BYTES,
        };
        match db.get_database_backend() {
            DbBackend::Sqlite => whole_pages,
            DbBackend::Postgres => {
                use sea_orm::sqlx::postgres::PgSslMode;
                let options = db.get_postgres_connection_pool().connect_options();
                let unix_socket =
                    options.get_socket().is_some() || options.get_host().starts_with('/');
                if matches!(options.get_ssl_mode(), PgSslMode::Disable) || unix_socket {
                    whole_pages
                } else {
                    below_one_tls_record
                }
            }
            _ => below_one_tls_record,
        }
    }

    /// Whether a page may go as one statement, however large.
    pub fn whole_pages(&self) -> bool {
        self.bytes == usize::MAX
    }
}

/// What inserting a page's new records did.
#[derive(Default)]
pub struct InsertOutcome {
    pub inserted: u64,
    /// Rows the unique index turned away because another writer inserted the key first.
    pub duplicate: u64,
    pub failed: Vec<RejectedRecord>,
}

/// Inserts records not found by the lookup. The unique index is the backstop: a key a
/// concurrent writer inserted in the meantime is skipped by `ON CONFLICT DO NOTHING` and
/// counted as a duplicate, never an error and never a second row. Each multi-row insert
/// runs in a savepoint; if it fails, its records are inserted one by one, each in its own
/// savepoint, and those the database refuses are returned as failed.
pub async fn insert_new(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    mut records: Vec<Record>,
    now: DateTime<Utc>,
    limits: StatementLimits,
) -> Result<InsertOutcome, DbErr> {
    // One order for every writer makes lock waits between concurrent inserts less likely.
    records.sort_by(|a, b| a.external_id.cmp(&b.external_id));
    let records: Vec<&Record> = records.iter().collect();
    insert_sorted(txn, context, &records, now, limits).await
}

/// [`insert_new`] without savepoints: the first failing statement fails the whole
/// insert (and, on PostgreSQL, the transaction).
pub(crate) async fn insert_fast(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
    limits: StatementLimits,
) -> Result<InsertOutcome, DbErr> {
    let mut outcome = InsertOutcome::default();
    for chunk in chunks_by_size(records, limits, |record| record_size(record)) {
        let inserted = insert_rows(txn, context, chunk, now).await?;
        outcome.inserted += inserted;
        outcome.duplicate += chunk.len() as u64 - inserted;
    }
    Ok(outcome)
}

/// [`insert_new`] for records already in key order.
pub(crate) async fn insert_sorted(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
    limits: StatementLimits,
) -> Result<InsertOutcome, DbErr> {
    let mut outcome = InsertOutcome::default();
    for chunk in chunks_by_size(records, limits, |record| record_size(record)) {
        let savepoint = txn.begin().await?;
        match insert_rows(&savepoint, context, chunk, now).await {
            Ok(inserted) => {
                savepoint.commit().await?;
                outcome.inserted += inserted;
                outcome.duplicate += chunk.len() as u64 - inserted;
            }
            Err(batch_error) => {
                savepoint.rollback().await?;
                tracing::warn!(error = %batch_error, rows = chunk.len(), "A multi-row insert failed; writing its records one by one.");
                for record in chunk {
                    let savepoint = txn.begin().await?;
                    match insert_rows(&savepoint, context, std::slice::from_ref(record), now).await
                    {
                        Ok(inserted) => {
                            savepoint.commit().await?;
                            outcome.inserted += inserted;
                            outcome.duplicate += 1 - inserted;
                        }
                        Err(error) => {
                            savepoint.rollback().await?;
                            outcome
                                .failed
                                .push(persist_failure((*record).clone(), &error));
                        }
                    }
                }
            }
        }
    }
    Ok(outcome)
}

/// The bytes of a record a write carries: its id and payload.
pub(crate) fn record_size(record: &Record) -> usize {
    record.payload.len() + record.external_id.len()
}

/// Consecutive runs of `items` of at most `limits.rows` items and, unless a single item
/// is larger, at most `limits.bytes` as `size` counts them.
pub(crate) fn chunks_by_size<T>(
    items: &[T],
    limits: StatementLimits,
    size: impl Fn(&T) -> usize,
) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0usize;
        let mut end = 0;
        for item in rest.iter().take(limits.rows) {
            let size = size(item);
            if end > 0 && bytes.saturating_add(size) > limits.bytes {
                break;
            }
            bytes = bytes.saturating_add(size);
            end += 1;
        }
        let (chunk, tail) = rest.split_at(end);
        rest = tail;
        Some(chunk)
    })
}

async fn insert_rows(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    if db.get_database_backend() == DbBackend::Postgres {
        return insert_rows_postgres(db, context, records, now).await;
    }
    let Some(mut insert) = records_insert(context, records, now)? else {
        return Ok(0);
    };
    // On MySQL, which has no DO NOTHING, sea-query writes `ON DUPLICATE KEY UPDATE id = id`.
    insert.on_conflict(
        OnConflict::columns(record::KEY_COLUMNS)
            .do_nothing_on([record::Column::Id])
            .to_owned(),
    );
    let affected = db.execute(&insert).await?.rows_affected();
    if db.get_database_backend() != DbBackend::MySql {
        return Ok(affected);
    }
    // MySQL has no DO NOTHING: the conflict clause is `ON DUPLICATE KEY UPDATE id = id`,
    // and with the found-rows flag sqlx sets, a skipped row counts as affected too. The
    // keys were all missing at the lookup, so the rows of this run among them are ours.
    let ids = records.iter().map(|record| record.external_id.as_str());
    let ours = record::Entity::find()
        .filter(record::Column::UserId.eq(context.connection.user_id.as_str()))
        .filter(record::Column::Provider.eq(context.connection.provider.as_str()))
        .filter(record::Column::ExternalId.is_in(ids))
        .filter(record::Column::FirstSeenRunId.eq(context.run_id))
        .count(db)
        .await?;
    Ok(ours)
}

/// `INSERT INTO records (...) VALUES (...), ...` with one row per record, first seen by
/// the page's run at `now`, without a conflict clause; `None` for no records.
pub(crate) fn records_insert(
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
) -> Result<Option<InsertStatement>, DbErr> {
    if records.is_empty() {
        return Ok(None);
    }
    let mut insert = Query::insert();
    insert.into_table(record::Entity).columns([
        record::Column::UserId,
        record::Column::Provider,
        record::Column::ExternalId,
        record::Column::Payload,
        record::Column::ContentHash,
        record::Column::FirstSeenRunId,
        record::Column::LastSeenRunId,
        record::Column::CreatedAt,
        record::Column::UpdatedAt,
    ]);
    for record in records {
        insert
            .values([
                context.connection.user_id.as_str().into(),
                context.connection.provider.as_str().into(),
                record.external_id.as_str().into(),
                record.payload.as_str().into(),
                record.content_hash.as_str().into(),
                context.run_id.into(),
                context.run_id.into(),
                now.into(),
                now.into(),
            ])
            .map_err(|error| DbErr::Custom(format!("building the page's insert: {error}")))?;
    }
    Ok(Some(insert))
}

/// `INSERT INTO records (...)` with the columns of a new row, in the order the inserts
/// written as SQL text give their values: the key, payload, hash, first and last run,
/// created and updated.
pub(crate) fn insert_into_records() -> String {
    let [user_id, provider, external_id] = record::key_column_names();
    format!(
        "INSERT INTO records ({user_id}, {provider}, {external_id}, payload, content_hash, \
         first_seen_run_id, last_seen_run_id, created_at, updated_at)"
    )
}

/// PostgreSQL: the rows go in as three arrays (`unnest`), so the statement has seven
/// parameters whatever the page size, is prepared once per connection, and is planned
/// once, instead of nine parameters a row.
async fn insert_rows_postgres(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let (sql, values) = postgres_insert(context, records, now);
    let statement = sea_orm::Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
    Ok(db.execute_raw(statement).await?.rows_affected())
}

/// The `unnest` insert of [`insert_rows_postgres`] and its values `$1` to `$7`: the user,
/// the provider, the run, the time, and the ids, payloads and hashes as arrays.
pub(crate) fn postgres_insert(
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
) -> (String, Vec<sea_orm::Value>) {
    let [user_id, provider, external_id] = record::key_column_names();
    let sql = format!(
        "{} SELECT $1, $2, r.external_id, r.payload, r.content_hash, $3, $3, $4, $4 \
         FROM unnest($5::text[], $6::text[], $7::text[]) AS r(external_id, payload, content_hash) \
         ON CONFLICT ({user_id}, {provider}, {external_id}) DO NOTHING",
        insert_into_records()
    );
    let column = |field: fn(&Record) -> &String| -> Vec<String> {
        records.iter().map(|record| field(record).clone()).collect()
    };
    let values = vec![
        context.connection.user_id.as_str().into(),
        context.connection.provider.as_str().into(),
        context.run_id.into(),
        now.into(),
        column(|record| &record.external_id).into(),
        column(|record| &record.payload).into(),
        column(|record| &record.content_hash).into(),
    ];
    (sql, values)
}
