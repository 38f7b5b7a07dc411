//! The node-admin contract: the Flight `DoAction` types a cache node offers, with the
//! request and answer body of each.
//!
//! The node answers with these types, the operator and the load generator read them, so
//! a field renamed on one side is a compile error on the other. Every enum reaches the
//! wire through serde or its `as_str` (the same spelling), never through `Debug`.
//!
//! | action | request body | answer |
//! |---|---|---|
//! | `ping` | empty | the bytes [`PONG`] |
//! | `invalidate` | a path key or a ticket | [`InvalidateAnswer`] |
//! | `invalidate-prefix` | a non-empty path prefix | [`RemovedAnswer`] |
//! | `invalidate-tag` | an [`InvalidateTagRequest`] | [`RemovedAnswer`] |
//! | `clear` | empty | [`RemovedAnswer`] |
//! | `stats` | empty | [`StatsAnswer`] |
//! | `configure` | a [`NodeDocument`](crate::node_config::NodeDocument) | [`ConfigureAnswer`] |
//! | `topology` | empty | [`TopologyAnswer`] |
//! | `lease` | a path key or a ticket | [`LeaseAnswer`] |
//! | `rebalance` | empty or a [`RebalanceRequest`] | [`RebalanceAnswer`] |
//! | `held` | a [`HeldRequest`] (binary: the keys to look up) | [`HeldAnswer`] |
//! | `invalidate-local` | an [`InvalidateLocalRequest`] | [`RemovedAnswer`] |
//!
//! A DoPut is answered with one `PutResult` whose `app_metadata` is a [`PutAnswer`].
//!
//! Answers are JSON with camelCase field names. Pure: no I/O.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::node_config::{EvictionPolicy, LocationMode, MemberState, TopologyMember, TtlMode};
use crate::quantity;

/// The answer to `ping`.
pub const PONG: &[u8] = b"pong";

/// An admin action a node offers (the Flight action type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdminAction {
    /// Liveness check.
    Ping,
    /// Remove one key.
    Invalidate,
    /// Remove every path key with a prefix.
    InvalidatePrefix,
    /// Remove every entry carrying one of some tags.
    InvalidateTag,
    /// Remove everything.
    Clear,
    /// Counters, limits and the running config generation.
    Stats,
    /// Apply a live config document and/or a ring.
    Configure,
    /// The ring the node routes by.
    Topology,
    /// A fill lease for a missing key (miss coalescing).
    Lease,
    /// Hand entries the node no longer owns to their owners.
    Rebalance,
    /// Which of a batch of keys the node holds (a peer checking where a copy is missing).
    Held,
    /// Remove, on this node alone, the entries some keys, prefixes and tags select (the
    /// operator running a `CacheInvalidation` on every node).
    InvalidateLocal,
}

/// One row of the action table: everything the contract says of an action.
#[derive(Debug, Clone, Copy)]
pub struct ActionSpec {
    /// The action.
    pub action: AdminAction,
    /// Its Flight action type (also its serde form and a metric label value).
    pub name: &'static str,
    /// Whether it needs the cluster's admin credential (see
    /// [`AdminAction::needs_admin`]).
    pub needs_admin: bool,
    /// Its ListActions description.
    pub description: &'static str,
}

