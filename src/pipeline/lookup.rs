//! The page's lookup: the stored (id, content_hash) of each of its keys, one statement
//! per chunk of keys and each key one probe of the unique index, shaped per backend.

use std::collections::HashMap;

use sea_orm::sqlx;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter,
    QuerySelect,
};
use tributary_providers::Record;

use crate::db::DatabasePools;
use crate::entities::{connection, record};

/// How many keys one lookup query carries (well under every backend's parameter limit).
const LOOKUP_CHUNK: usize = 500;

/// Whether every one of `records` is stored already with the same content hash. Read
/// outside any transaction: if so, the page writes no record, which is exactly what its
/// transaction would have done at the moment of this read.
pub async fn all_stored_unchanged(
    db: &DatabasePools,
    connection: &connection::Model,
    records: &[Record],
) -> Result<bool, DbErr> {
    let mut unchanged = 0;
    for chunk in records.chunks(LOOKUP_CHUNK) {
        unchanged += match db.get_database_backend() {
            DbBackend::Sqlite => count_unchanged_sqlite(db, connection, chunk).await?,
            DbBackend::Postgres => count_unchanged_postgres(db, connection, chunk).await?,
            _ => {
                let existing = lookup_existing(db, connection, chunk).await?;
                chunk
                    .iter()
                    .filter(|record| {
                        existing
                            .get(&record.external_id)
                            .is_some_and(|(_, hash)| *hash == record.content_hash)
                    })
                    .count() as u64
            }
        };
    }
    // The page's keys are distinct and the key is unique, so each counts at most once.
    Ok(unchanged == records.len() as u64)
}

/// SQLite: how many of `records` are stored with the same hash, counted by the database
/// from one JSON array of (id, hash) pairs, so one integer comes back instead of the
/// rows. `CROSS JOIN` keeps the page's pairs the outer loop: each is one probe of the
/// unique index, whatever the planner thinks of the table's size. Asked on a read-only
/// reader of the file where there is one (see `db/pools.rs`), else on the main pool.
async fn count_unchanged_sqlite(
    db: &DatabasePools,
    connection: &connection::Model,
    records: &[Record],
) -> Result<u64, DbErr> {
    let [user_id, provider, external_id] = record::key_column_names();
    let sql = format!(
        "SELECT count(*) AS unchanged FROM json_each(?) AS page CROSS JOIN records AS r \
         WHERE r.{user_id} = ? AND r.{provider} = ? AND r.{external_id} = page.value ->> 0 \
         AND r.content_hash = page.value ->> 1"
    );
    let pairs: Vec<[&str; 2]> = records
        .iter()
        .map(|record| [record.external_id.as_str(), record.content_hash.as_str()])
        .collect();
    let pairs = serde_json::to_string(&pairs)
        .map_err(|error| DbErr::Custom(format!("writing the lookup's keys: {error}")))?;
    let query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
        .bind(pairs)
        .bind(connection.user_id.as_str())
        .bind(connection.provider.as_str());
    let count = match db.sqlite_readers() {
        Some(readers) => {
            let mut reader = readers.acquire().await.map_err(sqlx_error)?;
            let count = query
                .fetch_one(reader.connection())
                .await
                .map_err(sqlx_error)?;
            reader.give_back();
            count
        }
        None => query
            .fetch_one(db.get_sqlite_connection_pool())
            .await
            .map_err(sqlx_error)?,
    };
    Ok(u64::try_from(count).unwrap_or(0))
}

fn sqlx_error(error: sqlx::Error) -> DbErr {
    DbErr::Query(sea_orm::RuntimeErr::SqlxError(error.into()))
}

/// PostgreSQL: as [`count_unchanged_sqlite`], with the pairs as two arrays and each id
/// one unique-index lookup (see [`lookup_postgres`]).
async fn count_unchanged_postgres(
    db: &DatabaseConnection,
    connection: &connection::Model,
    records: &[Record],
) -> Result<u64, DbErr> {
    let [user_id, provider, external_id] = record::key_column_names();
    let sql = format!(
        "SELECT count(*) AS unchanged \
         FROM unnest($3::text[], $4::text[]) AS k(external_id, content_hash) \
         CROSS JOIN LATERAL (SELECT content_hash FROM records WHERE {user_id} = $1 \
         AND {provider} = $2 AND {external_id} = k.external_id LIMIT 1) AS r \
         WHERE r.content_hash = k.content_hash"
    );
    let column = |field: fn(&Record) -> &String| -> Vec<String> {
        records.iter().map(|record| field(record).clone()).collect()
    };
    let statement = sea_orm::Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        [
            connection.user_id.as_str().into(),
            connection.provider.as_str().into(),
            column(|record| &record.external_id).into(),
            column(|record| &record.content_hash).into(),
        ],
    );
    count_of(db, statement).await
}

