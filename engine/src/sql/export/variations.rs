//! DataFusion's type variations in an exported plan: plain types for Arrow's
//! layouts, declarations for the rest.
//!
//! DataFusion writes some Arrow types as a Substrait type with a type
//! variation, and declares none of them: a consumer cannot resolve the anchor,
//! and a validator rejects it. Variation 1 is a large layout of strings,
//! binaries and lists, 2 a view layout: how the values sit in memory, not what
//! they are, so an export writes the plain type (variation 0), which
//! DataFusion's consumer reads back in the default layout with the same
//! values. The other variations change what a value can be (1: unsigned
//! integers, 64-bit dates and times, 256-bit decimals, dictionary maps,
//! durations); they are kept and declared under
//! [`super::extensions::DATAFUSION_URN`], named after what they are for the
//! types that use them in the plan.
//!
//! Types and literals sit everywhere in a plan (schemas, casts, literals,
//! output types), so the walk is over the plan's ProtoJSON form, where both
//! are recognisable by their keys.

use std::collections::{BTreeMap, BTreeSet};

use datafusion_substrait::substrait::proto::Plan;
use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::{
    ExtensionTypeVariation, MappingType,
};
use datafusion_substrait::substrait::proto::extensions::{
    SimpleExtensionDeclaration, SimpleExtensionUrn,
};
use serde_json::{Map, Value};

use super::extensions::DATAFUSION_URN;

/// The ProtoJSON keys of the container kinds, as a type's kind or a literal's
/// value.
const CONTAINERS: [&str; 4] = ["string", "binary", "list", "emptyList"];

/// What DataFusion's variation of a type or literal kind (ProtoJSON key) means.
const MEANINGS: [(&str, &str); 10] = [
    ("i8", "unsigned"),
    ("i16", "unsigned"),
    ("i32", "unsigned"),
    ("i64", "unsigned"),
    ("date", "date64"),
    ("precisionTime", "time64"),
    ("decimal", "decimal256"),
    ("map", "dictionary"),
    ("intervalDay", "duration"),
    ("intervalDayToSecond", "duration"),
];

const VARIATION: &str = "typeVariationReference";

/// The variations a plan keeps: anchor to the meanings it has there.
type Kept = BTreeMap<u64, BTreeSet<&'static str>>;

/// `plan` with its container types plain and its other variations declared.
pub fn settle(plan: Plan) -> Result<Plan, String> {
    let mut json = serde_json::to_value(&plan).map_err(|e| e.to_string())?;
    let mut kept = Kept::new();
    walk(&mut json, &mut kept);
    let mut plan: Plan = serde_json::from_value(json).map_err(|e| e.to_string())?;
    if kept.is_empty() {
        return Ok(plan);
    }
    let urn = match plan.extension_urns.iter().find(|u| u.urn == DATAFUSION_URN) {
        Some(u) => u.extension_urn_anchor,
        None => {
            let anchor = plan
                .extension_urns
                .iter()
                .map(|u| u.extension_urn_anchor)
                .max()
                .unwrap_or(0)
                + 1;
            plan.extension_urns.push(SimpleExtensionUrn {
                extension_urn_anchor: anchor,
                urn: DATAFUSION_URN.to_string(),
            });
            anchor
        }
    };
    for (anchor, meanings) in kept {
        let anchor =
            u32::try_from(anchor).map_err(|_| format!("type variation anchor {anchor}"))?;
        plan.extensions.push(SimpleExtensionDeclaration {
            mapping_type: Some(MappingType::ExtensionTypeVariation(
                ExtensionTypeVariation {
                    extension_urn_reference: urn,
                    type_variation_anchor: anchor,
                    name: meanings.into_iter().collect::<Vec<_>>().join("_or_"),
                },
            )),
        });
    }
    Ok(plan)
}

fn meaning(kind: &str) -> Option<&'static str> {
    MEANINGS.iter().find(|(k, _)| *k == kind).map(|(_, m)| *m)
}

fn variation(o: &Map<String, Value>) -> Option<u64> {
    o.get(VARIATION).and_then(Value::as_u64).filter(|v| *v != 0)
}

fn walk(v: &mut Value, kept: &mut Kept) {
    match v {
        Value::Object(o) => {
            // A literal: its variation sits beside its value.
            if let Some(n) = variation(o) {
                if CONTAINERS.iter().any(|k| o.contains_key(*k)) {
                    o.remove(VARIATION);
                } else if let Some(m) = o.keys().find_map(|k| meaning(k)) {
                    kept.entry(n).or_default().insert(m);
                }
            }
            // A type: its variation sits inside its kind.
            for (kind, inner) in o.iter_mut() {
                let Value::Object(inner) = inner else {
                    continue;
                };
                let Some(n) = variation(inner) else { continue };
                if CONTAINERS.contains(&kind.as_str()) {
                    inner.remove(VARIATION);
                } else if let Some(m) = meaning(kind) {
                    kept.entry(n).or_default().insert(m);
                }
            }
            o.values_mut().for_each(|v| walk(v, kept));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| walk(v, kept)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(types: Value, filter: Value) -> Plan {
        serde_json::from_value(json!({
            "extensionUrns": [{"extensionUrnAnchor": 1, "urn": "extension:io.substrait:functions_comparison"}],
            "relations": [{"root": {"input": {"read": {
                "baseSchema": {"names": ["a", "b", "c"], "struct": {"types": types}},
                "filter": filter,
                "namedTable": {"names": ["t"]}
            }}}}]
        }))
        .unwrap()
    }

    #[test]
    fn container_layouts_become_plain_types() {
        let settled = settle(plan(
            json!([
                {"string": {"typeVariationReference": 2, "nullability": "NULLABILITY_NULLABLE"}},
                {"list": {"type": {"binary": {"typeVariationReference": 1}}, "typeVariationReference": 1}}
            ]),
            json!({"literal": {"string": "x", "typeVariationReference": 2}}),
        ))
        .unwrap();
        assert!(settled.extensions.is_empty());
        assert_eq!(settled.extension_urns.len(), 1);
        let json = serde_json::to_value(settled).unwrap();
        let read = &json["relations"][0]["root"]["input"]["read"];
        let types = &read["baseSchema"]["struct"]["types"];
        assert_eq!(
            types[0],
            json!({"string": {"nullability": "NULLABILITY_NULLABLE"}})
        );
        assert_eq!(types[1], json!({"list": {"type": {"binary": {}}}}));
        assert_eq!(read["filter"], json!({"literal": {"string": "x"}}));
    }

    #[test]
    fn other_variations_are_kept_and_declared() {
        let settled = settle(plan(
            json!([
                {"i64": {"typeVariationReference": 1}},
                {"date": {"typeVariationReference": 1}}
            ]),
            json!({"literal": {"i32": 7, "typeVariationReference": 1}}),
        ))
        .unwrap();
        assert_eq!(settled.extension_urns[1].urn, DATAFUSION_URN);
        assert_eq!(settled.extension_urns[1].extension_urn_anchor, 2);
        assert_eq!(
            settled.extensions,
            [SimpleExtensionDeclaration {
                mapping_type: Some(MappingType::ExtensionTypeVariation(
                    ExtensionTypeVariation {
                        extension_urn_reference: 2,
                        type_variation_anchor: 1,
                        name: "date64_or_unsigned".into(),
                    }
                )),
            }]
        );
        let json = serde_json::to_value(settled).unwrap();
        let read = &json["relations"][0]["root"]["input"]["read"];
        assert_eq!(
            read["baseSchema"]["struct"]["types"][0],
            json!({"i64": {"typeVariationReference": 1}})
        );
    }
}
