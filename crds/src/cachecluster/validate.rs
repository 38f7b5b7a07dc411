//! The API server's checks of a `CacheCluster`, in Rust.
//!
//! The CRD's CEL rules refuse a bad spec at `kubectl apply`; these functions apply the
//! same rules, with the same messages, to an object the operator already holds (one
//! stored under an older CRD, or built in a test), and parse the string fields into
//! the values the operator uses. Sizes go through [`crate::quantity::parse_bytes`],
//! durations through [`crate::quantity::parse_duration`], the node's own parsers, after
//! the stricter format the CRD accepts has been checked. Pure; no I/O.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use super::{
    CacheCluster, CacheClusterSpec, ClientAuth, PersistenceSpec, PoolSpec, SchedulingSpec, rules,
};
use crate::quantity;

/// One field that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Path of the field as the API server reports it, e.g. `spec.pools[1].shards`.
    pub field: String,
    /// The rule's message (one of the `*_MSG` constants in [`rules`]).
    pub message: &'static str,
}

/// A spec that breaks one or more rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidSpec {
    /// Every broken rule, in field order.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid CacheCluster spec: ")?;
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// Longest TTL, as in [`rules::TTL_RANGE`] (720h).
pub const TTL_MAX: Duration = Duration::from_secs(720 * 3600);

/// Checks a whole object, as the API server does on create.
///
/// # Errors
/// [`InvalidSpec`] listing every broken rule.
pub fn validate(cluster: &CacheCluster) -> Result<(), InvalidSpec> {
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    validate_spec(name, &cluster.spec)
}

/// Checks a spec for a cluster of this name, as the API server does on create.
///
/// # Errors
/// [`InvalidSpec`] listing every broken rule.
pub fn validate_spec(cluster_name: &str, spec: &CacheClusterSpec) -> Result<(), InvalidSpec> {
    let mut errors = Errors::default();
    if !is_dns_label(cluster_name) {
        errors.push("metadata.name", rules::CLUSTER_NAME_MSG);
    }
    if spec
        .pools
        .iter()
        .any(|pool| cluster_name.len() + pool.name.len() > 51)
    {
        errors.push("spec.pools", rules::NAME_LENGTH_MSG);
    }
    if let Some(image) = &spec.image
        && !is_image(image)
    {
        errors.push("spec.image", rules::IMAGE_MSG);
    }
    if !is_port(spec.port) {
        errors.push("spec.port", rules::PORT_MSG);
    }
    if spec.port == spec.monitoring.metrics_port {
        errors.push("spec.port", rules::PORTS_DIFFER_MSG);
    }
    if let Some(auth) = &spec.auth {
        if let Some(secret_name) = &auth.secret_name
            && !is_dns_subdomain(secret_name)
        {
            errors.push("spec.auth.secretName", rules::AUTH_SECRET_MSG);
        }
        if auth.disabled && auth.secret_name.is_some() {
            errors.push("spec.auth", rules::AUTH_DISABLED_ALONE_MSG);
        }
        if !is_secret_key(&auth.key) {
            errors.push("spec.auth.key", rules::AUTH_KEY_MSG);
        }
    }
    if let Some(tls) = &spec.tls {
        if tls
            .secret_name
            .as_deref()
            .is_some_and(|name| !is_dns_subdomain(name))
        {
            errors.push("spec.tls.secretName", rules::TLS_SECRET_MSG);
        }
        if tls.client_auth == ClientAuth::Required && tls.secret_name.is_none() {
            errors.push("spec.tls", rules::CLIENT_AUTH_NEEDS_SECRET_MSG);
        }
        if tls.disabled && (tls.secret_name.is_some() || tls.client_auth != ClientAuth::None) {
            errors.push("spec.tls", rules::TLS_DISABLED_ALONE_MSG);
        }
    }
    if !is_port(spec.monitoring.metrics_port) {
        errors.push("spec.monitoring.metricsPort", rules::METRICS_PORT_MSG);
    }
    if spec.pools.is_empty() || spec.pools.len() > 16 {
        errors.push("spec.pools", rules::POOLS_NOT_EMPTY_MSG);
    }
    let mut seen = BTreeSet::new();
    if !spec
        .pools
        .iter()
        .all(|pool| seen.insert(pool.name.as_str()))
    {
        errors.push("spec.pools", rules::POOLS_UNIQUE_MSG);
    }
    if spec.pools.iter().any(|pool| {
        spec.pools
            .iter()
            .any(|other| pool.name == format!("{}-nodes", other.name))
    }) {
        errors.push("spec.pools", rules::POOL_OBJECTS_DISTINCT_MSG);
    }
    for (index, pool) in spec.pools.iter().enumerate() {
        validate_pool(&format!("spec.pools[{index}]"), pool, &mut errors);
    }
    errors.into_result()
}

