//! What the handlers read.

use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::config::Settings;
use crate::db::DatabasePools;

/// The database, the settings and the rendered document, shared by every request.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub db: DatabasePools,
    pub settings: Arc<Settings>,
    /// `/v1/openapi.json`, rendered once.
    pub openapi: Arc<String>,
    /// The database's id, read once: a migration draws it and nothing changes it.
    database_id: Arc<OnceCell<String>>,
}

impl ApiState {
    pub(crate) fn new(db: DatabasePools, settings: Arc<Settings>, openapi: Arc<String>) -> Self {
        ApiState {
            db,
            settings,
            openapi,
            database_id: Arc::default(),
        }
    }

    /// The id of the database this API serves, which cursors are bound to.
    pub(crate) async fn database_id(&self) -> Result<&str, crate::ops::OpsError> {
        let id = self
            .database_id
            .get_or_try_init(|| crate::ops::records::database_id(self.db.main()))
            .await?;
        Ok(id.as_str())
    }
}
