//! The DynamoDB store: dedup records, the inbox and the ordering guard in one
//! table, every change one conditional write.
//!
//! [`DynamoDbStore`] talks to DynamoDB through the official AWS SDK
//! ([`aws_sdk_dynamodb`], re-exported here as [`aws_sdk_dynamodb`]): credentials
//! and region come from the standard chain (environment, profile, web identity,
//! ECS and instance metadata) through `aws-config`, and an endpoint override points
//! it at a local DynamoDB-compatible server. HTTPS goes through rustls on `ring`.
//!
//! # Schema
//!
//! One table (create it with [`DynamoDbStore::create_table`], idempotent, or with
//! `webhook-guard migrate`), billed on demand:
//!
//! | what | name | type |
//! |---|---|---|
//! | partition key | `pk` | string |
//! | global secondary index | `due`: partition key `due_pk` (string), sort key `due_at` (number), keys only | |
//! | global secondary index | `list`: partition key `list_pk` (string), sort key `list_at` (string), keys only | |
//! | time to live | attribute `ttl` (seconds since the epoch) | |
//!
//! Three kinds of items share it, told apart by the first letter of `pk`:
//!
//! - `r/<len>/<namespace>/<id>` — a dedup [`Record`](super::Record): `ns`, `id`,
//!   `state`, `token`, `fp` (hex), `attempts`, `failures`, `lease_until`,
//!   `expires_at`, `created_at`, `updated_at` (times in milliseconds since the
//!   epoch), `history` (JSON, absent when empty) and `v`, a version counted up by
//!   every write;
//! - `e/<len>/<namespace>/<id>` — an inbox event: the same kind of fields plus
//!   `payload` (binary), `next_attempt_at`, `received_at`, `last_error` and the
//!   metadata `event_type`, `event_created_at`, `object`, `family`;
//! - `o/<len>/<namespace>/<len>/<object>/<family>` — an ordering record: `newest`,
//!   `status`, `updated_at`.
//!
//! `<len>` is the byte length of the part that follows it, so that no two keys
//! spell one `pk` whatever their namespace, id or object hold (the other stores
//! join namespace and id with a NUL, which a namespace must not hold; this store
//! needs no such rule). A `pk` holds at most 2048 bytes (DynamoDB's limit), and a
//! record's id at most 1006 (its `list_at`, the `list` index's sort key, at most
//! 1024): a longer one is refused with [`DynamoDbStoreError::KeyTooLong`].
//!
//! # The `due` index: why a sparse GSI
//!
//! Listing stuck claims, purging and leasing inbox events must not scan the table
//! (a `Scan` reads, and bills, every item), and a local secondary index cannot
//! serve them: it shares the table's partition key, one per record, while these
//! reads span many records. So a global secondary index does, keyed by what the
//! reader asks for: every item that something will look for carries `due_pk` and
//! `due_at`, and the `due` index files it there:
//!
//! | item | `due_pk` | `due_at` |
//! |---|---|---|
//! | record `InProgress` | `r/lease/<shard>` | end of the lease |
//! | record finished | `r/expiry/<shard>` | expiry |
//! | inbox event `Pending` / `Running` | `e/due/<namespace>` | next attempt / end of the lease |
//! | inbox event settled | `e/settled/<shard>` | expiry |
//! | ordering record `Failed` | `o/failed/<namespace>` | `updated_at` |
//!
//! Ordering records in any other status carry no index keys: the index is sparse,
//! and holds them only while they are failed. [`stuck`](super::ProcessedStore::stuck)
//! reads the `r/lease/…` partitions up to `now`, oldest first;
//! [`purge_expired`](super::ProcessedStore::purge_expired) the `r/expiry/…` and
//! `r/lease/…` ones; an inbox lease its namespace's `e/due/…` partition, so it
//! hands out the longest-due events first. A record's shard is a stable hash
//! (FNV-1a) of its key modulo the shard count (default [`DEFAULT_SHARDS`]), so the
//! index writes of every claim and finish spread over that many index partitions
//! instead of one hot one; `stuck` and `purge_expired` query every shard. Every
//! process sharing a table must use the same shard count.
//!
//! The price on the hot path: a claim writes one entry in `due` and one in `list`
//! (below), and a finish moves both (small index writes, billed as index write
//! units), with no extra round trip.
//! The index holds keys only (`KEYS_ONLY`), and is eventually consistent: what it
//! lists is read again, or changed by a conditional write, on the table itself,
//! so a stale index entry never yields a wrong answer — at worst an item is found a
//! moment late (a claim made a moment ago not yet listed as stuck, an inbox event
//! leased slightly out of order).
//!
//! # The `list` index: records by namespace, state and change time
//!
//! Every record also carries `list_pk` = `r/<len>/<namespace>/<state>/<shard>` and
//! `list_at` = `<updated_at + 10^16, 17 digits>/<id>`, written by the same
//! conditional `PutItem` or `UpdateItem` that writes the record (a claim, a
//! take-over, a finish), so the `list` index files each record under its
//! namespace and state, ordered by `(updated_at, id)`; a deleted or purged record
//! leaves it with its item. A page of a listing is, per state asked for and per
//! shard, one `Query` of the partition newest first (`ScanIndexForward=false`,
//! `Limit` a share of the page, `list_at` between the range's start and the
//! cursor), merged, then one strongly consistent `BatchGetItem` of the page's
//! records (the index holds keys only). An entry whose record changed since the
//! index was written (the index is eventually consistent) is skipped. At a million
//! records the page of the newest 100 failed is 16 queries of about 14 keys each
//! (16 shards) and 100 reads: a few dozen read units, whatever the table's size.
//!
//! The index is sharded like `due`, for the same reason: a partition key of a
//! global secondary index takes some 1,000 writes a second, and one per namespace
//! and state would cap a namespace's claims (every one writes `in_progress`) and
//! finishes there, and throttling an index throttles the table's writes. The
//! price is a query per shard per page. An id prefix is checked on the entries the
//! queries read (`list_at` holds the id after the time): a rare prefix reads the
//! whole range of its states, up to a budget per page. Counting the finished states
//! is a `Select=COUNT` query per partition (reads every entry counted); counting
//! in-progress or stuck records, or with an id prefix, reads page by page.
//!
//! Verified against moto (the emulator the tests run on), not against DynamoDB
//! itself: the schema, the queries and their order, paging and the conditional
//! writes; not the capacity figures above.
//!
//! # Claims and fences
//!
//! A claim is one `PutItem` conditioned on `attribute_not_exists(pk)` that asks for
//! the stored item when the condition fails (`ReturnValuesOnConditionCheckFailure`):
//! a new id costs one write, a duplicate one refused write. A claim that may change
//! a known record (take over an expired lease or a failed record, replace an expired
//! one) puts the new record conditioned on the version it read, and decides again if
//! that changed. A finish is one `UpdateItem` conditioned on the record being
//! `InProgress` with the finishing claim's token: a stale holder's finish is refused
//! by DynamoDB itself. A renewal reads the record and writes it back conditioned on
//! its version; an inbox lease, settle and renewal and every ordering change are one
//! conditional `UpdateItem` each, except the first observation of an object, a
//! `PutItem` conditioned on `attribute_not_exists(pk)` (an update never creates an
//! item here, so that no reader meets one half made on a server that does not
//! apply the two as one step). The SDK sends a request again after a lost reply:
//! a claim that meets its own record answers as granted; a finish that meets its own
//! result answers [`LeaseLost`](super::Fence::LeaseLost), and the guard, reading the
//! record, finds its own token and state there.
//!
//! # Retention: TTL, and `purge_expired`
//!
//! Every dedup record carries `ttl`: the later of its expiry and the end of its
//! lease, in seconds, *measured from the caller's `now`* (as the Redis store's key
//! TTLs are) and rounded up; a settled inbox event carries its expiry; unsettled
//! events and ordering records never expire. DynamoDB's TTL deletes items some time
//! after that — usually within a few days, never before — at no write cost. It is
//! an economy, not the contract: a claim treats a record expired by its `now` as
//! absent while the item lives on, and
//! [`purge_expired`](super::ProcessedStore::purge_expired) and
//! [`purge_settled`](crate::inbox::InboxStore::purge_settled) remove expired items
//! at once, through the index, with a conditional `DeleteItem` each (an item changed
//! since it was listed is left alone). No [`Sweeper`](crate::sweeper::Sweeper) is
//! needed for retention; running one anyway also reports stuck claims.
//!
//! # Listing
//!
//! [`record_listing`](super::ProcessedStore::record_listing) and
//! [`inbox_listing`](crate::inbox::InboxStore::inbox_listing) answer the store
//! itself. The table has no index by change time, so a page is a strongly
//! consistent `Scan` of the whole table filtered by `pk` prefix: it reads and
//! bills every item (see [`store::listing`](super::listing) for the cost at a
//! million records). Requeue and purge of a dead letter are one conditional write
//! each.
//!
//! # Item size
//!
//! A DynamoDB item holds at most 400 KB ([`MAX_ITEM_BYTES`]). A record's history is
//! bounded ([`HISTORY_LIMIT`](super::HISTORY_LIMIT) notes of bounded length), so
//! records stay far below it. An inbox event holds its payload: an event whose item
//! would pass the limit is refused before it is sent, with
//! [`StoreError::Backend`] whose source is
//! [`DynamoDbStoreError::ItemTooLarge`]. Keep the guard's body limit below about
//! 390 KB when the inbox is on DynamoDB.
//!
//! # Errors
//!
//! A request that could not be sent, timed out, got no complete answer, or was
//! throttled or failed on the server's side (HTTP 5xx) is
//! [`StoreError::Unavailable`]; any other error is
//! [`StoreError::Backend`]. Both keep the SDK's error as
//! their source. The SDK tries a throttled or failed request again itself before
//! answering ([`DynamoDbStoreBuilder::max_attempts`], default three attempts), so a
//! call may outlast one attempt's timeout; a write it sent again after a lost reply
//! is met as described above.
//!
//! # What was verified where
//!
//! The crate's tests run every conformance suite (records, inbox, ordering), the
//! store cut mid-handler and mid-settle through a TCP proxy, and the guard itself,
//! against a DynamoDB-compatible emulator (`moto` in server mode), not against AWS:
//! the conditional writes, `ReturnValuesOnConditionCheckFailure`, the `due` index,
//! `CreateTable` and `UpdateTimeToLive` are exercised there. The emulator's index
//! is consistent at once and it deletes nothing by TTL, so the index's lag and TTL
//! deletion are handled by design (above), not tested against DynamoDB itself;
//! neither are IAM permissions, throttling, or the SDK's credential chain beyond
//! environment variables.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Utc};

