//! On MySQL/MariaDB, the key columns compare byte for byte, as they do on SQLite and
//! PostgreSQL: the default collation ignores case, accents and trailing spaces, which
//! would merge `"ab"` with `"AB"` and user `alice` with `Alice`
//! (docs/decisions/byte-exact-keys.md). Every `user_id`, `provider` and `external_id`
//! column gets `utf8mb4_0900_bin` on MySQL 8, `utf8mb4_nopad_bin` on MariaDB, or
//! `utf8mb4_bin` on an older server (which still ignores trailing spaces).
//!
//! The new collation only tells apart values the old one merged, so the unique indexes
//! hold for existing rows.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000004_exact_key_collation"
    }
}

/// A text column: (name, length, nullable).
pub(crate) type Column = (&'static str, u32, bool);

/// (table, columns) for every column that holds part of a key.
const KEY_COLUMNS: &[(&str, &[Column])] = &[
    (
        "connections",
        &[("user_id", 255, false), ("provider", 64, false)],
    ),
    (
        "sync_runs",
        &[("user_id", 255, false), ("provider", 64, false)],
    ),
    (
        "records",
        &[
            ("user_id", 255, false),
            ("provider", 64, false),
            ("external_id", 255, false),
        ],
    ),
    (
        "run_errors",
        &[
            ("user_id", 255, false),
            ("provider", 64, false),
            ("external_id", 255, true),
        ],
    ),
    (
        "processed_keys",
        &[
            ("user_id", 255, false),
            ("provider", 64, false),
            ("external_id", 255, false),
        ],
    ),
];

/// Binary collations without padding, best first.
const EXACT_COLLATIONS: [&str; 2] = ["utf8mb4_0900_bin", "utf8mb4_nopad_bin"];

/// The collation to use on this server.
pub(crate) async fn exact_collation(manager: &SchemaManager<'_>) -> Result<String, DbErr> {
    let db = manager.get_connection();
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::MySql,
            format!(
                "SELECT COLLATION_NAME AS name FROM information_schema.COLLATIONS \
                 WHERE COLLATION_NAME IN ('{}')",
                EXACT_COLLATIONS.join("', '")
            ),
        ))
        .await?;
    let available: Vec<String> = rows
        .iter()
        .filter_map(|row| row.try_get::<String>("", "name").ok())
        .collect();
    Ok(EXACT_COLLATIONS
        .iter()
        .find(|name| available.iter().any(|a| a == *name))
        .map_or("utf8mb4_bin", |name| name)
        .to_string())
}

/// `ALTER TABLE t MODIFY c VARCHAR(n) ... , MODIFY ...` with `collation` (or the table's
/// default when `None`).
pub(crate) fn alter(table: &str, columns: &[Column], collation: Option<&str>) -> String {
    let charset = collation
        .map(|name| format!(" CHARACTER SET utf8mb4 COLLATE {name}"))
        .unwrap_or_default();
    let modifies: Vec<String> = columns
        .iter()
        .map(|(column, length, nullable)| {
            let null = if *nullable { "NULL" } else { "NOT NULL" };
            format!("MODIFY `{column}` VARCHAR({length}){charset} {null}")
        })
        .collect();
    format!("ALTER TABLE `{table}` {}", modifies.join(", "))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let collation = exact_collation(manager).await?;
        for (table, columns) in KEY_COLUMNS {
            manager
                .get_connection()
                .execute_unprepared(&alter(table, columns, Some(&collation)))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        for (table, columns) in KEY_COLUMNS {
            manager
                .get_connection()
                .execute_unprepared(&alter(table, columns, None))
                .await?;
        }
        Ok(())
    }
}
