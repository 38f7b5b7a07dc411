//! The CRD as YAML, written by serde-saphyr: block style with list items indented under
//! their key (as kubectl and Helm charts write them), multi-line strings as literal
//! blocks, long ones folded, and any string a YAML reader could take for something else
//! quoted. Pure; no I/O.

use serde_json::Value;

/// Writes `value` as a YAML document (without the leading `---`).
pub fn to_yaml(value: &Value) -> String {
    let options = serde_saphyr::ser_options! { compact_list_indent: false };
    // A JSON value has string keys and finite numbers: serialising it cannot fail.
    serde_saphyr::to_string_with_options(value, options).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reads_back(doc: &Value) -> String {
        let yaml = to_yaml(doc);
        let back: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(&back, doc, "{yaml}");
        yaml
    }

    #[test]
    fn nested_maps_and_lists_in_block_style() {
        let doc = json!({
            "kind": "CustomResourceDefinition",
            "spec": {"names": {"shortNames": ["cc"]}, "versions": [{"name": "v1alpha1", "served": true, "x": []}]},
            "empty": {}
        });
        assert_eq!(
            reads_back(&doc),
            "empty: {}\nkind: CustomResourceDefinition\nspec:\n  names:\n    shortNames:\n      - cc\n  versions:\n    - name: v1alpha1\n      served: true\n      x: []\n"
        );
    }

    #[test]
    fn strings_that_could_be_misread_are_quoted() {
        let doc = json!({"a": "true", "b": "50051", "c": "1h", "d": "x: y", "e": "#c", "f": "", "g": "NO", "h": "self >= 1 && x", "i": "yes", "j": "~", "k": "1e3"});
        let yaml = reads_back(&doc);
        for quoted in ["true", "50051", "x: y", "#c", "NO", "yes", "~", "1e3"] {
            assert!(
                yaml.contains(&format!("\"{quoted}\"")) || yaml.contains(&format!("'{quoted}'")),
                "{quoted} is not quoted in\n{yaml}"
            );
        }
    }

    #[test]
    fn multi_line_strings_become_literal_blocks() {
        let doc = json!({"d": {"description": "first line\n\nsecond: 'x'"}});
        assert_eq!(
            reads_back(&doc),
            "d:\n  description: |-\n    first line\n\n    second: 'x'\n"
        );
        reads_back(&json!({"t": "trailing \nspace", "u": "ends\n"}));
    }

    #[test]
    fn list_items_that_are_maps_start_on_the_dash_line() {
        let doc = json!([{"rule": "self >= 1", "message": "m"}, "plain", [1, 2]]);
        let yaml = reads_back(&doc);
        assert!(
            yaml.starts_with("- message: m\n  rule: self >= 1\n- plain\n"),
            "{yaml}"
        );
    }
}