use super::{Key, StoreError};

/// The AWS SDK for DynamoDB this store is built on, for building a client by hand
/// ([`DynamoDbStore::from_client`]).
pub use aws_sdk_dynamodb;

mod codec;
mod inbox;
mod listing;
mod ordering;
mod processed;
mod schema;

pub use schema::TTL_ATTRIBUTE;

/// The shard count of a store built without [`DynamoDbStoreBuilder::shards`].
pub const DEFAULT_SHARDS: u16 = 16;
/// The highest shard count accepted.
pub const MAX_SHARDS: u16 = 1024;
/// The most bytes a DynamoDB item may hold (names and values): 400 KB.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// The most bytes a DynamoDB partition key may hold.
pub const MAX_KEY_BYTES: usize = 2048;
/// The most bytes a DynamoDB sort key may hold: a record's `list_at`, 18 bytes
/// before its id, is the `list` index's.
pub const MAX_SORT_KEY_BYTES: usize = 1024;
/// The name of the global secondary index the store reads due items from.
pub const DUE_INDEX: &str = "due";
/// The name of the global secondary index records are listed from (see
/// [`store::listing`](crate::store::listing)).
pub const LIST_INDEX: &str = "list";
/// How long connecting may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one attempt of a request may take by default.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// How many attempts the SDK makes of a request by default
/// ([`DynamoDbStoreBuilder::max_attempts`]): its standard retry mode's.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// How many keys one index page or batch read handles.
const PAGE: usize = 100;

