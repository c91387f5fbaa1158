//! Which migrations a database has against the ones this binary knows: a binary never
//! writes to a schema newer than it knows, and says which migrations it applies.

use sea_orm::{DatabaseConnection, DbErr};
use tributary_migrations::{Migrator, MigratorTrait};

/// A database's migrations, compared with this binary's.
#[derive(Debug)]
pub(crate) struct SchemaState {
    /// Applied, oldest first.
    pub(crate) applied: Vec<String>,
    /// Known here and not applied, in the order they run.
    pub(crate) pending: Vec<String>,
    /// Applied and not known here: a newer release applied them.
    pub(crate) unknown: Vec<String>,
}

impl SchemaState {
    pub(crate) async fn read(db: &DatabaseConnection) -> Result<SchemaState, DbErr> {
        let applied = tributary_migrations::applied_versions(db).await?;
        let known: Vec<String> = Migrator::migrations()
            .iter()
            .map(|migration| migration.name().to_string())
            .collect();
        let pending = known
            .iter()
            .filter(|version| !applied.contains(version))
            .cloned()
            .collect();
        let unknown = applied
            .iter()
            .filter(|version| !known.contains(version))
            .cloned()
            .collect();
        Ok(SchemaState {
            applied,
            pending,
            unknown,
        })
    }

    /// Whether `version` was applied.
    pub(crate) fn has(&self, version: &str) -> bool {
        self.applied.iter().any(|applied| applied == version)
    }

    /// The newest migration applied that this binary does not know, if any.
    pub(crate) fn newer(&self) -> Option<&str> {
        self.unknown.iter().max().map(String::as_str)
    }
}