async fn count_of(db: &DatabaseConnection, statement: sea_orm::Statement) -> Result<u64, DbErr> {
    let count: i64 = match db.query_one_raw(statement).await? {
        Some(row) => row.try_get("", "unchanged")?,
        None => 0,
    };
    Ok(u64::try_from(count).unwrap_or(0))
}

/// The stored (id, content_hash) of each of the page's keys that already exists.
pub async fn lookup_existing(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    records: &[Record],
) -> Result<HashMap<String, (i64, String)>, DbErr> {
    let mut existing = HashMap::with_capacity(records.len());
    for chunk in records.chunks(LOOKUP_CHUNK) {
        let rows: Vec<(i64, String, String)> = match txn.get_database_backend() {
            DbBackend::Postgres => lookup_postgres(txn, connection, chunk).await?,
            DbBackend::Sqlite => lookup_sqlite(txn, connection, chunk).await?,
            _ => {
                let ids = chunk.iter().map(|record| record.external_id.as_str());
                record::Entity::find()
                    .select_only()
                    .columns([
                        record::Column::Id,
                        record::Column::ExternalId,
                        record::Column::ContentHash,
                    ])
                    .filter(record::Column::UserId.eq(connection.user_id.as_str()))
                    .filter(record::Column::Provider.eq(connection.provider.as_str()))
                    .filter(record::Column::ExternalId.is_in(ids))
                    .into_tuple()
                    .all(txn)
                    .await?
            }
        };
        for (id, external_id, hash) in rows {
            existing.insert(external_id, (id, hash));
        }
    }
    Ok(existing)
}

/// SQLite: the ids go in as one JSON array and the rows come back as one JSON array. sqlx
/// hands each result row from its SQLite thread to ours separately, which for a page of
/// 100 found keys cost more than the lookup itself; one row costs one hand-off. Each id
/// is still one probe of the unique index.
async fn lookup_sqlite(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    records: &[Record],
) -> Result<Vec<(i64, String, String)>, DbErr> {
    let [user_id, provider, external_id] = record::key_column_names();
    let sql = format!(
        "SELECT json_group_array(json_array(id, {external_id}, content_hash)) AS found \
         FROM records WHERE {user_id} = ? AND {provider} = ? \
         AND {external_id} IN (SELECT value FROM json_each(?))"
    );
    let ids: Vec<&str> = records
        .iter()
        .map(|record| record.external_id.as_str())
        .collect();
    let ids = serde_json::to_string(&ids)
        .map_err(|error| DbErr::Custom(format!("writing the lookup's ids: {error}")))?;
    let statement = sea_orm::Statement::from_sql_and_values(
        DbBackend::Sqlite,
        sql,
        [
            connection.user_id.as_str().into(),
            connection.provider.as_str().into(),
            ids.into(),
        ],
    );
    let Some(row) = txn.query_one_raw(statement).await? else {
        return Ok(Vec::new());
    };
    let found: String = row.try_get("", "found")?;
    serde_json::from_str(&found)
        .map_err(|error| DbErr::Custom(format!("reading the lookup's rows: {error}")))
}

/// PostgreSQL: one probe of the whole key per id. `external_id IN (...)` lets the planner
/// scan every record of the (user_id, provider) prefix and filter, which it does while
/// the table's statistics are young (a prepared statement's generic plan keeps doing it):
/// a cost per page that grows with the table. `LIMIT 1` in the lateral subquery keeps it
/// from being flattened into such a join, so each id is one unique-index lookup.
async fn lookup_postgres(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    records: &[Record],
) -> Result<Vec<(i64, String, String)>, DbErr> {
    let [user_id, provider, external_id] = record::key_column_names();
    let sql = format!(
        "SELECT r.id, r.external_id, r.content_hash FROM unnest($3::text[]) AS k(external_id) \
         CROSS JOIN LATERAL (SELECT id, external_id, content_hash FROM records \
         WHERE {user_id} = $1 AND {provider} = $2 AND {external_id} = k.external_id LIMIT 1) AS r"
    );
    let ids: Vec<String> = records
        .iter()
        .map(|record| record.external_id.clone())
        .collect();
    let statement = sea_orm::Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        [
            connection.user_id.as_str().into(),
            connection.provider.as_str().into(),
            ids.into(),
        ],
    );
    txn.query_all_raw(statement)
        .await?
        .into_iter()
        .map(|row| {
            Ok((
                row.try_get::<i64>("", "id")?,
                row.try_get::<String>("", "external_id")?,
                row.try_get::<String>("", "content_hash")?,
            ))
        })
        .collect()
}