/// Why a [`DynamoDbStore`] could not be built, or a write was refused before it was
/// sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DynamoDbStoreError {
    /// The table name is not 3 to 255 characters of letters, digits, `_`, `-`, `.`.
    #[error("invalid DynamoDB table name `{0}`: use 3 to 255 letters, digits, `_`, `-` or `.`")]
    InvalidTable(String),
    /// The shard count is 0 or above [`MAX_SHARDS`].
    #[error("invalid shard count {0}: use 1 to {MAX_SHARDS}")]
    InvalidShards(u16),
    /// No region was given and the standard chain found none.
    #[error("no AWS region: set AWS_REGION, a profile's region, or the store's region")]
    NoRegion,
    /// The item would pass DynamoDB's item size limit ([`MAX_ITEM_BYTES`]): an
    /// inbox event whose payload is too large.
    #[error("the item would hold about {bytes} bytes; DynamoDB takes at most {MAX_ITEM_BYTES}")]
    ItemTooLarge {
        /// The item's size as the store counts it (an upper bound).
        bytes: usize,
    },
    /// The key would pass DynamoDB's key size limit: [`MAX_KEY_BYTES`] for an
    /// item's key, [`MAX_SORT_KEY_BYTES`] for the `list` index's sort key, which
    /// holds a record's id.
    #[error("the key would hold {bytes} bytes; DynamoDB takes at most {limit}")]
    KeyTooLong {
        /// The key's size in bytes.
        bytes: usize,
        /// The limit it passes.
        limit: usize,
    },
    /// The table exists but lacks what the store needs (the `due` index).
    #[error("the DynamoDB table does not match the store's schema: {0}")]
    Schema(String),
}