/// The action table, in ListActions order (and in the order of [`AdminAction`]'s
/// variants): the one place an action is named, described and given its rights. The
/// node's dispatch is an exhaustive match on [`AdminAction`], so a new row without its
/// arm does not compile.
pub const ACTIONS: [ActionSpec; 12] = [
    ActionSpec {
        action: AdminAction::Ping,
        name: "ping",
        needs_admin: false,
        description: "Answer 'pong'.",
    },
    ActionSpec {
        action: AdminAction::Invalidate,
        name: "invalidate",
        needs_admin: false,
        description: "Remove one entry. Body: a path key like 'reports/daily', or a ticket.",
    },
    ActionSpec {
        action: AdminAction::InvalidatePrefix,
        name: "invalidate-prefix",
        needs_admin: false,
        description: "Remove every path entry starting with the body, e.g. 'reports/'.",
    },
    ActionSpec {
        action: AdminAction::InvalidateTag,
        name: "invalidate-tag",
        // Tags are what the client's query engine put on its own results.
        needs_admin: false,
        description: "Remove every entry carrying one of the tags a put gave it. Body: JSON \
                      {\"tags\": [\"sales.orders\", ...]}, 1 to 64 tags. Result: {\"removed\": N}.",
    },
    ActionSpec {
        action: AdminAction::Clear,
        name: "clear",
        needs_admin: true,
        description: "Remove every entry.",
    },
    ActionSpec {
        action: AdminAction::Stats,
        name: "stats",
        needs_admin: true,
        description: "Return counters, limits and the config generation as JSON.",
    },
    ActionSpec {
        action: AdminAction::Configure,
        name: "configure",
        needs_admin: true,
        description: "Apply a node config JSON document with live fields (generation, maxEntries, \
                      memoryBudget, maxEntrySize, ttl, ttlMode, eviction, locationMode) and/or a ring topology.",
    },
    ActionSpec {
        action: AdminAction::Topology,
        name: "topology",
        // A ring-aware client reads the ring to dial each key's owner: member ids and
        // their pod addresses, which `direct` GetFlightInfo locations give any client.
        needs_admin: false,
        description: "Return this node's member id and the ring it routes by as JSON.",
    },
    ActionSpec {
        action: AdminAction::Lease,
        name: "lease",
        needs_admin: false,
        description: "Miss coalescing. Body: a key. The first caller gets a fill lease (run the query, \
                      DoPut); later callers wait for that DoPut ('filled') or time out.",
    },
    ActionSpec {
        action: AdminAction::Rebalance,
        name: "rebalance",
        needs_admin: true,
        description: "Hand every entry this node no longer owns under its ring to the key's owners, \
                      hottest first, then remove it here. Body: optional JSON {\"dryRun\": bool, \
                      \"limit\": N}. Result: {\"moved\", \"movedBytes\", \"failed\", \"kept\", \
                      \"copied\", \"copyFailed\", \"ringVersion\"}.",
    },
    ActionSpec {
        action: AdminAction::Held,
        name: "held",
        needs_admin: true,
        description: "Which of up to 1024 keys this node holds, from its store alone. Body: each key's \
                      store bytes after its length (u32, big-endian). Result: {\"held\": [bool, ...]}.",
    },
    ActionSpec {
        action: AdminAction::InvalidateLocal,
        name: "invalidate-local",
        // The operator's, for a CacheInvalidation: it asks every node itself, so that a
        // node that is down is retried alone and each pool's count is exact.
        needs_admin: true,
        description: "Remove, on this node alone (no fan-out), every entry under one of the keys, \
                      under one of the prefixes or carrying one of the tags. Body: JSON {\"keys\": [...], \
                      \"prefixes\": [...], \"tags\": [...]}, at least one selector. Result: {\"removed\": N}.",
    },
];

impl AdminAction {
    /// Every action, in ListActions order (the table's).
    pub const ALL: [Self; ACTIONS.len()] = {
        let mut all = [Self::Ping; ACTIONS.len()];
        let mut row = 0;
        while row < ACTIONS.len() {
            all[row] = ACTIONS[row].action;
            row += 1;
        }
        all
    };

    /// The action's row of [`ACTIONS`].
    pub fn spec(self) -> &'static ActionSpec {
        &ACTIONS[self as usize]
    }

    /// The action type string (also its serde form and a metric label value).
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// Whether the action needs the cluster's admin credential (the operator's): it
    /// changes the node's configuration or ring or reads its counters, removes or moves
    /// entries it did not name, or lists what the node holds (`held`, which the pool's
    /// peers also run). The others (`ping`, `invalidate`, `invalidate-prefix`,
    /// `invalidate-tag`, `lease`, `topology`) are what a client does with its own keys and
    /// tags, and the ring it routes by.
    pub fn needs_admin(self) -> bool {
        self.spec().needs_admin
    }

    /// The ListActions description.
    pub fn description(self) -> &'static str {
        self.spec().description
    }
}

impl std::fmt::Display for AdminAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action type no node offers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown action '{0}'; ListActions names the actions this node offers")]
pub struct UnknownAction(pub String);

impl std::str::FromStr for AdminAction {
    type Err = UnknownAction;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|action| action.as_str() == name)
            .ok_or_else(|| UnknownAction(name.to_owned()))
    }
}

/// An answer body that is not the JSON its action documents.
#[derive(Debug, thiserror::Error)]
#[error("the {action} answer is not the documented JSON")]
pub struct AnswerError {
    /// The action answered.
    pub action: AdminAction,
    /// What serde could not read.
    #[source]
    pub source: serde_json::Error,
}

/// Reads the answer of `action`.
///
/// # Errors
/// [`AnswerError`] naming the action.
pub fn decode<T: DeserializeOwned>(action: AdminAction, body: &[u8]) -> Result<T, AnswerError> {
    serde_json::from_slice(body).map_err(|source| AnswerError { action, source })
}

/// The JSON body of a request or answer.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // The types of this module are structs with string keys and plain fields: serde_json
    // cannot fail on them.
    serde_json::to_vec(value).unwrap_or_default()
}

/// The answer to `invalidate`: whether the key was held (on any of its owners).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidateAnswer {
    /// The key was held and is gone.
    pub removed: bool,
}

/// The body of `invalidate-tag`: the tags whose entries to remove (an entry carrying any
/// of them goes), checked by [`crate::tags::check_invalidation_tags`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvalidateTagRequest {
    /// The tags.
    pub tags: Vec<String>,
}

