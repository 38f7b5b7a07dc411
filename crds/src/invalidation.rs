//! What one invalidation by the operator may name: the selectors of a
//! `CacheInvalidation` and of the node's `invalidate-local` action, and their bounds.
//! One definition for the CRD's schema (whose CEL rules and lengths say the same), the
//! operator and the node, which checks every body again. Pure: no I/O.

use crate::tags::{self, TagError};

/// The most keys one invalidation names.
pub const MAX_KEYS: usize = 64;
/// The most prefixes one invalidation names.
pub const MAX_PREFIXES: usize = 16;
/// The longest key or prefix, in bytes.
pub const MAX_SELECTOR_BYTES: usize = 1024;

/// Why the selectors of an invalidation are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// No key, prefix or tag.
    #[error("name what to remove: at least one key, prefix or tag")]
    Nothing,
    /// Too many keys or prefixes.
    #[error("{count} {what}; at most {max} are allowed")]
    TooMany {
        /// `keys` or `prefixes`.
        what: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An empty key or prefix (an empty prefix would select every entry).
    #[error("{what} {index} is empty")]
    Empty {
        /// `key` or `prefix`.
        what: &'static str,
        /// Its position, from 0.
        index: usize,
    },
    /// A key or prefix over [`MAX_SELECTOR_BYTES`].
    #[error("{what} {index} is {len} bytes; at most {MAX_SELECTOR_BYTES} are allowed")]
    TooLong {
        /// `key` or `prefix`.
        what: &'static str,
        /// Its position, from 0.
        index: usize,
        /// Its length.
        len: usize,
    },
    /// The tags break a tag rule.
    #[error("tags: {0}")]
    Tags(#[from] TagError),
}

/// Checks an invalidation's selectors: at least one; at most [`MAX_KEYS`] keys and
/// [`MAX_PREFIXES`] prefixes, each 1 to [`MAX_SELECTOR_BYTES`] bytes; tags by the rules
/// of `invalidate-tag` ([`tags::check_invalidation_tags`]).
///
/// # Errors
/// The first rule broken.
pub fn check_selectors(
    keys: &[String],
    prefixes: &[String],
    tags: &[String],
) -> Result<(), SelectorError> {
    if keys.is_empty() && prefixes.is_empty() && tags.is_empty() {
        return Err(SelectorError::Nothing);
    }
    check_list("keys", "key", keys, MAX_KEYS)?;
    check_list("prefixes", "prefix", prefixes, MAX_PREFIXES)?;
    if !tags.is_empty() {
        tags::check_invalidation_tags(tags)?;
    }
    Ok(())
}

fn check_list(
    plural: &'static str,
    what: &'static str,
    items: &[String],
    max: usize,
) -> Result<(), SelectorError> {
    if items.len() > max {
        return Err(SelectorError::TooMany {
            what: plural,
            count: items.len(),
            max,
        });
    }
    for (index, item) in items.iter().enumerate() {
        if item.is_empty() {
            return Err(SelectorError::Empty { what, index });
        }
        if item.len() > MAX_SELECTOR_BYTES {
            return Err(SelectorError::TooLong {
                what,
                index,
                len: item.len(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| (*item).to_owned()).collect()
    }

    #[test]
    fn at_least_one_selector_and_every_bound_is_checked() {
        assert_eq!(check_selectors(&[], &[], &[]), Err(SelectorError::Nothing));
        assert_eq!(check_selectors(&list(&["reports/daily"]), &[], &[]), Ok(()));
        assert_eq!(check_selectors(&[], &list(&["reports/"]), &[]), Ok(()));
        assert_eq!(check_selectors(&[], &[], &list(&["sales.orders"])), Ok(()));
        assert_eq!(
            check_selectors(&[], &list(&["a", ""]), &[]),
            Err(SelectorError::Empty {
                what: "prefix",
                index: 1
            })
        );
        let many = vec!["k".to_owned(); MAX_KEYS + 1];
        assert_eq!(
            check_selectors(&many, &[], &[]).map_err(|e| e.to_string()),
            Err("65 keys; at most 64 are allowed".to_owned())
        );
        let long = "p".repeat(MAX_SELECTOR_BYTES + 1);
        assert_eq!(
            check_selectors(&[], &[long], &[]).map_err(|e| e.to_string()),
            Err("prefix 0 is 1025 bytes; at most 1024 are allowed".to_owned())
        );
        assert_eq!(
            check_selectors(&[], &[], &list(&["ok", "caf\u{e9}"])).map_err(|e| e.to_string()),
            Err("tags: tag 1 has a character outside printable ASCII (0x20 to 0x7e)".to_owned())
        );
    }

    #[test]
    fn the_bounds_are_the_crd_schema_bounds() {
        // The CRD writes the same numbers in its schema (maxItems, maxLength).
        let schema = serde_json::to_value(schemars::schema_for!(
            crate::cacheinvalidation::CacheInvalidationSpec
        ))
        .unwrap();
        let field = |name: &str| schema["properties"][name].clone();
        assert_eq!(field("keys")["maxItems"], MAX_KEYS);
        assert_eq!(field("keys")["items"]["maxLength"], MAX_SELECTOR_BYTES);
        assert_eq!(field("prefixes")["maxItems"], MAX_PREFIXES);
        assert_eq!(field("prefixes")["items"]["maxLength"], MAX_SELECTOR_BYTES);
        assert_eq!(field("tags")["maxItems"], tags::MAX_TAGS_PER_INVALIDATION);
        assert_eq!(field("tags")["items"]["maxLength"], tags::MAX_TAG_BYTES);
    }
}