/// A [`ProcessedStore`](super::ProcessedStore), an
/// [`InboxStore`](crate::inbox::InboxStore) and an
/// [`OrderingStore`](crate::ordering::OrderingStore) on one DynamoDB table: see the
/// [module docs](self) for the schema, the index and retention.
///
/// Cheap to clone: clones share one SDK client.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use webhook_guard::store::DynamoDbStore;
///
/// // Credentials and region from the standard chain (AWS_REGION, profiles, roles).
/// let store = DynamoDbStore::builder("webhook_guard").connect().await?;
/// store.create_table().await?; // idempotent: at start-up or from a deploy step
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DynamoDbStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    shards: u16,
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.inner.table)
            .field("shards", &self.inner.shards)
            .finish_non_exhaustive()
    }
}

/// Builds a [`DynamoDbStore`] with the SDK's standard configuration chain: see
/// [`DynamoDbStore::builder`].
#[derive(Debug, Clone)]
pub struct DynamoDbStoreBuilder {
    table: String,
    region: Option<String>,
    endpoint: Option<String>,
    shards: u16,
    connect_timeout: Duration,
    attempt_timeout: Duration,
    max_attempts: u32,
}

impl DynamoDbStoreBuilder {
    /// The region, instead of the one the standard chain finds (`AWS_REGION`, the
    /// profile's).
    #[must_use]
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sends requests to `url` instead of the region's DynamoDB endpoint: a local
    /// DynamoDB-compatible server, such as `http://127.0.0.1:8000`.
    #[must_use]
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// How many shards the index entries of records and settled events are spread
    /// over (default [`DEFAULT_SHARDS`]). Every process sharing a table must use
    /// the same count.
    #[must_use]
    pub fn shards(mut self, shards: u16) -> Self {
        self.shards = shards;
        self
    }

    /// How long connecting may take (default [`DEFAULT_CONNECT_TIMEOUT`]).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one attempt of a request may take (default
    /// [`DEFAULT_ATTEMPT_TIMEOUT`]); see [`max_attempts`](Self::max_attempts).
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How many attempts the SDK makes of a request that fails for a reason worth
    /// trying again (a timeout, a lost connection, throttling, a 5xx), backing off
    /// between them (default [`DEFAULT_MAX_ATTEMPTS`], at least 1). With 1, a
    /// call fails at the first such error, as the other stores' do, and the guard
    /// and the inbox worker retry by their own rules; with more, one call of the
    /// store may last up to that many attempt timeouts plus the backoff.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Loads the SDK's configuration (credentials, region) and builds the store.
    /// Sends no request: a missing table or bad credentials show at the first call
    /// (or at [`DynamoDbStore::create_table`]).
    ///
    /// # Errors
    /// [`DynamoDbStoreError::InvalidTable`], [`DynamoDbStoreError::InvalidShards`],
    /// or [`DynamoDbStoreError::NoRegion`].
    pub async fn connect(self) -> Result<DynamoDbStore, DynamoDbStoreError> {
        check_table(&self.table)?;
        check_shards(self.shards)?;
        use aws_smithy_http_client::tls;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout)
            .operation_attempt_timeout(self.attempt_timeout)
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts)
            .retry_config(
                aws_config::retry::RetryConfig::standard().with_max_attempts(self.max_attempts),
            );
        if let Some(region) = self.region {
            loader = loader.region(aws_config::Region::new(region));
        }
        if let Some(endpoint) = self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(DynamoDbStoreError::NoRegion);
        }
        DynamoDbStore::with_client(Client::new(&config), self.table, self.shards)
    }
}

