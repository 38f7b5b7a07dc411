//! Entry tags at the node's edges: the lists a put's options, a copy's header, a
//! migration batch and a disk file carry, checked by the contract's rules
//! (`crds::tags`) and turned into the store's shared [`Tags`]; and back into the JSON
//! list a copy carries to a peer.
//!
//! Owns: the conversion only; what a tag may be is `crds::tags`, what a tag does is the
//! store's. No I/O.

use std::sync::Arc;

use crds::tags::TagError;

use crate::store::Tags;

/// The store's form of an entry's `tags`, once they pass the contract's rules.
///
/// # Errors
/// The first rule broken ([`crds::tags::check_entry_tags`]).
pub fn entry_tags(tags: Vec<String>) -> Result<Tags, TagError> {
    crds::tags::check_entry_tags(&tags)?;
    Ok(tags.into_iter().map(Arc::from).collect())
}

/// The store's form of the tags an `invalidate-tag` names.
///
/// # Errors
/// The first rule broken ([`crds::tags::check_invalidation_tags`]).
pub fn invalidation_tags(tags: Vec<String>) -> Result<Vec<Arc<str>>, TagError> {
    crds::tags::check_invalidation_tags(&tags)?;
    Ok(tags.into_iter().map(Arc::from).collect())
}

/// `tags` as a JSON list of strings (printable ASCII, so the text is a valid gRPC header
/// value as it is).
pub fn to_json(tags: &Tags) -> String {
    let list: Vec<&str> = tags.iter().map(|tag| &**tag).collect();
    // A list of strings always serializes.
    serde_json::to_string(&list).unwrap_or_default()
}

/// The tags of a JSON list ([`to_json`]'s form), checked.
///
/// # Errors
/// Not a JSON list of strings, or a rule broken; as a message for the sender.
pub fn from_json(text: &[u8]) -> Result<Tags, String> {
    let list: Vec<String> = serde_json::from_slice(text)
        .map_err(|err| format!("tags must be a JSON list of strings: {err}"))?;
    entry_tags(list).map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_go_to_json_and_back_and_broken_lists_are_refused() {
        let tags = entry_tags(vec!["sales.orders".into(), "tenant:\"acme\"".into()]).unwrap();
        let json = to_json(&tags);
        assert_eq!(json, r#"["sales.orders","tenant:\"acme\""]"#);
        assert!(tonic::metadata::MetadataValue::try_from(json.as_str()).is_ok());
        assert_eq!(from_json(json.as_bytes()).unwrap(), tags);
        assert_eq!(to_json(&Tags::default()), "[]");
        assert!(
            from_json(b"[1]")
                .unwrap_err()
                .contains("JSON list of strings")
        );
        assert!(
            from_json(br#"["a","a"]"#)
                .unwrap_err()
                .contains("given twice")
        );
        assert!(invalidation_tags(vec![]).is_err());
    }
}
