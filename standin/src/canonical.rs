//! Canonical JSON (sorted keys, compact separators, non-ASCII kept) and its
//! SHA-256, as QUAIL-B uses for definition hashes and dataset ids.

use sha2::{Digest, Sha256};

/// Writes `v` as canonical JSON: object keys sorted, `,`/`:` separators, UTF-8.
pub fn to_string(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// SHA-256 hex digest of the canonical JSON of `v`.
pub fn sha256_hex(v: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(to_string(v).as_bytes()))
}

/// A QUAIL-B style id: `prefix_` + the first 32 hex digits of the canonical hash.
pub fn hashed_id(prefix: &str, v: &serde_json::Value) -> String {
    format!("{prefix}_{}", &sha256_hex(v)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_keeps_non_ascii() {
        let v = json!({"b": [1, {"z": "é\n", "a": null}], "a": true});
        assert_eq!(to_string(&v), r#"{"a":true,"b":[1,{"a":null,"z":"é\n"}]}"#);
    }

    #[test]
    fn hash_matches_python_hashlib_of_the_same_text() {
        // hashlib.sha256(b'{"a":1}').hexdigest()
        assert_eq!(
            sha256_hex(&json!({"a": 1})),
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
    }
}
