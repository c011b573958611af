//! Test support, included with `#[path]`: docs/json.md as a contract. Every field path a
//! real document carries must have its row (`` `path` `` in the first column) in that
//! document's section, so a field added without its row fails the suite that made it. A
//! row `` `path.*` `` stands for an object whose keys are data (PyTorch's size intervals,
//! say), not fields.

#![allow(dead_code)] // each suite that includes this uses part of it

use std::collections::BTreeSet;

/// The field paths of `value`: object keys joined with `.`, array elements as `[]`.
pub fn paths(value: &serde_json::Value) -> BTreeSet<String> {
    fn walk(value: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map {
                    let path = if at.is_empty() {
                        key.clone()
                    } else {
                        format!("{at}.{key}")
                    };
                    out.insert(path.clone());
                    walk(inner, &path, out);
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, &format!("{at}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(value, "", &mut out);
    out
}

/// The paths listed in the section `## {title}` of docs/json.md.
pub fn documented(title: &str) -> BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/json.md"))
        .expect("docs/json.md");
    let heading = format!("## {title}");
    let mut inside = false;
    let mut out = BTreeSet::new();
    for line in doc.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == heading;
            continue;
        }
        if !inside {
            continue;
        }
        // `| `path` | type | meaning |`: the first cell's code span.
        let Some(cell) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        let cell = cell.trim();
        if let Some(path) = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')) {
            out.insert(path.to_string());
        }
    }
    assert!(
        !out.is_empty(),
        "docs/json.md has no rows under '{heading}'"
    );
    out
}

/// Fails with every path of `value` that `## {title}` does not list.
pub fn assert_documented(title: &str, value: &serde_json::Value) {
    let listed = documented(title);
    let open_objects: Vec<String> = listed
        .iter()
        .filter_map(|p| p.strip_suffix('*'))
        .map(str::to_string)
        .collect();
    let missing: Vec<String> = paths(value)
        .into_iter()
        .filter(|p| !listed.contains(p) && !open_objects.iter().any(|o| p.starts_with(o)))
        .collect();
    assert!(
        missing.is_empty(),
        "fields of `{title}` without a row in docs/json.md:\n{}",
        missing.join("\n")
    );
}
