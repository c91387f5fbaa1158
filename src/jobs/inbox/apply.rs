//! Applying a delivery that carries its object whole: for each connection it was routed
//! to, a run with trigger `webhook` under the connection's lease stores the object as its
//! stream's record through the pipeline (`Run::store`), with the object's version, so
//! the store writes it only over an older one (docs/decisions/webhook-versions.md).

use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};
use tributary_providers::{build_provider, DeletedRecord, PageItem, Record};

use super::carried::Carried;
use crate::config::{ProviderSettings, Settings, StreamSettings};
use crate::db::DatabasePools;
use crate::entities::{connection, record};
use crate::lease::{claim, release, Holder};
use crate::pipeline::{CheckpointMove, DeletionPass, Run, RunEnd, RunPage, RunStatus, Trigger};

/// What applying a delivery came to.
pub(super) enum Applied {
    /// Stored (or found older than what is stored) for every connection. `tied`: the
    /// connections whose stored object has the delivery's version but other content (two
    /// edits within the version's second), from which nothing was stored: a run of the
    /// stream fetches which is newer.
    Stored { tied: Vec<connection::Model> },
    /// A connection's lease is held by a run: the delivery waits for it to end.
    Busy,
}

/// The stream of `provider` that `carried`'s object type names (`charge`: `charges`),
/// or the primary stream (whose namespace is the provider's name) for an object listed
/// there.
pub(super) fn stream_for<'p>(
    provider: &'p ProviderSettings,
    carried: &Carried<'_>,
) -> Option<&'p StreamSettings> {
    let name = &carried.object_type;
    let primary = || {
        let mut streams = provider.streams.iter();
        streams.find(|stream| carried.in_primary && stream.namespace == provider.name)
    };
    provider
        .stream(name)
        .or_else(|| provider.stream(&format!("{name}s")))
        .or_else(primary)
}

/// Stores `carried` for each of `connections` of `provider`, each in a run of its own
/// under the connection's lease. A lease held elsewhere stops at that connection: the
/// caller tries the delivery again, and what was stored already compares as not newer.
pub(super) async fn apply(
    db: &DatabasePools,
    settings: &Settings,
    provider: &ProviderSettings,
    connections: &[connection::Model],
    carried: &Carried<'_>,
) -> Result<Applied, DbErr> {
    let Some(stream) = stream_for(provider, carried) else {
        return Ok(Applied::Stored { tied: Vec::new() });
    };
    let adapter = build_provider(&provider.adapter, &provider.http)
        .map_err(|error| DbErr::Custom(format!("building provider {}: {error}", provider.name)))?;
    // Keyed and checked as the adapter keys a fetched record, or set aside with why.
    let item = match adapter.check_stored(&stream.name, carried.object) {
        Ok(record) if carried.deleted => PageItem::Deleted(DeletedRecord {
            external_id: record.external_id,
            payload: record.payload,
        }),
        Ok(record) => PageItem::Record(record),
        Err(rejected) => PageItem::Rejected(rejected),
    };
    let holder = Holder::current();
    let mut tied = Vec::new();
    for connection in connections {
        let lease = match claim(db, connection, &holder, settings.daemon.lease_ttl).await? {
            Ok(lease) => lease,
            Err(_busy) => return Ok(Applied::Busy),
        };
        let target = Target {
            db,
            provider,
            connection,
            stream,
            version: &carried.version,
        };
        let stored = target.store(&item, &lease).await;
        let released = release(db, connection, &holder).await;
        stored?;
        released?;
        if let PageItem::Record(record) = &item {
            if target.tied(record).await? {
                tied.push(connection.clone());
            }
        }
    }
    Ok(Applied::Stored { tied })
}

/// Where one delivery's object goes.
struct Target<'a> {
    db: &'a DatabasePools,
    provider: &'a ProviderSettings,
    connection: &'a connection::Model,
    stream: &'a StreamSettings,
    version: &'a str,
}

impl Target<'_> {
    /// One run storing `item`: a page of it alone, which leaves the stream's checkpoint
    /// and cursor as they are.
    async fn store(&self, item: &PageItem, lease: &crate::lease::Fence) -> Result<(), DbErr> {
        let mut run = Run::open(
            self.db,
            self.connection,
            self.stream,
            Trigger::Webhook,
            Some(lease),
        )
        .await?;
        let mut stored = run.store(self.page(item.clone())).await?;
        if stored.duplicate > 0 {
            // Another writer inserted the key after the page's lookup: store it again,
            // now compared with that row.
            stored = run.store(self.page(item.clone())).await?;
        }
        let end = RunEnd {
            status: match stored.failed {
                0 => RunStatus::Succeeded,
                _ => RunStatus::Partial,
            },
            error: None,
            // Loose records, not a pass over the listing.
            listing_complete: false,
            checkpoint: CheckpointMove::Keep,
            watermark: None,
            notify: self.provider.notify,
            deletions: DeletionPass::Off,
            full_passes_served: 0,
            authorization_refused: false,
        };
        run.close(end).await?;
        Ok(())
    }

    /// Whether the stored live row of `record`'s key has this delivery's version but
    /// other content. Read after the run: a writer in between at worst queues one run
    /// more, or one less when it stored the newest itself.
    async fn tied(&self, record: &Record) -> Result<bool, DbErr> {
        let stored: Option<(Option<String>, String)> = record::Entity::find()
            .select_only()
            .columns([record::Column::SourceVersion, record::Column::ContentHash])
            .filter(record::Column::UserId.eq(self.connection.user_id.as_str()))
            .filter(record::Column::Provider.eq(self.stream.namespace.as_str()))
            .filter(record::Column::ExternalId.eq(record.external_id.as_str()))
            .filter(record::Column::DeletedAt.is_null())
            .into_tuple()
            .one(self.db.main())
            .await?;
        Ok(stored.is_some_and(|(version, hash)| {
            version.as_deref() == Some(self.version) && hash != record.content_hash
        }))
    }

    fn page(&self, item: PageItem) -> RunPage<'_> {
        RunPage {
            items: vec![item],
            mode: self.provider.write_mode,
            leave_checkpoint: true,
            version: Some(self.version),
            ..RunPage::default()
        }
    }
}
