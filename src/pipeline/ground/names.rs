//! The names of the entities' tables and columns, for statements written as SQL text.

use sea_orm::{EntityName, IdenStatic, Iterable};

use crate::entities::change::ChangeKind;
use crate::entities::sync_run::RunStatus;
use crate::entities::{
    change, change_batch, change_clock, connection, connection_stream, record, run_sighting,
    sync_run,
};

/// `template` with each table and column named as its entity names it: `{records}`,
/// `{sync_runs}`, `{connections}`, `{connection_streams}`, `{changes}`, `{change_batches}`, `{change_clock}`
/// and `{run_sightings}`, columns such as `{record::ExternalId}`, `{sync_run::Id}` or
/// `{change_batch::Seq}` (the columns' variants), and the change kinds and run
/// statuses as quoted literals (`{kind::Inserted}` is `'inserted'`,
/// `{status::Running}` is `'running'`).
pub fn sql(template: &str) -> String {
    let mut sql = template
        .replace("{records}", record::Entity.table_name())
        .replace("{sync_runs}", sync_run::Entity.table_name())
        .replace("{connections}", connection::Entity.table_name())
        .replace(
            "{connection_streams}",
            connection_stream::Entity.table_name(),
        )
        .replace("{changes}", change::Entity.table_name())
        .replace("{change_batches}", change_batch::Entity.table_name())
        .replace("{change_clock}", change_clock::Entity.table_name())
        .replace("{run_sightings}", run_sighting::Entity.table_name());
    for column in record::Column::iter() {
        sql = sql.replace(&format!("{{record::{column:?}}}"), column.as_str());
    }
    for column in sync_run::Column::iter() {
        sql = sql.replace(&format!("{{sync_run::{column:?}}}"), column.as_str());
    }
    for column in connection::Column::iter() {
        sql = sql.replace(&format!("{{connection::{column:?}}}"), column.as_str());
    }
    for column in connection_stream::Column::iter() {
        sql = sql.replace(
            &format!("{{connection_stream::{column:?}}}"),
            column.as_str(),
        );
    }
    for column in change::Column::iter() {
        sql = sql.replace(&format!("{{change::{column:?}}}"), column.as_str());
    }
    for column in change_batch::Column::iter() {
        sql = sql.replace(&format!("{{change_batch::{column:?}}}"), column.as_str());
    }
    for column in change_clock::Column::iter() {
        sql = sql.replace(&format!("{{change_clock::{column:?}}}"), column.as_str());
    }
    for column in run_sighting::Column::iter() {
        sql = sql.replace(&format!("{{run_sighting::{column:?}}}"), column.as_str());
    }
    for kind in ChangeKind::iter() {
        let literal = format!("'{}'", sea_orm::ActiveEnum::to_value(&kind));
        sql = sql.replace(&format!("{{kind::{kind:?}}}"), &literal);
    }
    for status in RunStatus::iter() {
        let literal = format!("'{}'", sea_orm::ActiveEnum::to_value(&status));
        sql = sql.replace(&format!("{{status::{status:?}}}"), &literal);
    }
    sql
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_name_in_a_template_is_the_entitys() {
        let sql = super::sql(
            "SELECT {record::ExternalId} FROM {records}, {sync_runs} \
             WHERE {sync_run::HeartbeatAt} IS NULL AND {connection::Checkpoint} = 1",
        );
        assert_eq!(
            sql,
            "SELECT external_id FROM records, sync_runs \
             WHERE heartbeat_at IS NULL AND checkpoint = 1"
        );
    }

    #[test]
    fn the_change_feeds_names_and_kinds_are_the_entitys() {
        let sql = super::sql(
            "UPDATE {change_clock} SET {change_clock::Seq} = 1; \
             INSERT INTO {changes} ({change::BatchId}, {change::Kind}) \
             SELECT {change_batch::Id}, {kind::Inserted} FROM {change_batches}",
        );
        assert_eq!(
            sql,
            "UPDATE change_clock SET seq = 1; \
             INSERT INTO changes (batch_id, kind) \
             SELECT id, 'inserted' FROM change_batches"
        );
    }
}