impl InvalidateTagRequest {
    /// Reads and checks a request body.
    ///
    /// # Errors
    /// A message for the caller: not the JSON object, or tags that break a rule.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let request: Self = crate::from_json_object(body).map_err(|err| {
            format!("the body must be JSON like {{\"tags\": [\"sales.orders\"]}}: {err}")
        })?;
        crate::tags::check_invalidation_tags(&request.tags).map_err(|err| err.to_string())?;
        Ok(request)
    }
}

/// The body of `invalidate-local`: what to remove on the node asked, checked by
/// [`crate::invalidation::check_selectors`] (the same bounds as a `CacheInvalidation`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InvalidateLocalRequest {
    /// Path keys.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// Path key prefixes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// Tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl InvalidateLocalRequest {
    /// Reads and checks a request body.
    ///
    /// # Errors
    /// A message for the caller: not the JSON object, or selectors that break a rule.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let request: Self = crate::from_json_object(body).map_err(|err| {
            format!(
                "the body must be JSON like {{\"keys\": [\"reports/daily\"], \"prefixes\": [\"reports/\"], \"tags\": [\"sales.orders\"]}}: {err}"
            )
        })?;
        crate::invalidation::check_selectors(&request.keys, &request.prefixes, &request.tags)
            .map_err(|err| err.to_string())?;
        Ok(request)
    }
}

/// The answer to `invalidate-prefix`, `invalidate-tag`, `clear` and `invalidate-local`: entries removed (on
/// every member).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemovedAnswer {
    /// Entries removed.
    pub removed: u64,
}

/// Evictions by cause, as the `stats` answer counts them (the `cause` label values of
/// `flightcache_node_evictions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EvictionCounts {
    /// The TTL ran out.
    pub expired: u64,
    /// Room was needed (byte budget or entry count).
    pub size: u64,
    /// `invalidate`, `invalidate-prefix` or `clear`.
    pub explicit: u64,
    /// A newer put under the same key.
    pub replaced: u64,
    /// Handed to the key's owner by a rebalance.
    pub migrated: u64,
}

/// The answer to `stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsAnswer {
    /// The config generation running.
    pub generation: u64,
    /// Where GetFlightInfo sends clients.
    pub location_mode: LocationMode,
    /// Entries held.
    pub entries: u64,
    /// Arrow bytes held.
    pub used_bytes: u64,
    /// Bytes reserved by puts in flight.
    pub reserved_bytes: u64,
    /// The byte budget.
    pub budget_bytes: u64,
    /// The entry cap.
    pub max_entries: u64,
    /// The largest entry accepted, in bytes.
    pub max_entry_bytes: u64,
    /// The default TTL, as a duration string (`5m`).
    #[serde(with = "duration_text")]
    pub ttl: Duration,
    /// How the TTL is anchored.
    pub ttl_mode: TtlMode,
    /// The eviction policy.
    pub eviction: EvictionPolicy,
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries stored.
    pub inserts: u64,
    /// Puts refused (too large, over budget).
    pub rejected_puts: u64,
    /// Entries removed, by cause.
    pub evictions: EvictionCounts,
    /// The ring version the node routes by (0 without a ring; absent from nodes that
    /// predate routing).
    #[serde(default)]
    pub ring_version: u64,
    /// The node's member id (null without one).
    #[serde(default)]
    pub member_id: Option<String>,
    /// The node's state in its ring (null without a ring, or when it is not a member).
    #[serde(default)]
    pub member_state: Option<MemberState>,
    /// Copies per key the node writes.
    #[serde(default = "one")]
    pub replicas: u64,
    /// Milliseconds since the node started serving (null from nodes that predate it).
    #[serde(default)]
    pub uptime_ms: Option<u64>,
    /// Milliseconds since its last whole `rebalance` started (null before the first, and
    /// from nodes that predate it). With `uptimeMs` of its peers it says whether a peer
    /// restarted after this node last sent out the copies it owes.
    #[serde(default)]
    pub last_rebalance_ms_ago: Option<u64>,
    /// The node holds copies of keys it does not hold under its ring, stored since its
    /// last whole `rebalance` began: a peer's exit handoff (an old process of a pod
    /// already replaced, handing off by the ring it last had) or a put whose owner could
    /// not be reached. It owes them a rebalance whatever its peers' ages (false from
    /// nodes that predate it; they report `lastRebalanceMsAgo` null instead).
    #[serde(default)]
    pub holds_strays: bool,
    /// The node's last whole `rebalance` could not send everything it owed (a move or a
    /// copy failed: an owner unreachable or refusing then), or a ring it installed since
    /// asked it to hand off ([`crate::node_config::Topology::asks_handoff_of`]) and no
    /// whole `rebalance` on that ring has sent everything yet: it still owes its peers a
    /// handover whatever their ages, and is asked again (false from nodes that predate
    /// it).
    #[serde(default)]
    pub owes_handover: bool,
    /// The node reads the members' `zone` in a ring (false from nodes that predate
    /// zones: they refuse a ring carrying them as an unknown field). The operator
    /// publishes zones only while every node of the pool says so.
    #[serde(default)]
    pub reads_zones: bool,
    /// The TLS material the node uses now (null for a plaintext node, and from nodes that
    /// predate it): the operator rotates a cluster's certificates and CAs in phases, each
    /// begun once every node reports the one before.
    #[serde(default)]
    pub tls: Option<TlsInUse>,
    /// Peers this node's calls skip right now: a call could not reach them less than
    /// 1 s ago, or another call is trying whether they are back (the peer breakers of
    /// `routing::health`); 0 from nodes that predate it. A check waits for 0 before
    /// reading through the node, instead of sleeping out the breakers.
    #[serde(default)]
    pub peers_skipped: u64,
}

