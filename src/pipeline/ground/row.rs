//! The record row, defined once: which `records` columns a new row fills and where each
//! value comes from, which a rewrite sets, and which a lookup reads. Every backend's
//! statements are rendered from these lists, and the key's columns are
//! [`record::KEY_COLUMNS`]; adding a column to `records` means a migration, the entity
//! and a line here.

use sea_orm::sea_query::{Condition, Expr, ExprTrait};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, IdenStatic, QueryOrder, QuerySelect, Value};
use serde::Serialize;
use tributary_providers::Record;

use crate::entities::record::{self, Column};

/// A field of the record the API sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    ExternalId,
    Payload,
    ContentHash,
}

impl Field {
    /// The field's name, as a statement that lists the fields as rows names them.
    pub fn name(self) -> &'static str {
        match self {
            Field::ExternalId => "external_id",
            Field::Payload => "payload",
            Field::ContentHash => "content_hash",
        }
    }

    /// The field's value in `record`.
    pub fn of(self, record: &Record) -> &str {
        match self {
            Field::ExternalId => &record.external_id,
            Field::Payload => &record.payload,
            Field::ContentHash => &record.content_hash,
        }
    }
}

/// Where a column of a record's row takes its value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The page's user.
    User,
    /// The stream's namespace.
    Provider,
    /// The page's run.
    Run,
    /// The page's time.
    Now,
    /// A field of the record, one value a row.
    Record(Field),
}

/// The columns a new row fills, in the order the inserts give them, and each one's value.
pub const NEW_ROW: [(Column, Source); 9] = [
    (Column::UserId, Source::User),
    (Column::Provider, Source::Provider),
    (Column::ExternalId, Source::Record(Field::ExternalId)),
    (Column::Payload, Source::Record(Field::Payload)),
    (Column::ContentHash, Source::Record(Field::ContentHash)),
    (Column::FirstSeenRunId, Source::Run),
    (Column::LastSeenRunId, Source::Run),
    (Column::CreatedAt, Source::Now),
    (Column::UpdatedAt, Source::Now),
];

/// The columns a rewrite of a stored row sets, and each one's value; it also clears
/// [`DELETION`], since a record written again is live.
pub const REWRITE: [(Column, Source); 4] = [
    (Column::Payload, Source::Record(Field::Payload)),
    (Column::ContentHash, Source::Record(Field::ContentHash)),
    (Column::LastSeenRunId, Source::Run),
    (Column::UpdatedAt, Source::Now),
];

/// The columns that mark a row deleted.
pub const DELETION: [Column; 2] = [Column::DeletedAt, Column::DeletedByRunId];

/// The columns a lookup reads of a stored row, in the order a lookup returns them: its id,
/// its key's external id, its hash and the run that marked it deleted.
pub const STORED: [Column; 4] = [
    Column::Id,
    Column::ExternalId,
    Column::ContentHash,
    Column::DeletedByRunId,
];

/// The fields of a record, one value a row, in the order they first appear in `row`.
pub fn record_fields(row: &[(Column, Source)]) -> Vec<Field> {
    let mut fields = Vec::new();
    for (_, source) in row {
        if let Source::Record(field) = source {
            if !fields.contains(field) {
                fields.push(*field);
            }
        }
    }
    fields
}

/// The values every row of `row` shares, in the order they first appear.
pub fn shared_sources(row: &[(Column, Source)]) -> Vec<Source> {
    let mut shared = Vec::new();
    for (_, source) in row {
        if !matches!(source, Source::Record(_)) && !shared.contains(source) {
            shared.push(*source);
        }
    }
    shared
}

/// The column's value for `record` of the page of `user`, `provider` and `run` at `now`.
pub fn value_of(source: Source, page: &RowPage<'_>, record: &Record) -> Value {
    match source {
        Source::Record(field) => field.of(record).into(),
        shared => page.shared(shared),
    }
}

/// What every row of a page shares.
#[derive(Clone, Copy, Debug)]
pub struct RowPage<'a> {
    pub user_id: &'a str,
    pub provider: &'a str,
    pub run_id: i64,
    pub now: chrono::DateTime<chrono::Utc>,
}

impl RowPage<'_> {
    /// The value of a source that is not a record's field (for which `Value` is null).
    pub fn shared(&self, source: Source) -> Value {
        match source {
            Source::User => self.user_id.into(),
            Source::Provider => self.provider.into(),
            Source::Run => self.run_id.into(),
            Source::Now => self.now.into(),
            Source::Record(_) => Value::String(None),
        }
    }
}

