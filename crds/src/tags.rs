//! Entry tags: labels a put attaches to its entry (the tables a query result was computed
//! from, a tenant) so that `invalidate-tag` removes every entry carrying one of them
//! without knowing their keys. One definition of what a tag is, for the node, its peers
//! (copies carry their entry's tags) and the clients.
//!
//! A tag is 1 to [`MAX_TAG_BYTES`] bytes of printable ASCII (0x20 to 0x7e): it travels
//! in gRPC headers between peers as it is, and a person reads it in an error or a log.
//! Tags compare byte for byte (`Orders` is not `orders`). Pure: no I/O.

/// The most tags one entry may carry.
pub const MAX_TAGS_PER_ENTRY: usize = 16;
/// The longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 128;
/// The most tags one `invalidate-tag` may name.
pub const MAX_TAGS_PER_INVALIDATION: usize = 64;

/// Why a list of tags is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// More tags than allowed.
    #[error("{count} tags; at most {max} are allowed")]
    TooMany {
        /// Tags given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An invalidation that names no tag.
    #[error("name at least one tag, e.g. {{\"tags\": [\"orders\"]}}")]
    None,
    /// An empty tag.
    #[error("tag {index} is empty")]
    Empty {
        /// Its position, from 0.
        index: usize,
    },
    /// A tag over [`MAX_TAG_BYTES`].
    #[error("tag {index} is {len} bytes; at most {MAX_TAG_BYTES} are allowed")]
    TooLong {
        /// Its position, from 0.
        index: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A tag with a byte outside printable ASCII.
    #[error("tag {index} has a character outside printable ASCII (0x20 to 0x7e)")]
    NotPrintable {
        /// Its position, from 0.
        index: usize,
    },
    /// The same tag twice.
    #[error("tag {index} ({tag:?}) is given twice")]
    Repeated {
        /// The position of its second occurrence.
        index: usize,
        /// The tag.
        tag: String,
    },
}

/// Checks the tags of one entry: at most [`MAX_TAGS_PER_ENTRY`], each valid, none twice.
///
/// # Errors
/// The first rule broken.
pub fn check_entry_tags(tags: &[String]) -> Result<(), TagError> {
    check(tags, MAX_TAGS_PER_ENTRY)
}

/// Checks the tags an `invalidate-tag` names: 1 to [`MAX_TAGS_PER_INVALIDATION`], each
/// valid, none twice.
///
/// # Errors
/// The first rule broken.
pub fn check_invalidation_tags(tags: &[String]) -> Result<(), TagError> {
    if tags.is_empty() {
        return Err(TagError::None);
    }
    check(tags, MAX_TAGS_PER_INVALIDATION)
}

fn check(tags: &[String], max: usize) -> Result<(), TagError> {
    if tags.len() > max {
        return Err(TagError::TooMany {
            count: tags.len(),
            max,
        });
    }
    for (index, tag) in tags.iter().enumerate() {
        if tag.is_empty() {
            return Err(TagError::Empty { index });
        }
        if tag.len() > MAX_TAG_BYTES {
            return Err(TagError::TooLong {
                index,
                len: tag.len(),
            });
        }
        if !tag.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(TagError::NotPrintable { index });
        }
        if tags[..index].contains(tag) {
            return Err(TagError::Repeated {
                index,
                tag: tag.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn entry_tags_follow_every_rule_and_say_which_one_is_broken() {
        assert_eq!(check_entry_tags(&[]), Ok(()));
        assert_eq!(
            check_entry_tags(&tags(&["sales.orders", "tenant:acme", "a b"])),
            Ok(())
        );
        let many: Vec<String> = (0..=MAX_TAGS_PER_ENTRY).map(|i| format!("t{i}")).collect();
        assert_eq!(
            check_entry_tags(&many),
            Err(TagError::TooMany {
                count: MAX_TAGS_PER_ENTRY + 1,
                max: MAX_TAGS_PER_ENTRY
            })
        );
        assert_eq!(
            check_entry_tags(&tags(&["ok", ""])),
            Err(TagError::Empty { index: 1 })
        );
        let long = "x".repeat(MAX_TAG_BYTES + 1);
        assert_eq!(
            check_entry_tags(&[long]),
            Err(TagError::TooLong {
                index: 0,
                len: MAX_TAG_BYTES + 1
            })
        );
        assert_eq!(check_entry_tags(&["x".repeat(MAX_TAG_BYTES)]), Ok(()));
        for bad in ["tab\there", "new\nline", "ümlaut", "\u{7f}"] {
            assert_eq!(
                check_entry_tags(&tags(&[bad])),
                Err(TagError::NotPrintable { index: 0 }),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_entry_tags(&tags(&["a", "b", "a"])),
            Err(TagError::Repeated {
                index: 2,
                tag: "a".into()
            })
        );
    }

    #[test]
    fn an_invalidation_names_at_least_one_tag_and_at_most_its_limit() {
        assert_eq!(check_invalidation_tags(&[]), Err(TagError::None));
        assert_eq!(check_invalidation_tags(&tags(&["orders"])), Ok(()));
        let many: Vec<String> = (0..=MAX_TAGS_PER_INVALIDATION)
            .map(|i| format!("t{i}"))
            .collect();
        assert!(matches!(
            check_invalidation_tags(&many),
            Err(TagError::TooMany { .. })
        ));
        assert!(check_invalidation_tags(&many[..MAX_TAGS_PER_INVALIDATION]).is_ok());
    }
}
