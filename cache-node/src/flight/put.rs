//! DoPut ingestion: a stream of FlightData becomes one cache entry, or nothing.
//!
//! The first message names the key (its FlightDescriptor). Options ride as JSON in the
//! `app_metadata` of the first message that has any, up to and including the first
//! record batch (arrow-rs puts it on the schema message, pyarrow's
//! `write_with_metadata` on the first batch); later `app_metadata` is ignored:
//!
//! ```json
//! {"ttl": "30s", "tags": ["sales.orders", "tenant:acme"]}
//! ```
//!
//! `ttl` overrides the node's default TTL for this entry (humantime syntax, > 0s).
//! `tags` label the entry for `invalidate-tag` (at most 16, each 1 to 128 bytes of
//! printable ASCII, none twice: `crds::tags`). No other field is accepted, so a typo is
//! an error rather than a silently ignored option.
//!
//! Memory discipline: message bytes are counted as they arrive and the put is refused
//! with RESOURCE_EXHAUSTED as soon as they pass the max entry size, before the entry is
//! buffered whole. Each received message is reserved in the store's budget while it is
//! decoded (by the wire layer as it arrived, `store::IntakeCover`, or else here); its
//! batch is then sealed (kept as received or encoded once into its stored IPC form, an
//! exactly sized allocation, so a slice never pins its parent and no gRPC receive buffer
//! stays alive; see `wire::seal`), the sealed weight is reserved and the receive buffer's
//! bytes are released before the next message is read. A large message's body arrives
//! already in its own exact allocation (the wire layer received it apart, [`restored`]
//! puts it back): it is kept without a copy and its intake reservation becomes the
//! batch's charge. Commit installs the entry
//! atomically; any error drops the reservation and stores nothing.
//!
//! Owns: decoding a DoPut stream into one store entry (the `app_metadata` options, the
//! bytes counted as they arrive), message by message through the
//! [`Assembly`](crate::assembly::Assembly) it shares with the disk tier's reload. Must
//! not import the wire layer's tower services or raw HTTP bodies (`wire::relay`,
//! `wire::intake`; checked by `scripts/check-layers`) nor `cluster/`: it seals through
//! the assembly (over `wire::seal`), and forwarding a put is the caller's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow_flight::FlightData;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use tonic::{Status, Streaming};

use crate::assembly::Assembly;
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::store::{IntakeCover, Lifetime, Store, Tags};
use crate::streams::UploadRest;

/// Messages with a body at least this large are sealed on the put runtime
/// (`put_runtime.rs`, ADR 0010), smaller ones where they arrive: handing a message over
/// costs two thread wake-ups (tens of microseconds on a small put), sealing a 256 KiB
/// body about as much, and a 3.6 MB one a millisecond and more.
pub const OFFLOADED_MESSAGE_BYTES: usize = 256 << 10;

/// Options a client may send in the first message's `app_metadata`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutOptions {
    /// Per-entry TTL, e.g. "30s".
    ttl: Option<String>,
    /// Tags for `invalidate-tag`, e.g. the tables the result was computed from.
    tags: Option<Vec<String>>,
}

/// The options of a put, checked.
#[derive(Debug, Default, PartialEq, Eq)]
struct CheckedOptions {
    ttl: Option<Duration>,
    tags: Option<Tags>,
}

/// What a successful DoPut stored; sent back as the PutResult's JSON `app_metadata`
/// (the node-admin contract's type).
pub use crds::admin::PutAnswer as PutSummary;

fn parse_options(app_metadata: &[u8]) -> Result<CheckedOptions> {
    if app_metadata.is_empty() {
        return Ok(CheckedOptions::default());
    }
    let options: PutOptions = crds::from_json_object(app_metadata)
        .map_err(|err| Error::BadPutOptions(err.to_string()))?;
    let tags = options
        .tags
        .map(crate::tags::entry_tags)
        .transpose()
        .map_err(|err| Error::BadPutOptions(format!("tags: {err}")))?;
    let Some(ttl) = options.ttl else {
        return Ok(CheckedOptions { ttl: None, tags });
    };
    let ttl = crds::quantity::parse_duration(&ttl)
        .map_err(|err| Error::BadPutOptions(format!("ttl: {err}")))?;
    if ttl.is_zero() || ttl > crate::config::MAX_TTL {
        return Err(Error::BadPutOptions(format!(
            "ttl must be longer than 0s and at most {}h",
            crate::config::MAX_TTL.as_secs() / 3600
        )));
    }
    Ok(CheckedOptions {
        ttl: Some(ttl),
        tags,
    })
}

