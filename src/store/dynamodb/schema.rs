//! Creating the table: `CreateTable` with the documented schema, then
//! `UpdateTimeToLive`.

use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement, KeyType,
    Projection, ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
    TimeToLiveStatus,
};

use super::{build_error, store_error, DynamoDbStore, DynamoDbStoreError, DUE_INDEX, LIST_INDEX};
use crate::store::StoreError;

/// The attribute DynamoDB's time to live reads (seconds since the epoch).
pub const TTL_ATTRIBUTE: &str = "ttl";

/// How long [`DynamoDbStore::create_table`] waits for a new table to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(120);

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement, StoreError> {
    (KeySchemaElement::builder())
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(build_error)
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, StoreError> {
    (AttributeDefinition::builder())
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(build_error)
}

impl DynamoDbStore {
    /// Creates the table unless it exists, waits until it is active, and turns on
    /// its time to live on the `ttl` attribute unless it is on: idempotent, safe
    /// from every replica at start-up. The schema (see the [module docs](super)):
    /// partition key `pk` (string); global secondary index `due` on `due_pk`
    /// (string) and `due_at` (number), keys only, and `list` on `list_pk` and
    /// `list_at` (strings), keys only; billed on demand.
    ///
    /// # Errors
    /// The store's error (for instance for lack of the `dynamodb:CreateTable`,
    /// `DescribeTable`, `DescribeTimeToLive` or `UpdateTimeToLive` permission), or
    /// a [`StoreError::Backend`] with [`DynamoDbStoreError::Schema`] when the table
    /// exists without the `due` or the `list` index.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let client = &self.inner.client;
        let index = |name: &str, pk: &str, sk: &str| {
            (GlobalSecondaryIndex::builder())
                .index_name(name)
                .key_schema(key(pk, KeyType::Hash)?)
                .key_schema(key(sk, KeyType::Range)?)
                .projection(
                    (Projection::builder())
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(build_error)
        };
        let created = (client.create_table())
            .table_name(&self.inner.table)
            .attribute_definitions(attribute("pk", ScalarAttributeType::S)?)
            .attribute_definitions(attribute("due_pk", ScalarAttributeType::S)?)
            .attribute_definitions(attribute("due_at", ScalarAttributeType::N)?)
            .attribute_definitions(attribute("list_pk", ScalarAttributeType::S)?)
            .attribute_definitions(attribute("list_at", ScalarAttributeType::S)?)
            .key_schema(key("pk", KeyType::Hash)?)
            .global_secondary_indexes(index(DUE_INDEX, "due_pk", "due_at")?)
            .global_secondary_indexes(index(LIST_INDEX, "list_pk", "list_at")?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // Created before (by this replica or another).
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(CreateTableError::ResourceInUseException(_))
                ) => {}
            Err(e) => return Err(store_error(e)),
        }
        self.await_active().await?;

        let ttl = (client.describe_time_to_live())
            .table_name(&self.inner.table)
            .send()
            .await
            .map_err(store_error)?;
        let status =
            (ttl.time_to_live_description()).and_then(|d| d.time_to_live_status().cloned());
        if matches!(
            status,
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
        ) {
            return Ok(());
        }
        let spec = (TimeToLiveSpecification::builder())
            .enabled(true)
            .attribute_name(TTL_ATTRIBUTE)
            .build()
            .map_err(build_error)?;
        (client.update_time_to_live())
            .table_name(&self.inner.table)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Waits until the table and its `due` and `list` indexes are active.
    async fn await_active(&self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        loop {
            let described = (self.inner.client.describe_table())
                .table_name(&self.inner.table)
                .send()
                .await
                .map_err(store_error)?;
            let table = described.table();
            let active = table.and_then(|t| t.table_status()) == Some(&TableStatus::Active);
            let mut index_active = true;
            for name in [DUE_INDEX, LIST_INDEX] {
                let index = table.and_then(|t| {
                    (t.global_secondary_indexes().iter()).find(|i| i.index_name() == Some(name))
                });
                let Some(index) = index else {
                    return Err(StoreError::backend(DynamoDbStoreError::Schema(format!(
                        "no `{name}` index (create the table with `create_table`)"
                    ))));
                };
                index_active &= index
                    .index_status()
                    .is_none_or(|s| *s == IndexStatus::Active);
            }
            if active && index_active {
                return Ok(());
            }
            if started.elapsed() > ACTIVE_WITHIN {
                return Err(StoreError::unavailable(std::io::Error::other(
                    "webhook-guard: the DynamoDB table did not become active in time",
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