fn check_table(table: &str) -> Result<(), DynamoDbStoreError> {
    let ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(DynamoDbStoreError::InvalidTable(table.to_owned()))
    }
}

fn check_shards(shards: u16) -> Result<(), DynamoDbStoreError> {
    if (1..=MAX_SHARDS).contains(&shards) {
        Ok(())
    } else {
        Err(DynamoDbStoreError::InvalidShards(shards))
    }
}

impl DynamoDbStore {
    /// A builder for a store on `table`, configured by the SDK's standard chain.
    pub fn builder(table: impl Into<String>) -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder {
            table: table.into(),
            region: None,
            endpoint: None,
            shards: DEFAULT_SHARDS,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// A store on `table` through a client the host built itself (with
    /// [`DEFAULT_SHARDS`]). The client needs an HTTP client: the SDK's default
    /// features, or one set on its configuration.
    ///
    /// # Errors
    /// [`DynamoDbStoreError::InvalidTable`].
    pub fn from_client(
        client: Client,
        table: impl Into<String>,
    ) -> Result<Self, DynamoDbStoreError> {
        Self::with_client(client, table.into(), DEFAULT_SHARDS)
    }

    fn with_client(client: Client, table: String, shards: u16) -> Result<Self, DynamoDbStoreError> {
        check_table(&table)?;
        check_shards(shards)?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                table,
                shards,
            }),
        })
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    fn shard_of(&self, pk: &str) -> u16 {
        // FNV-1a: stable across processes and releases.
        let mut h: u32 = 0x811c_9dc5;
        for b in pk.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        (h % u32::from(self.inner.shards)) as u16
    }
}

// ---------------------------------------------------------------------------
// Keys and expressions

/// `<len>/<part>`: a part whose end is known from its length.
fn push_part(out: &mut String, part: &str) {
    use fmt::Write as _;
    let _ = write!(out, "{}/{part}", part.len());
}

/// The `pk` of a record (`kind` `r`) or an inbox event (`e`) under `key`; a
/// record's id must also fit its `list_at` (see [`MAX_SORT_KEY_BYTES`]).
fn item_pk(kind: char, key: Key<'_>) -> Result<String, StoreError> {
    let mut pk = String::with_capacity(key.namespace.len() + key.id.len() + 8);
    pk.push(kind);
    pk.push('/');
    push_part(&mut pk, key.namespace);
    pk.push('/');
    pk.push_str(key.id);
    let pk = checked_key(pk)?;
    // `list_at`: 17 digits, `/`, the id.
    let list_at = 18 + key.id.len();
    if kind == 'r' && list_at > MAX_SORT_KEY_BYTES {
        return Err(StoreError::backend(DynamoDbStoreError::KeyTooLong {
            bytes: list_at,
            limit: MAX_SORT_KEY_BYTES,
        }));
    }
    Ok(pk)
}

/// `key` unless it passes DynamoDB's key limit.
fn checked_key(key: String) -> Result<String, StoreError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(StoreError::backend(DynamoDbStoreError::KeyTooLong {
            bytes: key.len(),
            limit: MAX_KEY_BYTES,
        }));
    }
    Ok(key)
}

/// The names and values an expression refers to, as a request declares them
/// (DynamoDB refuses a declared name or value that no expression uses).
#[derive(Default)]
struct Expr {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expr {
    /// `#attr`, declared.
    fn n(&mut self, attr: &str) -> String {
        let p = format!("#{attr}");
        self.names.insert(p.clone(), attr.to_owned());
        p
    }

    /// `:name`, declared with `value`.
    fn v(&mut self, name: &str, value: AttributeValue) -> String {
        let p = format!(":{name}");
        self.values.insert(p.clone(), value);
        p
    }

    /// `#attr = :name`, `:name` declared with `value`.
    fn eq(&mut self, attr: &str, name: &str, value: AttributeValue) -> String {
        let name = self.v(name, value);
        format!("{} = {name}", self.n(attr))
    }

    fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }
}

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: impl fmt::Display) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