/// The TLS material a node uses now, as SHA-256 fingerprints (lowercase hex) of DER
/// certificates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsInUse {
    /// The certificate it serves (the leaf of its chain).
    pub served_sha256: String,
    /// Each CA certificate peers (and, with client authentication, clients) are
    /// verified against.
    pub trusted_sha256: Vec<String>,
}

/// The SHA-256 fingerprint (lowercase hex) of each certificate in `pem`, in order, as
/// [`TlsInUse`] carries them; items that do not parse are left out. The node reports with
/// it and the operator compares with it, so both hash the same bytes (the DER).
pub fn certificate_fingerprints(pem: &[u8]) -> Vec<String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|der| {
            let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
            digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}

/// The answer to `configure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigureAnswer {
    /// The config generation now running.
    pub generation: u64,
    /// Entries evicted to fit new, smaller caps.
    pub evicted: u64,
    /// Entries expired at once because of a shorter TTL.
    pub expired: u64,
    /// The ring version now routing (0 without a topology).
    pub ring_version: u64,
}

/// What a DoPut stored: the JSON `app_metadata` of its one `PutResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PutAnswer {
    /// Rows stored.
    pub rows: u64,
    /// Record batches stored.
    pub batches: u64,
    /// Exact Arrow weight charged to the budget.
    pub bytes: u64,
    /// The entry's TTL in milliseconds.
    pub ttl_ms: u64,
    /// A handover (`x-flightcache-write: migration`) found a live entry under the key and
    /// kept it; nothing was stored. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept_existing: bool,
}

/// The answer to `topology`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyAnswer {
    /// The node's member id (null without one).
    pub member_id: Option<String>,
    /// The ring version (0 without a topology).
    pub version: u64,
    /// Copies per key (1 from a node that predates replicas).
    #[serde(default = "one")]
    pub replicas: u64,
    /// The ring's members (empty without a topology).
    pub members: Vec<TopologyMember>,
}

/// The answer to `lease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "lease", rename_all = "lowercase")]
pub enum LeaseAnswer {
    /// The entry is cached: DoGet it.
    Hit,
    /// This caller holds the lease: run the query and DoPut the result.
    Granted {
        /// How long the lease lasts, in milliseconds.
        #[serde(rename = "leaseMs")]
        lease_ms: u64,
    },
    /// Another caller's DoPut stored the entry while this one waited: DoGet it.
    Filled,
    /// The holder did not DoPut in time: query the backend yourself (or call again).
    Timeout,
}

impl LeaseAnswer {
    /// The `lease` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Granted { .. } => "granted",
            Self::Filled => "filled",
            Self::Timeout => "timeout",
        }
    }
}

/// The body of `rebalance` (an empty body means the defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RebalanceRequest {
    /// Count what would move without sending or removing anything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Move at most this many entries (the hottest); the rest count as kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl RebalanceRequest {
    /// Reads a `rebalance` body: empty (or blank) for the defaults, else the JSON.
    ///
    /// # Errors
    /// The serde error for a body that is not the documented JSON.
    pub fn from_body(body: &[u8]) -> Result<Self, serde_json::Error> {
        if body.iter().all(u8::is_ascii_whitespace) {
            Ok(Self::default())
        } else {
            crate::from_json_object(body)
        }
    }
}

/// The answer to `rebalance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RebalanceAnswer {
    /// Entries handed to their owners and removed here (dry run: that would be).
    pub moved: u64,
    /// Their weight in bytes.
    pub moved_bytes: u64,
    /// Entries that could not be handed over; they are still on the node.
    pub failed: u64,
    /// Entries the node keeps: it owns them, or they were past `limit`.
    pub kept: u64,
    /// Kept entries whose missing copy on another owner was sent there.
    pub copied: u64,
    /// Kept entries whose missing copy could not be checked or sent.
    pub copy_failed: u64,
    /// The ring version the owners were computed with.
    pub ring_version: u64,
}

/// The `held` request: a batch of keys (their store bytes), each after its length as a
/// big-endian u32. At most [`HeldRequest::MAX_KEYS`] keys, and the whole body within the
/// node's request limit (1 MiB), so a batch of long keys must be split by
/// [`HeldRequest::MAX_BODY_BYTES`] too.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldRequest {
    /// The keys to look up, in the order of the answer.
    pub keys: Vec<Vec<u8>>,
}

