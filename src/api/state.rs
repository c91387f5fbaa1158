//! What the handlers read.

use std::sync::Arc;

use crate::config::Settings;
use crate::db::DatabasePools;

/// The database, the settings and the rendered document, shared by every request.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub db: DatabasePools,
    pub settings: Arc<Settings>,
    /// `/v1/openapi.json`, rendered once.
    pub openapi: Arc<String>,
}
