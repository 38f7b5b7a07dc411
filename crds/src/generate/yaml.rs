//! A small, deterministic JSON-to-YAML writer for the generated CRD.
//!
//! Block style throughout; strings are written plain when no YAML reader could take
//! them for anything else, as `|-` literal blocks when they span lines, and double-quoted
//! (JSON escapes, which YAML shares) otherwise. Keys come out in the order of the
//! `serde_json::Map` (sorted). Pure; no I/O. Not a general YAML library: it writes only
//! what it can write unambiguously.

use serde_json::{Map, Value};

/// Writes `value` as a YAML document (without the leading `---`).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        scalar => {
            write_scalar(&mut out, scalar, 2);
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, map: &Map<String, Value>, indent: usize) {
    for (key, value) in map {
        push_indent(out, indent);
        write_entry(out, key, value, indent);
    }
}

/// `key: value` where the key is already indented; nested blocks go at `indent + 2`.
fn write_entry(out: &mut String, key: &str, value: &Value, indent: usize) {
    write_string(out, key, indent + 2, false);
    out.push(':');
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, indent + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, indent + 2);
        }
        scalar => {
            out.push(' ');
            write_scalar(out, scalar, indent + 2);
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        push_indent(out, indent);
        out.push('-');
        match item {
            Value::Object(map) if !map.is_empty() => {
                for (i, (key, value)) in map.iter().enumerate() {
                    if i == 0 {
                        out.push(' ');
                    } else {
                        push_indent(out, indent + 2);
                    }
                    write_entry(out, key, value, indent + 2);
                }
            }
            Value::Array(nested) if !nested.is_empty() => {
                out.push('\n');
                write_seq(out, nested, indent + 2);
            }
            scalar => {
                out.push(' ');
                write_scalar(out, scalar, indent + 2);
                out.push('\n');
            }
        }
    }
}

/// A scalar or an empty collection; `indent` is where continuation lines go.
fn write_scalar(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(out, s, indent, true),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
}

fn write_string(out: &mut String, s: &str, indent: usize, allow_block: bool) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else if allow_block && is_block_safe(s) {
        out.push_str("|-");
        for line in s.split('\n') {
            out.push('\n');
            if !line.is_empty() {
                push_indent(out, indent);
                out.push_str(line);
            }
        }
    } else {
        // A JSON string is a valid YAML double-quoted scalar; serialising a &str cannot fail.
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

/// Plain (unquoted) only for text no YAML 1.1 or 1.2 reader reads as another type or
/// as syntax: starts with a letter, only letters, digits and a few safe punctuation
/// marks, and not a boolean or null word.
fn is_plain_safe(s: &str) -> bool {
    const RESERVED: [&str; 11] = [
        "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~", "nan",
    ];
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && !s.ends_with(' ')
        && !s.contains("  ")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || " _-./()=<>+;,".contains(c))
        && !RESERVED.iter().any(|word| s.eq_ignore_ascii_case(word))
}

/// A `|-` block keeps the text exactly when it has several lines, no control characters
/// but newlines, no trailing spaces on any line, does not start with a space or a
/// newline and does not end with a newline.
fn is_block_safe(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && !s.ends_with('\n')
        && !s.chars().any(|c| c.is_control() && c != '\n')
        && s.split('\n').all(|line| !line.ends_with(' '))
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nested_maps_and_lists_in_block_style() {
        let doc = json!({
            "kind": "CustomResourceDefinition",
            "spec": {"names": {"shortNames": ["cc"]}, "versions": [{"name": "v1alpha1", "served": true, "x": []}]},
            "empty": {}
        });
        assert_eq!(
            to_yaml(&doc),
            "empty: {}\nkind: CustomResourceDefinition\nspec:\n  names:\n    shortNames:\n      - cc\n  versions:\n    - name: v1alpha1\n      served: true\n      x: []\n"
        );
    }

    #[test]
    fn strings_that_could_be_misread_are_quoted() {
        let doc = json!({"a": "true", "b": "50051", "c": "1h", "d": "x: y", "e": "#c", "f": "", "g": "NO", "h": "self >= 1 && x"});
        assert_eq!(
            to_yaml(&doc),
            "a: \"true\"\nb: \"50051\"\nc: \"1h\"\nd: \"x: y\"\ne: \"#c\"\nf: \"\"\ng: \"NO\"\nh: \"self >= 1 && x\"\n"
        );
    }

    #[test]
    fn multi_line_strings_become_literal_blocks() {
        let doc =
            json!({"d": {"description": "first line\n\nsecond: 'x'"}, "t": "trailing \nspace"});
        assert_eq!(
            to_yaml(&doc),
            "d:\n  description: |-\n    first line\n\n    second: 'x'\nt: \"trailing \\nspace\"\n"
        );
    }

    #[test]
    fn list_items_that_are_maps_start_on_the_dash_line() {
        let doc = json!([{"rule": "self >= 1", "message": "m"}, "plain", [1, 2]]);
        assert_eq!(
            to_yaml(&doc),
            "- message: m\n  rule: self >= 1\n- plain\n-\n  - 1\n  - 2\n"
        );
    }
}
