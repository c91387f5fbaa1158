//! The parent records a child stream is listed per: the live records of the parent
//! stream for the connection's user, read in external id order a chunk at a time, so a
//! walk holds a bounded number of them and can resume after the one it reached.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use crate::entities::record;

/// How many parents one read returns.
const PARENT_CHUNK: u64 = 100;

/// One parent record as the walk needs it.
#[derive(Clone, Debug)]
pub(super) struct Parent {
    pub external_id: String,
    pub payload: String,
    /// The run that first stored it: a parent newer than the child stream's last
    /// complete run has had none of its children listed yet.
    pub first_seen_run_id: i64,
}

/// Where the next read of parents starts.
#[derive(Clone, Debug)]
pub(super) enum From {
    /// The first parent.
    Start,
    /// The parent with this id, if it is still there, else the one after it.
    At(String),
    /// The parent after this id.
    After(String),
}

/// The next chunk of live parents of `user_id` in namespace `namespace`, from `from`.
/// Parents marked deleted are skipped.
pub(super) async fn next_chunk(
    db: &impl ConnectionTrait,
    user_id: &str,
    namespace: &str,
    from: &From,
) -> Result<Vec<Parent>, DbErr> {
    let mut query = record::Entity::find()
        .select_only()
        .columns([
            record::Column::ExternalId,
            record::Column::Payload,
            record::Column::FirstSeenRunId,
        ])
        .filter(record::Column::UserId.eq(user_id))
        .filter(record::Column::Provider.eq(namespace))
        .filter(record::Column::DeletedAt.is_null());
    query = match from {
        From::Start => query,
        From::At(id) => query.filter(record::Column::ExternalId.gte(id.as_str())),
        From::After(id) => query.filter(record::Column::ExternalId.gt(id.as_str())),
    };
    let rows: Vec<(String, String, i64)> = query
        .order_by_asc(record::Column::ExternalId)
        .limit(PARENT_CHUNK)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(external_id, payload, first_seen_run_id)| Parent {
            external_id,
            payload,
            first_seen_run_id,
        })
        .collect())
}