/// A `held` body that is not the documented encoding, or too large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldBodyError {
    /// The body ends inside a length or a key.
    #[error(
        "the body ends inside key {index}: each key is its length (u32, big-endian) and then its bytes"
    )]
    Truncated {
        /// The key (from 0) the body breaks off in.
        index: usize,
    },
    /// More keys than one call may ask about.
    #[error("more than {max} keys in one call; split the batch", max = HeldRequest::MAX_KEYS)]
    TooManyKeys,
    /// No key at all.
    #[error("no key in the body; send at least one")]
    Empty,
}

impl HeldRequest {
    /// Most keys one `held` call asks about.
    pub const MAX_KEYS: usize = 1024;
    /// The body size a caller starts a new batch at (half the node's 1 MiB request limit,
    /// leaving room for one more key of any allowed length).
    pub const MAX_BODY_BYTES: usize = 512 << 10;

    /// The request body.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.keys.iter().map(|k| k.len() + 4).sum());
        for key in &self.keys {
            // A key is at most 64 KiB (the node refuses longer ones before storing them).
            body.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_be_bytes());
            body.extend_from_slice(key);
        }
        body
    }

    /// Reads a request body into the keys it names, borrowed from `body`.
    ///
    /// # Errors
    /// [`HeldBodyError`] for a body that is empty, cut short or names too many keys.
    pub fn decode(body: &[u8]) -> Result<Vec<&[u8]>, HeldBodyError> {
        let mut keys = Vec::new();
        let mut rest = body;
        while !rest.is_empty() {
            if keys.len() == Self::MAX_KEYS {
                return Err(HeldBodyError::TooManyKeys);
            }
            let index = keys.len();
            let (head, tail) = rest
                .split_first_chunk::<4>()
                .ok_or(HeldBodyError::Truncated { index })?;
            let len = usize::try_from(u32::from_be_bytes(*head)).unwrap_or(usize::MAX);
            if tail.len() < len {
                return Err(HeldBodyError::Truncated { index });
            }
            let (key, next) = tail.split_at(len);
            keys.push(key);
            rest = next;
        }
        if keys.is_empty() {
            return Err(HeldBodyError::Empty);
        }
        Ok(keys)
    }
}

/// The answer to `held`: for each key of the request, in order, whether the node holds a
/// live entry for it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HeldAnswer {
    /// One flag per key asked about.
    pub held: Vec<bool>,
}

fn one() -> u64 {
    1
}

/// A [`Duration`] as the text users write (`5m`, `1h 30m`).
mod duration_text {
    use super::{Deserialize, Deserializer, Duration, Serializer, quantity};

    pub(super) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&quantity::format_duration(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        quantity::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// `text` (what the node emits today) reads as `T`, and `T` writes back the same
    /// fields with the same values.
    fn golden<T: Serialize + DeserializeOwned>(action: AdminAction, text: &str) -> T {
        let typed: T = decode(action, text.as_bytes()).expect("the node's answer reads");
        let expected: Value = serde_json::from_str(text).expect("golden JSON");
        let written: Value = serde_json::from_slice(&encode(&typed)).expect("written JSON");
        assert_eq!(
            written, expected,
            "{action} writes other fields than the node emits"
        );
        typed
    }

    #[test]
    fn action_names_are_the_wire_names_and_parse_back() {
        let names: Vec<&str> = AdminAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            names,
            [
                "ping",
                "invalidate",
                "invalidate-prefix",
                "invalidate-tag",
                "clear",
                "stats",
                "configure",
                "topology",
                "lease",
                "rebalance",
                "held",
                "invalidate-local"
            ]
        );
        for action in AdminAction::ALL {
            assert_eq!(action.as_str().parse::<AdminAction>(), Ok(action));
            assert_eq!(
                serde_json::to_value(action).expect("json"),
                Value::from(action.as_str())
            );
            assert!(!action.description().is_empty());
        }
        let err = "Stats".parse::<AdminAction>().unwrap_err();
        assert!(err.to_string().contains("'Stats'"), "{err}");
    }