type Item = HashMap<String, AttributeValue>;

fn pk_only(pk: &str) -> Item {
    HashMap::from([("pk".to_owned(), s(pk))])
}

/// Milliseconds since the epoch (rounded down: a `now`).
fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The `ttl` of an item due at `due_ms` by the caller's clock at `now_ms`: the
/// real time in seconds that lies as far ahead, rounded up.
fn ttl_secs(due_ms: i64, now_ms: i64) -> i64 {
    let real_ms = millis(Utc::now());
    let at = real_ms.saturating_add(due_ms.saturating_sub(now_ms).max(0));
    at.div_euclid(1000) + i64::from(at.rem_euclid(1000) != 0)
}

// ---------------------------------------------------------------------------
// Errors

/// A refused conditional write: the stored item when DynamoDB sent it back.
enum Write<T> {
    Done(T),
    Refused(Option<Item>),
}

/// Whether an SDK error means the service could not be reached or could not
/// answer now.
fn unavailable<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(se) if se.raw().status().is_server_error() => true,
        SdkError::ServiceError(se) => matches!(
            se.err().code(),
            Some(
                "ProvisionedThroughputExceededException"
                    | "RequestLimitExceeded"
                    | "ThrottlingException"
                    | "InternalServerError"
                    | "ServiceUnavailable"
                    | "LimitExceededException"
            )
        ),
        _ => false,
    }
}

/// The store error for an SDK error.
fn store_error<E>(e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if refused(&e) {
        StoreError::not_sent(e)
    } else if unavailable(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
    }
}

/// Whether the request could not be sent because the endpoint refused the
/// connection: nothing reached DynamoDB.
fn refused<E: std::error::Error + 'static>(e: &SdkError<E, HttpResponse>) -> bool {
    let SdkError::DispatchFailure(_) = e else {
        return false;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// A builder's error (a required field missing): a bug of this store.
fn build_error(e: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::backend(e)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("dynamodb item: {what}"))
}

// ---------------------------------------------------------------------------
// Requests shared by the three stores

/// Sends the write `$request` under `$condition` (names and values from `$expr`),
/// asking for the stored item on a refusal: `Write::Done($done)` (`$out` the
/// output), or `Write::Refused` with the item when the condition failed
/// (`$op::$error`: the operation's module and error type).
macro_rules! conditional_write {
    ($request:expr, $condition:expr, $expr:expr, $op:ident::$error:ident, $out:pat => $done:expr) => {
        match $request
            .condition_expression($condition)
            .set_expression_attribute_names($expr.names())
            .set_expression_attribute_values($expr.values())
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await
        {
            Ok($out) => Ok(Write::Done($done)),
            Err(e) => match e.as_service_error() {
                Some(
                    aws_sdk_dynamodb::operation::$op::$error::ConditionalCheckFailedException(c),
                ) => Ok(Write::Refused(c.item().cloned())),
                _ => Err(store_error(e)),
            },
        }
    };
}

