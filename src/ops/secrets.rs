//! The keys that seal stored credentials: which rows use which key, and rotation.

use serde::Serialize;

use super::OpsError;
use crate::connections::sealing::{self, Reseal, ResealReport, SealingStatus};
use crate::db::DatabasePools;

/// How many connections hold credentials sealed with each key id, and how many in clear.
pub async fn status(db: &DatabasePools) -> Result<SealingStatus, OpsError> {
    Ok(sealing::status(db).await?)
}

/// What a rotation did.
#[derive(Debug, Serialize)]
pub struct Rotated {
    /// The key every secret is now sealed with.
    pub key_id: Option<String>,
    #[serde(flatten)]
    pub report: ResealReport,
}

/// Re-seals every stored secret not sealed under the current key. Each row is rewritten
/// on its own, so an interrupted rotation is safe to run again.
pub async fn rotate(db: &DatabasePools) -> Result<Rotated, OpsError> {
    let report = sealing::reseal(db, Reseal::NotCurrent).await?;
    Ok(Rotated {
        key_id: db.secrets().current().map(|(id, _)| id.to_string()),
        report,
    })
}