/// The names of `columns`, each after `prefix` (`"r."`, or `""`), joined by `", "`.
pub fn column_list(prefix: &str, columns: impl IntoIterator<Item = Column>) -> String {
    columns
        .into_iter()
        .map(|column| format!("{prefix}{}", column.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of [`NEW_ROW`], as an insert names them.
pub fn new_row_columns() -> String {
    column_list("", NEW_ROW.map(|(column, _)| column))
}

/// The key's columns ([`record::KEY_COLUMNS`]), as a conflict clause names them.
pub fn key_columns() -> String {
    column_list("", record::KEY_COLUMNS)
}

/// Where `column` of a new row takes its value from.
fn source_of(column: Column) -> Option<Source> {
    NEW_ROW
        .iter()
        .find(|(named, _)| named.as_str() == column.as_str())
        .map(|(_, source)| *source)
}

/// The condition that a row (its columns after `prefix`) has a key of the page:
/// `<prefix>user_id <matches> AND ...` over [`record::KEY_COLUMNS`], where `matches`
/// writes each key column's test from its [`Source`] (`= ?1`, `IN (...)`).
pub fn key_match(prefix: &str, matches: impl Fn(Source) -> String) -> String {
    record::KEY_COLUMNS
        .iter()
        .map(|column| {
            let test = source_of(*column).map(&matches).unwrap_or_default();
            format!("{prefix}{} {test}", column.as_str())
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// [`key_match`] built with sea-query: the key's shared columns equal to the page's
/// values, and its external id one of `ids`.
pub fn key_condition<'i>(
    page_user: &str,
    page_provider: &str,
    ids: impl IntoIterator<Item = &'i str>,
) -> Condition {
    let ids: Vec<&str> = ids.into_iter().collect();
    let mut condition = Condition::all();
    for column in record::KEY_COLUMNS {
        let column_expr = Expr::col((record::Entity, column));
        condition = condition.add(match source_of(column) {
            Some(Source::User) => column_expr.eq(page_user),
            Some(Source::Provider) => column_expr.eq(page_provider),
            _ => column_expr.is_in(ids.iter().copied()),
        });
    }
    condition
}

/// A stored row's key: its values of [`record::KEY_COLUMNS`], each named by where a new
/// row takes it from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoredKey {
    pub user_id: String,
    pub provider: String,
    pub external_id: String,
}

// A key is read as one value per key column; `StoredKey::from_values` names them.
const _: () = assert!(record::KEY_COLUMNS.len() == 3);

impl StoredKey {
    /// The key from one value per column of [`record::KEY_COLUMNS`], in its order.
    fn from_values(values: [String; 3]) -> StoredKey {
        let mut key = StoredKey::default();
        for (column, value) in record::KEY_COLUMNS.into_iter().zip(values) {
            match source_of(column) {
                Some(Source::User) => key.user_id = value,
                Some(Source::Provider) => key.provider = value,
                _ => key.external_id = value,
            }
        }
        key
    }

    /// The condition that a row has this key.
    pub fn condition(&self) -> Condition {
        key_condition(&self.user_id, &self.provider, [self.external_id.as_str()])
    }

    /// Whether the two keys share everything but the record's own id: the page's values.
    pub fn same_namespace(&self, other: &StoredKey) -> bool {
        (&self.user_id, &self.provider) == (&other.user_id, &other.provider)
    }
}

/// The keys that more than one row of `records` holds, in the key's order, `limit` of them
/// after the first `offset`.
pub async fn duplicate_keys(
    db: &impl ConnectionTrait,
    offset: u64,
    limit: u64,
) -> Result<Vec<StoredKey>, DbErr> {
    let mut select = record::Entity::find()
        .select_only()
        .columns(record::KEY_COLUMNS);
    for column in record::KEY_COLUMNS {
        select = select.group_by(column).order_by_asc(column);
    }
    let rows: Vec<(String, String, String)> = select
        .having(Expr::col(record::Column::Id).count().gt(1))
        .offset(offset)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(first, second, third)| StoredKey::from_values([first, second, third]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_column_has_a_source_in_the_new_row() {
        for column in record::KEY_COLUMNS {
            assert!(source_of(column).is_some(), "{column:?}");
        }
    }

    #[test]
    fn the_new_row_fills_every_column_but_the_id_and_the_deletion() {
        use sea_orm::Iterable;
        for column in Column::iter() {
            let same = |other: &Column| other.as_str() == column.as_str();
            let filled = NEW_ROW.iter().any(|(named, _)| same(named));
            // The object's version is written only with a delivered object, by the
            // store's versioned path, never by a listing's row.
            let left =
                same(&Column::Id) || DELETION.iter().any(same) || same(&Column::SourceVersion);
            assert_eq!(filled, !left, "{column:?}");
        }
    }

    #[test]
    fn a_stored_key_names_each_key_columns_value_by_its_source() {
        let values = record::KEY_COLUMNS.map(|column| format!("{}-value", column.as_str()));
        let key = StoredKey::from_values(values);
        assert_eq!(
            key,
            StoredKey {
                user_id: "user_id-value".into(),
                provider: "provider-value".into(),
                external_id: "external_id-value".into(),
            }
        );
    }

    #[test]
    fn a_key_match_names_the_keys_columns() {
        let sql = key_match("r.", |source| match source {
            Source::User => "= ?1".into(),
            Source::Provider => "= ?2".into(),
            _ => "IN (?3)".into(),
        });
        assert_eq!(
            sql,
            "r.user_id = ?1 AND r.provider = ?2 AND r.external_id IN (?3)"
        );
    }
}