impl DynamoDbStore {
    /// A strongly consistent `GetItem` of `pk`.
    async fn get_item(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let out = (self.inner.client.get_item())
            .table_name(&self.inner.table)
            .set_key(Some(pk_only(pk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(store_error)?;
        Ok(out.item)
    }

    /// A `PutItem` of `item` under `condition`.
    async fn put_if(
        &self,
        item: Item,
        condition: &str,
        expr: Expr,
    ) -> Result<Write<()>, StoreError> {
        let size = codec::item_size(&item);
        if size > MAX_ITEM_BYTES {
            return Err(StoreError::backend(DynamoDbStoreError::ItemTooLarge {
                bytes: size,
            }));
        }
        let put = (self.inner.client.put_item())
            .table_name(&self.inner.table)
            .set_item(Some(item));
        conditional_write!(put, condition, expr, put_item::PutItemError, _ => ())
    }

    /// An `UpdateItem` of `pk` under `condition`, answering the new item.
    async fn update_if(
        &self,
        pk: &str,
        update: &str,
        condition: &str,
        expr: Expr,
    ) -> Result<Write<Item>, StoreError> {
        let update = (self.inner.client.update_item())
            .table_name(&self.inner.table)
            .set_key(Some(pk_only(pk)))
            .update_expression(update)
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew);
        conditional_write!(update, condition, expr, update_item::UpdateItemError,
            out => out.attributes.unwrap_or_default())
    }

    /// A `DeleteItem` of `pk` under `condition`.
    async fn delete_if(
        &self,
        pk: &str,
        condition: &str,
        expr: Expr,
    ) -> Result<Write<()>, StoreError> {
        let delete = (self.inner.client.delete_item())
            .table_name(&self.inner.table)
            .set_key(Some(pk_only(pk)));
        conditional_write!(delete, condition, expr, delete_item::DeleteItemError, _ => ())
    }

    /// A `Query` of the index `index` under the key condition `condition` (names
    /// and values from `expr`).
    fn index_query(&self, index: &str, condition: String, expr: &Expr) -> QueryFluentBuilder {
        (self.inner.client.query())
            .table_name(&self.inner.table)
            .index_name(index)
            .key_condition_expression(condition)
            .set_expression_attribute_names(expr.names())
            .set_expression_attribute_values(expr.values())
    }

    /// One page of the `due` index's partition `due_pk` up to `until` (inclusive),
    /// oldest first: the `pk`s, and where the next page starts.
    async fn due_page(
        &self,
        due_pk: &str,
        until: i64,
        limit: usize,
        start: Option<Item>,
    ) -> Result<(Vec<String>, Option<Item>), StoreError> {
        let mut expr = Expr::default();
        let condition = format!(
            "{} AND {} <= {}",
            expr.eq("due_pk", "p", s(due_pk)),
            expr.n("due_at"),
            expr.v("until", n(until)),
        );
        let out = (self.index_query(DUE_INDEX, condition, &expr))
            .scan_index_forward(true)
            .limit(i32::try_from(limit.clamp(1, PAGE)).unwrap_or(1))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(store_error)?;
        let pks = (out.items())
            .iter()
            .filter_map(|item| match item.get("pk") {
                Some(AttributeValue::S(pk)) => Some(pk.clone()),
                _ => None,
            })
            .collect();
        Ok((pks, out.last_evaluated_key))
    }

    /// Strongly consistent reads of `pks` (any number), in no particular order;
    /// items gone since are left out.
    async fn get_many(&self, pks: &[String]) -> Result<Vec<Item>, StoreError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        // `BatchGetItem` refuses a request naming a key twice (an entry can stand in
        // two state partitions of the index while it catches up).
        let mut seen = std::collections::HashSet::with_capacity(pks.len());
        let pks: Vec<&String> = pks.iter().filter(|pk| seen.insert(*pk)).collect();
        let mut out = Vec::with_capacity(pks.len());
        for chunk in pks.chunks(PAGE) {
            let mut keys: Vec<Item> = chunk.iter().map(|pk| pk_only(pk)).collect();
            while !keys.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(build_error)?;
                let answer = (self.inner.client.batch_get_item())
                    .request_items(&self.inner.table, request)
                    .send()
                    .await
                    .map_err(store_error)?;
                let (mut responses, unprocessed) = (answer.responses, answer.unprocessed_keys);
                if let Some(items) = responses.as_mut().and_then(|r| r.remove(&self.inner.table)) {
                    out.extend(items);
                }
                keys = (unprocessed.and_then(|mut u| u.remove(&self.inner.table)))
                    .map(|k| k.keys)
                    .unwrap_or_default();
                if !keys.is_empty() {
                    // Throttled: give the table a moment.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        Ok(out)
    }

    /// Deletes the items of `due_pk` due by `until` for which `condition` holds,
    /// up to `limit`, page by page: how many it deleted.
    async fn purge_partition(
        &self,
        due_pk: &str,
        until: i64,
        limit: usize,
        condition: &(dyn Fn(&mut Expr) -> String + Sync),
    ) -> Result<usize, StoreError> {
        let mut removed = 0;
        let mut start = None;
        while removed < limit {
            let (pks, next) = self.due_page(due_pk, until, limit - removed, start).await?;
            let deletes = pks.iter().map(|pk| async move {
                let mut expr = Expr::default();
                let cond = condition(&mut expr);
                self.delete_if(pk, &cond, expr).await
            });
            for deleted in futures_util::future::join_all(deletes).await {
                if let Write::Done(()) = deleted? {
                    removed += 1;
                }
            }
            match next {
                Some(next) => start = Some(next),
                None => break,
            }
        }
        Ok(removed)
    }
}