    #[test]
    fn an_invalidate_tag_body_is_a_json_object_of_valid_tags() {
        let request = InvalidateTagRequest::decode(br#"{"tags": ["sales.orders", "t"]}"#)
            .expect("a valid body");
        assert_eq!(request.tags, ["sales.orders", "t"]);
        for (body, says) in [
            (&b"sales.orders"[..], "must be JSON"),
            (br#"["a"]"#, "must be JSON"),
            (br#"{"tags": ["a"], "x": 1}"#, "unknown field"),
            (br#"{"tags": []}"#, "at least one tag"),
            (br#"{"tags": ["a", "a"]}"#, "given twice"),
        ] {
            let err = InvalidateTagRequest::decode(body).unwrap_err();
            assert!(
                err.contains(says),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(!AdminAction::InvalidateTag.needs_admin());
    }

    #[test]
    fn each_row_of_the_action_table_is_its_actions_own() {
        for (row, spec) in ACTIONS.iter().enumerate() {
            assert_eq!(spec.action as usize, row, "{} is out of order", spec.name);
            assert_eq!(spec.action.spec().name, spec.name);
        }
    }

    #[test]
    fn the_docs_action_table_lists_the_contracts_actions_in_order() {
        // Read at run time, not included (scripts/source-mtimes: a reused test binary).
        let path = std::path::Path::new(
            &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
        )
        .join("../docs/cache-node.md");
        let doc = std::fs::read_to_string(&path).expect("docs/cache-node.md");
        let doc = doc.as_str();
        let section = doc
            .split("\n## Actions\n")
            .nth(1)
            .expect("docs/cache-node.md has an Actions section");
        let documented: Vec<&str> = section
            .lines()
            .skip_while(|line| !line.starts_with("| `"))
            .take_while(|line| line.starts_with("| `"))
            .filter_map(|line| line.split('`').nth(1))
            .collect();
        let names: Vec<&str> = ACTIONS.iter().map(|spec| spec.name).collect();
        assert_eq!(documented, names);
    }

    #[test]
    fn stats_of_a_ring_member() {
        let stats: StatsAnswer = golden(
            AdminAction::Stats,
            r#"{"budgetBytes":67108864,"entries":3,"eviction":"tinylfu",
               "evictions":{"expired":1,"explicit":2,"migrated":0,"replaced":4,"size":5},
               "generation":7,"hits":10,"holdsStrays":true,"inserts":6,
               "lastRebalanceMsAgo":4200,"locationMode":"proxy","maxEntries":10000,
               "maxEntryBytes":8388608,"memberId":"hot-1","memberState":"draining",
               "misses":2,"owesHandover":true,"peersSkipped":1,"rejectedPuts":1,"replicas":2,"reservedBytes":0,"ringVersion":9,
               "readsZones":true,"tls":{"servedSha256":"5e1f","trustedSha256":["0a0b","0c0d"]},
               "ttl":"1h 30m","ttlMode":"sliding","uptimeMs":7200000,
               "usedBytes":4096}"#,
        );
        assert!(stats.reads_zones);
        assert_eq!(stats.uptime_ms, Some(7_200_000));
        assert_eq!(stats.last_rebalance_ms_ago, Some(4_200));
        assert!(stats.holds_strays);
        assert!(stats.owes_handover);
        let tls = stats.tls.as_ref().expect("a TLS node says what it uses");
        assert_eq!(tls.served_sha256, "5e1f");
        assert_eq!(tls.trusted_sha256, ["0a0b", "0c0d"]);
        assert_eq!(stats.ttl, Duration::from_secs(5400));
        assert_eq!(stats.member_state, Some(MemberState::Draining));
        assert_eq!(stats.eviction, EvictionPolicy::Tinylfu);
        assert_eq!(stats.evictions.replaced, 4);
    }

    /// A certificate made by `openssl req -x509` (P-256), and the SHA-256 of its DER as
    /// `openssl x509 -outform der | sha256sum` printed it.
    const OPENSSL_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBjDCCATGgAwIBAgIUFFN97I+8YYWexDr1SzR7RZuklFowCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQZmluZ2VycHJpbnQgdGVzdDAeFw0yNjExMjkxNTU5NDFaFw0z
NjExMjYxNTU5NDFaMBsxGTAXBgNVBAMMEGZpbmdlcnByaW50IHRlc3QwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAAQFKOL4Pfe2oVNxwhETeRS2ludpfjCpwFjOdHrT
T88jdcjfD8EG1FQyoL8E+I8Or1ScpjaGLUe9LBEyKw4VsHvxo1MwUTAdBgNVHQ4E
FgQUT18cKI6+sdU32WqsgQqwjk4A7fUwHwYDVR0jBBgwFoAUT18cKI6+sdU32Wqs
gQqwjk4A7fUwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEA4dWo
uzt0kUbMuzFuJk2962Nea24uAaEmCkfv9mzGLrkCIQCrzm5DGyruv1kdMRAvQA/+
wIc2uhzJD7rDqiTt2KxvUg==
-----END CERTIFICATE-----\n";
    const OPENSSL_CERT_SHA256: &str =
        "de23f49e242a187efc69e0d4c12787a249b4cec91a830f0ab2e6d0c788232542";

    #[test]
    fn certificate_fingerprints_are_the_sha256_of_each_der_as_openssl_prints_it() {
        assert_eq!(
            certificate_fingerprints(OPENSSL_CERT.as_bytes()),
            [OPENSSL_CERT_SHA256]
        );
        let bundle = format!("{OPENSSL_CERT}junk between\n{OPENSSL_CERT}");
        assert_eq!(
            certificate_fingerprints(bundle.as_bytes()),
            [OPENSSL_CERT_SHA256, OPENSSL_CERT_SHA256],
            "each certificate, in order"
        );
        assert!(certificate_fingerprints(b"no certificate").is_empty());
    }

    #[test]
    fn stats_without_a_ring_carry_nulls() {
        let stats: StatsAnswer = golden(
            AdminAction::Stats,
            r#"{"budgetBytes":1024,"entries":0,"eviction":"lru",
               "evictions":{"expired":0,"explicit":0,"migrated":0,"replaced":0,"size":0},
               "generation":1,"hits":0,"holdsStrays":false,"inserts":0,"locationMode":"direct",
               "maxEntries":100,"maxEntryBytes":512,"memberId":null,"memberState":null,"misses":0,
               "owesHandover":false,"peersSkipped":0,"readsZones":true,"rejectedPuts":0,"tls":null,"replicas":1,"reservedBytes":0,
               "ringVersion":0,"ttl":"5m","ttlMode":"absolute","uptimeMs":15,
               "lastRebalanceMsAgo":null,"usedBytes":0}"#,
        );
        assert_eq!(stats.member_id, None);
        assert_eq!(stats.last_rebalance_ms_ago, None, "no rebalance yet");
        assert_eq!(stats.ring_version, 0);
    }

    #[test]
    fn stats_from_a_node_before_routing_default_the_ring_fields() {
        let stats: StatsAnswer = decode(
            AdminAction::Stats,
            br#"{"budgetBytes":1024,"entries":0,"eviction":"lru",
               "evictions":{"expired":0,"explicit":0,"migrated":0,"replaced":0,"size":0},
               "generation":1,"hits":0,"inserts":0,"locationMode":"direct","maxEntries":100,
               "maxEntryBytes":512,"misses":0,"rejectedPuts":0,"reservedBytes":0,"ttl":"5m",
               "ttlMode":"absolute","usedBytes":0}"#,
        )
        .expect("reads");
        assert_eq!((stats.ring_version, stats.replicas), (0, 1));
        // Nor do such nodes report their times: the operator then neither asks them to
        // rebalance for a restarted peer nor counts them as restarted.
        assert_eq!((stats.uptime_ms, stats.last_rebalance_ms_ago), (None, None));
        assert!(!stats.holds_strays, "nor do they say they hold strays");
        assert!(!stats.owes_handover, "nor that a handoff is owed");
        assert_eq!(stats.tls, None, "nor which TLS they use");
        // Nor do they read zones: the operator publishes none while such a node runs.
        assert!(!stats.reads_zones);
    }

    #[test]
    fn configure_answer() {
        let answer: ConfigureAnswer = golden(
            AdminAction::Configure,
            r#"{"generation":4,"evicted":0,"expired":2,"ringVersion":7}"#,
        );
        assert_eq!(answer.expired, 2);
    }

    #[test]
    fn topology_answers_with_and_without_a_ring() {
        let answer: TopologyAnswer = golden(
            AdminAction::Topology,
            r#"{"memberId":"p-0","version":7,"replicas":1,"members":[
                {"id":"p-0","address":"p-0.p:50051","state":"active","zone":"zone-a"},
                {"id":"p-1","address":"p-1.p:50051","state":"joining"}]}"#,
        );
        assert_eq!(answer.members[1].state, MemberState::Joining);
        assert_eq!(answer.members[0].zone.as_deref(), Some("zone-a"));
        assert_eq!(answer.members[1].zone, None);
        for state in [
            MemberState::Active,
            MemberState::Joining,
            MemberState::Draining,
        ] {
            let json = serde_json::to_value(state).expect("json");
            assert_eq!(json, Value::from(state.as_str()), "as_str and serde agree");
        }
        let empty: TopologyAnswer = golden(
            AdminAction::Topology,
            r#"{"memberId":null,"version":0,"replicas":1,"members":[]}"#,
        );
        assert!(empty.members.is_empty());
    }

    #[test]
    fn removal_answers() {
        let one: InvalidateAnswer = golden(AdminAction::Invalidate, r#"{"removed":true}"#);
        assert!(one.removed);
        let many: RemovedAnswer = golden(AdminAction::Clear, r#"{"removed":40}"#);
        assert_eq!(many.removed, 40);
        // `invalidate` and `invalidate-prefix` answers are not interchangeable.
        assert!(decode::<RemovedAnswer>(AdminAction::Invalidate, br#"{"removed":true}"#).is_err());
    }

    #[test]
    fn every_lease_answer() {
        let granted: LeaseAnswer =
            golden(AdminAction::Lease, r#"{"lease":"granted","leaseMs":10000}"#);
        assert_eq!(granted, LeaseAnswer::Granted { lease_ms: 10_000 });
        assert_eq!(granted.as_str(), "granted");
        for name in ["hit", "filled", "timeout"] {
            let answer: LeaseAnswer =
                golden(AdminAction::Lease, &format!(r#"{{"lease":"{name}"}}"#));
            assert_eq!(answer.as_str(), name);
        }
    }

    #[test]
    fn rebalance_request_and_answer() {
        assert_eq!(
            RebalanceRequest::from_body(b" \n").expect("blank"),
            RebalanceRequest::default()
        );
        let request =
            RebalanceRequest::from_body(br#"{"dryRun": true, "limit": 100}"#).expect("reads");
        assert_eq!(
            request,
            RebalanceRequest {
                dry_run: true,
                limit: Some(100)
            }
        );
        assert_eq!(encode(&request), br#"{"dryRun":true,"limit":100}"#);
        assert!(RebalanceRequest::from_body(br#"{"dry_run": true}"#).is_err());

        let answer: RebalanceAnswer = golden(
            AdminAction::Rebalance,
            r#"{"moved":120,"movedBytes":3145728,"failed":0,"kept":240,"copied":0,
               "copyFailed":0,"ringVersion":8}"#,
        );
        assert_eq!(answer.moved_bytes, 3_145_728);
    }

    #[test]
    fn a_wrong_answer_names_the_action() {
        let err = decode::<ConfigureAnswer>(AdminAction::Configure, b"pong").unwrap_err();
        assert!(err.to_string().contains("configure"), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn a_held_batch_encodes_and_reads_back_in_order() {
        let request = HeldRequest {
            keys: vec![b"p:reports/a".to_vec(), Vec::new(), vec![0, 255, 7]],
        };
        let body = request.encode();
        assert_eq!(&body[..4], &[0, 0, 0, 11], "a big-endian u32 length first");
        let keys = HeldRequest::decode(&body).expect("reads back");
        assert_eq!(keys, [&b"p:reports/a"[..], &[], &[0, 255, 7]]);
        let answer: HeldAnswer = golden(AdminAction::Held, r#"{"held":[true,false,true]}"#);
        assert_eq!(answer.held, [true, false, true]);
    }

    #[test]
    fn a_held_body_cut_short_empty_or_too_large_is_refused_with_its_reason() {
        let body = HeldRequest {
            keys: vec![b"a".to_vec(), b"bcd".to_vec()],
        }
        .encode();
        for cut in [body.len() - 1, 8, 7, 6] {
            let err = HeldRequest::decode(&body[..cut]).unwrap_err();
            assert_eq!(err, HeldBodyError::Truncated { index: 1 }, "cut at {cut}");
        }
        assert_eq!(
            HeldRequest::decode(&body[..3]).unwrap_err(),
            HeldBodyError::Truncated { index: 0 }
        );
        assert_eq!(HeldRequest::decode(&[]).unwrap_err(), HeldBodyError::Empty);
        // A length far beyond the body is refused without allocating it.
        assert_eq!(
            HeldRequest::decode(&[255, 255, 255, 255, 1]).unwrap_err(),
            HeldBodyError::Truncated { index: 0 }
        );
        let max = HeldRequest {
            keys: vec![b"k".to_vec(); HeldRequest::MAX_KEYS],
        };
        assert_eq!(
            HeldRequest::decode(&max.encode()).map(|k| k.len()),
            Ok(HeldRequest::MAX_KEYS)
        );
        let over = HeldRequest {
            keys: vec![b"k".to_vec(); HeldRequest::MAX_KEYS + 1],
        };
        let err = HeldRequest::decode(&over.encode()).unwrap_err();
        assert_eq!(err, HeldBodyError::TooManyKeys);
        assert!(err.to_string().contains("1024"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any text as a `rebalance` body: the request or an error, never a panic; only a
        /// blank body or a JSON object is accepted.
        #[test]
        fn any_rebalance_body_is_a_request_or_an_error(
            text in r#"[\[\]{}",:0-9a-zA-Z .-]{0,80}"#,
        ) {
            if RebalanceRequest::from_body(text.as_bytes()).is_ok() && !text.trim().is_empty() {
                let value: Value = serde_json::from_str(&text).unwrap();
                proptest::prop_assert!(value.is_object(), "{text}");
            }
        }

        /// Any bytes as a `held` body: the keys or an error, never a panic; what is
        /// accepted is at most MAX_KEYS keys that encode back to exactly the body.
        #[test]
        fn any_held_body_is_its_keys_or_an_error(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            if let Ok(keys) = HeldRequest::decode(&body) {
                proptest::prop_assert!(!keys.is_empty() && keys.len() <= HeldRequest::MAX_KEYS);
                let request = HeldRequest { keys: keys.iter().map(|key| key.to_vec()).collect() };
                proptest::prop_assert_eq!(request.encode(), body);
            }
        }

        /// Well-formed `held` bodies of any keys read back as those keys.
        #[test]
        fn held_requests_round_trip(
            keys in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 1..20),
        ) {
            let request = HeldRequest { keys };
            let body = request.encode();
            let decoded = HeldRequest::decode(&body).unwrap();
            proptest::prop_assert_eq!(decoded, request.keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
        }
    }
}