/// A put's own options over what a copy carries.
fn apply_options(options: CheckedOptions, lifetime: &mut Lifetime) {
    if let Some(ttl) = options.ttl {
        lifetime.ttl_override = Some(ttl);
    }
    if let Some(tags) = options.tags {
        lifetime.tags = tags;
    }
}

/// What a failed DoPut request stream means. RESOURCE_EXHAUSTED comes only from the wire
/// layer refusing a message over the max entry size as its length arrived (the gRPC
/// decoder's own limit is OUT_OF_RANGE), and is answered as is; anything else is a
/// broken stream, described by `describe`.
fn client_stream_failed(status: Status, describe: impl FnOnce(&str) -> String) -> Error {
    if status.code() == tonic::Code::ResourceExhausted {
        Error::RefusedOnArrival(status)
    } else {
        Error::BadPutStream(describe(status.message()))
    }
}

/// The messages of a DoPut request as the client sent them: each message whose body the
/// wire layer received apart (`store::IntakeCover`) gets it back, in its own exactly
/// sized allocation, before anything else (routing, forwarding, the store) sees it.
pub fn restored(input: Streaming<FlightData>, cover: Option<Arc<IntakeCover>>) -> UploadRest {
    let Some(cover) = cover else {
        return input.boxed();
    };
    input
        .enumerate()
        .map(move |(sequence, message)| {
            let mut message = message?;
            if let Some(body) = cover.take_body(sequence as u64) {
                // The wire layer took the first `data_body` field out; should the
                // message repeat the field, protobuf keeps the last one.
                if message.data_body.is_empty() {
                    message.data_body = body;
                }
            }
            Ok(message)
        })
        .boxed()
}

/// Reads the first message of a DoPut stream and the key its descriptor names (the
/// key decides which node stores the entry).
///
/// # Errors
/// INVALID_ARGUMENT for an empty stream or a missing or bad descriptor.
pub async fn read_first(input: &mut UploadRest) -> Result<(FlightData, CacheKey)> {
    let first = input
        .try_next()
        .await
        .map_err(|status| client_stream_failed(status, |message| message.to_owned()))?
        .ok_or_else(|| {
            Error::BadPutStream(
                "the stream is empty; send the FlightDescriptor and a schema first".into(),
            )
        })?;
    let descriptor = first.flight_descriptor.clone().ok_or_else(|| {
        Error::BadDescriptor(
            "the first DoPut message carries no FlightDescriptor naming the entry".into(),
        )
    })?;
    let key = CacheKey::from_descriptor(&descriptor)?;
    Ok((first, key))
}

