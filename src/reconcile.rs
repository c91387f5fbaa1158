//! `tributary reconcile`: clean a records table that holds duplicates from before the
//! unique index existed (an import, an older system), then create the index.
//!
//! Duplicates are found by exactly the pipeline's key (`record::KEY_COLUMNS`). Of each
//! group, the most recently updated row is kept (ties: the lowest id), and every other row
//! is deleted. Each removal is written to the audit log (JSON lines) and flushed to disk
//! before the deletion commits. `--dry-run` reports what would go and changes nothing.

use std::io::Write;
use std::path::Path;

use chrono::Utc;
use sea_orm::sea_query::{Alias, Index};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    TransactionTrait,
};
use serde::Serialize;

use crate::entities::record;
use crate::pipeline::records::delete_duplicates;
use crate::pipeline::{duplicate_keys, StoredKey};

/// How many duplicate keys one batch handles.
const BATCH: u64 = 500;

/// The rule, as written into each audit line.
pub const KEEP_RULE: &str =
    "duplicate of the key (user_id, provider, external_id): kept the most recently updated row (ties: the lowest id)";

/// What a reconciliation found and did.
#[derive(Debug, Default, Serialize)]
pub struct ReconcileReport {
    pub dry_run: bool,
    /// Keys that had more than one row.
    pub duplicate_keys: u64,
    /// Rows removed (or, in a dry run, that would be).
    pub rows_removed: u64,
    /// Whether the unique index was there before.
    pub index_existed: bool,
    /// Whether this run created it.
    pub index_created: bool,
}

/// One audit line: the removed row whole, the kept row's id, the key, the reason, the time.
#[derive(Debug, Serialize)]
struct AuditLine<'a> {
    removed: &'a record::Model,
    kept_id: i64,
    key: &'a StoredKey,
    reason: &'static str,
    at: chrono::DateTime<Utc>,
    dry_run: bool,
}

/// Why a reconciliation stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("writing the audit log {path}: {source}")]
    Audit {
        path: String,
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Database(#[from] DbErr),
}

/// Finds and removes duplicates, then creates the unique index if it is missing.
pub async fn reconcile(
    db: &DatabaseConnection,
    dry_run: bool,
    audit_log: Option<&Path>,
    mut on_removal: impl FnMut(&str),
) -> Result<ReconcileReport, ReconcileError> {
    let mut audit = match audit_log {
        Some(path) => Some(AuditFile::open(path)?),
        None => None,
    };
    let mut report = ReconcileReport {
        dry_run,
        index_existed: crate::db::key_index_present(db).await?,
        ..ReconcileReport::default()
    };
    let mut offset = 0;
    loop {
        // Removed groups stop being duplicates, so a real run always reads the first batch;
        // a dry run changes nothing and pages on.
        let keys = duplicate_keys(db, if dry_run { offset } else { 0 }, BATCH).await?;
        if keys.is_empty() {
            break;
        }
        offset += keys.len() as u64;
        // One transaction per namespace of a user: its removals' `deleted` changes are
        // one batch, and a transaction stamps one.
        for group in keys.chunk_by(StoredKey::same_namespace) {
            let txn = db.begin().await?;
            let mut doomed = Vec::new();
            let mut removed_keys = Vec::new();
            for key in group {
                let rows = record::Entity::find()
                    .filter(key.condition())
                    .order_by_desc(record::Column::UpdatedAt)
                    .order_by_asc(record::Column::Id)
                    .all(&txn)
                    .await?;
                let Some((kept, removed)) = rows.split_first() else {
                    continue;
                };
                report.duplicate_keys += 1;
                if !removed.is_empty() {
                    removed_keys.push(key.external_id.as_str());
                }
                for row in removed {
                    let line = AuditLine {
                        removed: row,
                        kept_id: kept.id,
                        key,
                        reason: KEEP_RULE,
                        at: Utc::now(),
                        dry_run,
                    };
                    let text = serde_json::to_string(&line).map_err(|error| {
                        DbErr::Custom(format!("serialising an audit line: {error}"))
                    })?;
                    if let Some(audit) = audit.as_mut() {
                        audit.write(&text)?;
                    }
                    on_removal(&text);
                    doomed.push(row.id);
                }
            }
            if let Some(audit) = audit.as_mut() {
                // On disk before anything is deleted.
                audit.sync()?;
            }
            report.rows_removed += doomed.len() as u64;
            let Some(StoredKey {
                user_id, provider, ..
            }) = group.first()
            else {
                continue;
            };
            if dry_run || doomed.is_empty() {
                txn.rollback().await?;
                continue;
            }
            delete_duplicates(&txn, user_id, provider, &doomed, &removed_keys).await?;
            txn.commit().await?;
        }
    }
    if !report.index_existed && !dry_run {
        create_key_index(db).await?;
        report.index_created = true;
    }
    Ok(report)
}

/// Creates the composite unique index on exactly `record::KEY_COLUMNS`.
async fn create_key_index(db: &DatabaseConnection) -> Result<(), DbErr> {
    let mut index = Index::create();
    index
        .name(tributary_migrations::RECORDS_KEY_INDEX)
        .table(Alias::new("records"))
        .unique();
    for column in record::KEY_COLUMNS {
        index.col(column);
    }
    db.execute(&index).await?;
    Ok(())
}

/// The audit log, appended to and flushed before each deletion commits.
struct AuditFile {
    path: String,
    file: std::io::BufWriter<std::fs::File>,
}

use std::os::unix::fs::OpenOptionsExt;

impl AuditFile {
    fn open(path: &Path) -> Result<AuditFile, ReconcileError> {
        let display = path.display().to_string();
        // The removed rows hold the records' payloads: readable by the owner only.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| ReconcileError::Audit {
                path: display.clone(),
                source,
            })?;
        Ok(AuditFile {
            path: display,
            file: std::io::BufWriter::new(file),
        })
    }

    fn write(&mut self, line: &str) -> Result<(), ReconcileError> {
        writeln!(self.file, "{line}").map_err(|source| self.failed(source))
    }

    fn sync(&mut self) -> Result<(), ReconcileError> {
        self.file.flush().map_err(|source| self.failed(source))?;
        self.file
            .get_ref()
            .sync_data()
            .map_err(|source| self.failed(source))
    }

    fn failed(&self, source: std::io::Error) -> ReconcileError {
        ReconcileError::Audit {
            path: self.path.clone(),
            source,
        }
    }
}