/// Checks what may not change between two versions of a spec (the CRD's transition
/// rules). Pools are matched by name, as the API server matches list-map items.
///
/// # Errors
/// [`InvalidSpec`] listing every forbidden change.
pub fn validate_update(old: &CacheClusterSpec, new: &CacheClusterSpec) -> Result<(), InvalidSpec> {
    let mut errors = Errors::default();
    for (index, pool) in new.pools.iter().enumerate() {
        let Some(old_pool) = old.pools.iter().find(|old| old.name == pool.name) else {
            continue;
        };
        let at = format!("spec.pools[{index}]");
        match (&old_pool.persistence, &pool.persistence) {
            (Some(_), None) => {
                errors.push(format!("{at}.persistence"), rules::PERSISTENCE_KEPT_MSG)
            }
            (Some(before), Some(after)) => {
                if before.storage_class_name != after.storage_class_name {
                    errors.push(
                        format!("{at}.persistence.storageClassName"),
                        rules::STORAGE_CLASS_IMMUTABLE_MSG,
                    );
                }
                if let (Some(before), Some(after)) = (before.size_bytes(), after.size_bytes())
                    && after != before
                {
                    errors.push(format!("{at}.persistence.size"), rules::SIZE_FIXED_MSG);
                }
            }
            (None, Some(_)) => errors.push(
                format!("{at}.persistence"),
                rules::PERSISTENCE_NOT_ADDED_MSG,
            ),
            (None, None) => {}
        }
    }
    errors.into_result()
}

impl PoolSpec {
    /// `memoryLimit` in bytes.
    ///
    /// # Errors
    /// [`FieldError`] on `memoryLimit` (the pool named by name, `spec.pools[hot]`) when it
    /// is not in the CRD's format or out of range.
    pub fn memory_limit_bytes(&self) -> Result<u64, FieldError> {
        let error = |message| FieldError {
            field: format!("spec.pools[{}].memoryLimit", self.name),
            message,
        };
        if !is_byte_quantity(&self.memory_limit) {
            return Err(error(rules::MEMORY_FORMAT_MSG));
        }
        quantity::parse_bytes(&self.memory_limit)
            .ok()
            .filter(|bytes| (rules::MEMORY_MIN_BYTES..=rules::MEMORY_MAX_BYTES).contains(bytes))
            .ok_or_else(|| error(rules::MEMORY_RANGE_MSG))
    }

    /// `ttl` as a duration.
    ///
    /// # Errors
    /// [`FieldError`] on `ttl` (the pool named by name) when it is not in the CRD's
    /// format or out of range.
    pub fn ttl_duration(&self) -> Result<Duration, FieldError> {
        let field = || format!("spec.pools[{}].ttl", self.name);
        let ttl = parse_ttl(&self.ttl).ok_or_else(|| FieldError {
            field: field(),
            message: rules::TTL_FORMAT_MSG,
        })?;
        if ttl > Duration::ZERO && ttl <= TTL_MAX {
            Ok(ttl)
        } else {
            Err(FieldError {
                field: field(),
                message: rules::TTL_RANGE_MSG,
            })
        }
    }
}

impl PersistenceSpec {
    /// `size` in bytes, if it is in the CRD's format.
    pub fn size_bytes(&self) -> Option<u64> {
        parse_byte_quantity(&self.size)
    }
}

fn validate_pool(at: &str, pool: &PoolSpec, errors: &mut Errors) {
    if !is_dns_label(&pool.name) || pool.name.len() > 50 {
        errors.push(format!("{at}.name"), rules::POOL_NAME_MSG);
    }
    if !(1..=256).contains(&pool.shards) {
        errors.push(format!("{at}.shards"), rules::SHARDS_MSG);
    }
    if pool.max_entries < 1 {
        errors.push(format!("{at}.maxEntries"), rules::MAX_ENTRIES_MSG);
    }
    if let Err(error) = pool.ttl_duration() {
        errors.push(format!("{at}.ttl"), error.message);
    }
    if let Err(error) = pool.memory_limit_bytes() {
        errors.push(format!("{at}.memoryLimit"), error.message);
    }
    if !(1..=2).contains(&pool.replicas) {
        errors.push(format!("{at}.replicas"), rules::REPLICAS_MSG);
    }
    if pool.replicas > pool.shards {
        errors.push(format!("{at}.replicas"), rules::REPLICAS_LE_SHARDS_MSG);
    }
    if let Some(image) = &pool.image
        && !is_image(image)
    {
        errors.push(format!("{at}.image"), rules::POOL_IMAGE_MSG);
    }
    if let Some(persistence) = &pool.persistence {
        match persistence.size_bytes() {
            None => errors.push(format!("{at}.persistence.size"), rules::SIZE_FORMAT_MSG),
            Some(size) => {
                // The CEL rule compares the two quantities whenever both are well-formed.
                let limit = parse_byte_quantity(&pool.memory_limit);
                if limit.is_some_and(|limit| size < limit) {
                    errors.push(
                        format!("{at}.persistence.size"),
                        rules::SIZE_COVERS_MEMORY_MSG,
                    );
                }
            }
        }
        if let Some(class) = &persistence.storage_class_name
            && !is_dns_subdomain(class)
        {
            errors.push(
                format!("{at}.persistence.storageClassName"),
                rules::STORAGE_CLASS_MSG,
            );
        }
    }
    if pool
        .resources
        .as_ref()
        .and_then(|resources| resources.limits.as_ref())
        .is_some_and(|limits| limits.contains_key("memory"))
    {
        errors.push(
            format!("{at}.resources.limits"),
            rules::NO_RESOURCES_MEMORY_LIMIT_MSG,
        );
    }
    if let Some(scheduling) = &pool.scheduling {
        validate_scheduling(&format!("{at}.scheduling"), scheduling, errors);
    }
}