/// Reads the rest of a DoPut stream (after [`read_first`]) into the store, with the
/// `lifetime` a handover carries ([`Lifetime::default`] for a client's put; a TTL in
/// the put options replaces its `ttl_override`). `cover` is the wire layer's word on
/// whether each message's bytes were reserved as they arrived (then they are not
/// reserved again while the message is decoded).
///
/// # Errors
/// Bad descriptor, options or IPC stream (INVALID_ARGUMENT), a schema change
/// mid-stream, an oversized entry or no room (RESOURCE_EXHAUSTED), or an invalidation
/// that raced the put (ABORTED). In every error case nothing is stored.
pub async fn ingest(
    store: &Store,
    key: CacheKey,
    first: FlightData,
    input: UploadRest,
    lifetime: Lifetime,
    cover: Option<Arc<IntakeCover>>,
) -> Result<PutSummary> {
    let mut lifetime = lifetime;
    let mut options_seen = !first.app_metadata.is_empty();
    if options_seen {
        apply_options(parse_options(&first.app_metadata)?, &mut lifetime);
    }
    let max_entry_bytes = store.config().max_entry_bytes;
    let pending = store.begin_put(key.to_store_bytes());

    // Count wire bytes before decoding, so an oversized put stops at the first message
    // past the limit instead of after it has been buffered whole.
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    let mut messages = futures::stream::iter([Ok(first)])
        .chain(input)
        .map_err(|status| {
            client_stream_failed(status, |message| {
                format!("the client stream failed: {message}")
            })
        })
        .and_then(move |message: FlightData| {
            let size = (message.data_body.len() + message.data_header.len()) as u64;
            let total = counter.fetch_add(size, Ordering::Relaxed) + size;
            futures::future::ready(if total > max_entry_bytes {
                Err(Error::EntryTooLarge {
                    size: total,
                    max: max_entry_bytes,
                })
            } else {
                Ok(message)
            })
        })
        // A message without an IPC header carries only a descriptor or app_metadata.
        .try_filter(|message| futures::future::ready(!message.data_header.is_empty()));

    let mut assembly = Assembly::new(pending, max_entry_bytes).with_cover(cover);
    while let Some(message) = messages.next().await {
        let message = match message {
            Ok(message) => message,
            Err(err) => {
                if matches!(
                    err,
                    Error::EntryTooLarge { .. } | Error::RefusedOnArrival(_)
                ) {
                    assembly.reject();
                }
                return Err(err);
            }
        };
        if !options_seen && assembly.batches() == 0 && !message.app_metadata.is_empty() {
            options_seen = true;
            apply_options(parse_options(&message.app_metadata)?, &mut lifetime);
        }
        let accepted = if message.data_body.len() >= OFFLOADED_MESSAGE_BYTES {
            // Copying and checking a large body takes a serving thread for a
            // millisecond or more: a hit arriving meanwhile would queue behind it.
            let key = key.clone();
            let (back, accepted) = crate::put_runtime::run(async move {
                let accepted = assembly.accept(message, &key);
                (assembly, accepted)
            })
            .await?;
            assembly = back;
            accepted
        } else {
            assembly.accept(message, &key)
        };
        if let Err(err) = accepted {
            return Err(assembly.fail(err));
        }
    }
    let ttl_override = lifetime.ttl_override;
    let (outcome, rows, batch_count) = assembly.commit(lifetime, &key)?;
    let ttl = ttl_override.unwrap_or(store.config().ttl);
    tracing::debug!(%key, rows, bytes = outcome.weight_bytes, "stored entry");
    Ok(PutSummary {
        rows,
        batches: batch_count,
        bytes: outcome.weight_bytes,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        kept_existing: outcome.kept_existing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_options_accept_ttl_and_tags_and_refuse_garbage() {
        let ttl = |ttl| CheckedOptions { ttl, tags: None };
        assert_eq!(parse_options(b"").unwrap(), ttl(None));
        assert_eq!(
            parse_options(br#"{"ttl": "30s"}"#).unwrap(),
            ttl(Some(Duration::from_secs(30)))
        );
        assert_eq!(parse_options(b"{}").unwrap(), ttl(None));
        let tagged = parse_options(br#"{"tags": ["sales.orders", "tenant:acme"]}"#).unwrap();
        let tags = tagged.tags.unwrap();
        assert_eq!(tags.len(), 2);
        assert_eq!(&*tags[0], "sales.orders");
        let too_many: Vec<String> = (0..=crds::tags::MAX_TAGS_PER_ENTRY)
            .map(|i| format!("t{i}"))
            .collect();
        let too_many = serde_json::json!({ "tags": too_many }).to_string();
        for bad in [
            &b"not json"[..],
            br#"{"tll": "30s"}"#,
            br#"{"ttl": "soon"}"#,
            br#"{"ttl": "0s"}"#,
            b"[1]",
            br#"{"tags": "orders"}"#,
            br#"{"tags": [""]}"#,
            br#"{"tags": ["a", "a"]}"#,
            br#"{"tags": ["caf\u00e9"]}"#,
            too_many.as_bytes(),
        ] {
            let err = parse_options(bad).unwrap_err();
            assert!(matches!(err, Error::BadPutOptions(_)), "{err}");
        }
        let err = parse_options(br#"{"tags": ["a", "a"]}"#).unwrap_err();
        assert!(err.to_string().contains("tags: tag 1"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any `app_metadata` a client sends: an option error or a TTL within the
        /// bounds, never a panic.
        #[test]
        fn any_app_metadata_is_an_error_or_a_bounded_ttl(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            ttl in "[0-9]{1,12}(ms|s|m|h)",
        ) {
            for input in [bytes, format!(r#"{{"ttl": "{ttl}"}}"#).into_bytes()] {
                match parse_options(&input) {
                    Ok(CheckedOptions { ttl: Some(ttl), .. }) => proptest::prop_assert!(
                        !ttl.is_zero() && ttl <= crate::config::MAX_TTL
                    ),
                    Ok(_) => {}
                    Err(err) => proptest::prop_assert!(matches!(err, Error::BadPutOptions(_))),
                }
            }
        }
    }
}
