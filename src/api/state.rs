//! What the handlers read.

use std::collections::BTreeMap;
use std::sync::Arc;

use secrecy::SecretString;

use crate::config::Settings;
use crate::db::DatabasePools;
use crate::ops::connect::oauth::ShopifyClients;

/// The database, the settings and the rendered document, shared by every request.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub db: DatabasePools,
    pub settings: Arc<Settings>,
    /// `/v1/openapi.json`, rendered once.
    pub openapi: Arc<String>,
    /// Each webhook provider's secrets, read from their variables at start-up.
    pub webhook_secrets: Arc<BTreeMap<String, Vec<SecretString>>>,
    /// The clients Shopify's code exchanges send with: none at start-up (each provider's
    /// own), a test's own in the Connect page's Shopify test.
    pub shopify_clients: ShopifyClients,
}

impl ApiState {
    pub(crate) fn new(db: DatabasePools, settings: Arc<Settings>, openapi: Arc<String>) -> Self {
        ApiState {
            db,
            settings,
            openapi,
            webhook_secrets: Arc::default(),
            shopify_clients: ShopifyClients::default(),
        }
    }

    /// The id of the database this API serves, which cursors are bound to. Read at each
    /// request, not kept: a database restored in place under a running server is another
    /// database, and its cursors must be refused.
    pub(crate) async fn database_id(&self) -> Result<String, crate::ops::OpsError> {
        crate::ops::records::database_id(self.db.main()).await
    }
}