fn validate_scheduling(at: &str, scheduling: &SchedulingSpec, errors: &mut Errors) {
    if let Some(class) = scheduling.priority_class_name.as_deref()
        && !is_dns_subdomain(class)
    {
        errors.push(format!("{at}.priorityClassName"), rules::PRIORITY_CLASS_MSG);
    }
    if let Some(spread) = &scheduling.spread {
        let keys = &spread.topology_keys;
        let distinct: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        if keys.len() > MAX_SPREAD_KEYS
            || distinct.len() != keys.len()
            || !keys.iter().all(|key| is_label_key(key))
        {
            errors.push(format!("{at}.spread.topologyKeys"), rules::SPREAD_KEYS_MSG);
        }
        if scheduling.topology_spread_constraints.is_some() {
            errors.push(format!("{at}.spread"), rules::SPREAD_OR_CONSTRAINTS_MSG);
        }
    }
}

/// Most label keys `spread.topologyKeys` may list (the schema's `maxItems`).
pub const MAX_SPREAD_KEYS: usize = 8;

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, message: &'static str) {
        self.0.push(FieldError {
            field: field.into(),
            message,
        });
    }

    fn into_result(self) -> Result<(), InvalidSpec> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(InvalidSpec { errors: self.0 })
        }
    }
}

/// Reads a TTL in the CRD's format ([`rules::TTL_FORMAT`]): whole `h`, `m`, `s`, `ms`
/// units, each at most once, largest first, with at most 4, 6, 8 and 10 digits. `None`
/// for anything else. The value equals what Go's `time.ParseDuration` (the API server)
/// and [`quantity::parse_duration`] (the node) read.
pub fn parse_ttl(text: &str) -> Option<Duration> {
    const UNITS: [(&str, usize, u64); 4] = [
        ("h", 4, 3_600_000),
        ("m", 6, 60_000),
        ("s", 8, 1_000),
        ("ms", 10, 1),
    ];
    let mut rest = text;
    let mut next_unit = 0;
    let mut millis: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let position = UNITS[next_unit..]
            .iter()
            .position(|(name, ..)| *name == unit)?;
        let (_, max_digits, scale) = UNITS[next_unit + position];
        if number.is_empty() || number.len() > max_digits {
            return None;
        }
        let value: u64 = number.parse().ok()?;
        millis = millis.checked_add(value.checked_mul(scale)?)?;
        next_unit += position + 1;
        rest = tail;
    }
    (next_unit > 0).then(|| Duration::from_millis(millis))
}

/// Reads a byte quantity in the CRD's format ([`rules::BYTES_FORMAT`]): up to 15 digits
/// and an optional `Ki`, `Mi`, `Gi`, `Ti`, `k`, `M`, `G` or `T`, through
/// [`quantity::parse_bytes`]. `None` for anything else.
pub fn parse_byte_quantity(text: &str) -> Option<u64> {
    is_byte_quantity(text)
        .then(|| quantity::parse_bytes(text).ok())
        .flatten()
}

/// Whether `text` matches [`rules::BYTES_FORMAT`].
fn is_byte_quantity(text: &str) -> bool {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let unit_ok = matches!(unit, "" | "Ki" | "Mi" | "Gi" | "Ti" | "k" | "M" | "G" | "T");
    !number.is_empty() && number.len() <= 15 && unit_ok
}

fn is_port(port: i32) -> bool {
    (1..=65535).contains(&port)
}

fn is_image(image: &str) -> bool {
    !image.is_empty() && image.len() <= 512 && !image.chars().any(char::is_whitespace)
}

/// A DNS-1035 label, `[a-z]([-a-z0-9]*[a-z0-9])?` (its length is checked apart).
fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_lowercase()
                && (last.is_ascii_lowercase() || last.is_ascii_digit())
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        }
        _ => false,
    }
}

/// A DNS-1123 subdomain of at most 253 characters.
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|part| {
            let bytes = part.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    (first.is_ascii_lowercase() || first.is_ascii_digit())
                        && (last.is_ascii_lowercase() || last.is_ascii_digit())
                        && bytes
                            .iter()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                }
                _ => false,
            }
        })
}

/// A qualified label key, as [`rules::SPREAD_KEYS`] reads it: an optional DNS-1123
/// subdomain prefix (at most 253 characters) and '/', then a name of 1 to 63 letters,
/// digits, '-', '_' or '.', starting and ending with a letter or digit.
pub fn is_label_key(text: &str) -> bool {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    let bytes = name.as_bytes();
    let name_ok = match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    };
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

#[cfg(test)]
mod tests;
