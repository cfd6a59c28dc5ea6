//! The binary form of an exported plan, which consumers of Substrait before
//! 0.75 read too.
//!
//! Substrait 0.75 moved extension identity from URIs (`Plan` field 1, each
//! declaration's field 1) to URNs (`Plan` field 8, field 4); the protobuf
//! definitions aisql builds with have dropped the URI fields, and consumers and
//! validators built on older definitions (substrait-validator 0.1.4 checks
//! Substrait 0.57) see no extension at all without them. Protobuf readers skip
//! fields they do not know, so the binary plan carries both: the plan as the
//! current definitions write it, then its declarations again with the URI
//! fields beside the URN ones. Decoded with either generation's definitions it
//! is the same plan. The ProtoJSON form ([`encode_json`]) carries both too:
//! `extensionUris` beside `extensionUrns`, `extensionUriReference` beside
//! each `extensionUrnReference`. A reader of either generation that skips
//! unknown keys (as aisql's does, and protobuf's `ignore_unknown_fields`)
//! finds its extensions; a strict one refuses the other generation's keys.

use datafusion_substrait::substrait::proto::Plan;
use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::MappingType;
use prost::Message;

use super::extensions::uri_of;

/// `Plan` fields 1 and 2 as Substrait 0.74 defines them.
#[derive(Clone, PartialEq, Message)]
struct UriHeader {
    #[prost(message, repeated, tag = "1")]
    extension_uris: Vec<ExtensionUri>,
    #[prost(message, repeated, tag = "2")]
    extensions: Vec<Declaration>,
}

#[derive(Clone, PartialEq, Message)]
struct ExtensionUri {
    #[prost(uint32, tag = "1")]
    extension_uri_anchor: u32,
    #[prost(string, tag = "2")]
    uri: String,
}

/// A `SimpleExtensionDeclaration`: one of its three kinds is set.
#[derive(Clone, PartialEq, Message)]
struct Declaration {
    #[prost(message, optional, tag = "1")]
    extension_type: Option<Reference>,
    #[prost(message, optional, tag = "2")]
    extension_type_variation: Option<Reference>,
    #[prost(message, optional, tag = "3")]
    extension_function: Option<Reference>,
}

/// The fields the three declaration kinds share.
#[derive(Clone, PartialEq, Message)]
struct Reference {
    #[prost(uint32, tag = "1")]
    extension_uri_reference: u32,
    #[prost(uint32, tag = "2")]
    anchor: u32,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(uint32, tag = "4")]
    extension_urn_reference: u32,
}

/// `plan` as binary protobuf with the pre-0.75 URI fields. A URI's anchor is
/// its URN's, so each reference is the same number in both fields.
pub fn encode(plan: &Plan) -> Vec<u8> {
    let header = UriHeader {
        extension_uris: plan
            .extension_urns
            .iter()
            .map(|u| ExtensionUri {
                extension_uri_anchor: u.extension_urn_anchor,
                uri: uri_of(&u.urn),
            })
            .collect(),
        extensions: plan
            .extensions
            .iter()
            .filter_map(|d| d.mapping_type.as_ref())
            .map(|m| {
                let (urn, anchor, name) = match m {
                    MappingType::ExtensionType(t) => {
                        (t.extension_urn_reference, t.type_anchor, &t.name)
                    }
                    MappingType::ExtensionTypeVariation(v) => {
                        (v.extension_urn_reference, v.type_variation_anchor, &v.name)
                    }
                    MappingType::ExtensionFunction(f) => {
                        (f.extension_urn_reference, f.function_anchor, &f.name)
                    }
                };
                let reference = Some(Reference {
                    extension_uri_reference: urn,
                    anchor,
                    name: name.clone(),
                    extension_urn_reference: urn,
                });
                match m {
                    MappingType::ExtensionType(_) => Declaration {
                        extension_type: reference,
                        ..Default::default()
                    },
                    MappingType::ExtensionTypeVariation(_) => Declaration {
                        extension_type_variation: reference,
                        ..Default::default()
                    },
                    MappingType::ExtensionFunction(_) => Declaration {
                        extension_function: reference,
                        ..Default::default()
                    },
                }
            })
            .collect(),
    };
    let rest = Plan {
        extensions: Vec::new(),
        ..plan.clone()
    };
    let mut bytes = rest.encode_to_vec();
    bytes.extend(header.encode_to_vec());
    bytes
}

/// `plan` as pretty ProtoJSON with the pre-0.75 URI fields, anchored as in
/// [`encode`].
pub fn encode_json(plan: &Plan) -> serde_json::Result<Vec<u8>> {
    let mut json = serde_json::to_value(plan)?;
    let uris: Vec<serde_json::Value> = plan
        .extension_urns
        .iter()
        .map(|u| {
            serde_json::json!({
                "extensionUriAnchor": u.extension_urn_anchor,
                "uri": uri_of(&u.urn),
            })
        })
        .collect();
    if let Some(top) = json.as_object_mut()
        && !uris.is_empty()
    {
        top.insert("extensionUris".into(), uris.into());
    }
    let declarations = json
        .get_mut("extensions")
        .and_then(|e| e.as_array_mut())
        .into_iter()
        .flatten();
    for (json, declared) in declarations.zip(&plan.extensions) {
        let urn = match &declared.mapping_type {
            Some(MappingType::ExtensionType(t)) => t.extension_urn_reference,
            Some(MappingType::ExtensionTypeVariation(v)) => v.extension_urn_reference,
            Some(MappingType::ExtensionFunction(f)) => f.extension_urn_reference,
            None => continue,
        };
        // The one kind set: its object gets the URI reference.
        if let Some(mapping) = json
            .as_object_mut()
            .and_then(|m| m.values_mut().next())
            .and_then(|m| m.as_object_mut())
        {
            mapping.insert("extensionUriReference".into(), urn.into());
        }
    }
    serde_json::to_vec_pretty(&json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::ExtensionFunction;
    use datafusion_substrait::substrait::proto::extensions::{
        SimpleExtensionDeclaration, SimpleExtensionUrn,
    };

    fn plan() -> Plan {
        Plan {
            extension_urns: vec![SimpleExtensionUrn {
                extension_urn_anchor: 1,
                urn: "extension:io.substrait:functions_comparison".into(),
            }],
            extensions: vec![SimpleExtensionDeclaration {
                mapping_type: Some(MappingType::ExtensionFunction(ExtensionFunction {
                    extension_urn_reference: 1,
                    function_anchor: 1,
                    name: "equal".into(),
                })),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn current_definitions_read_the_same_plan() {
        let plan = plan();
        assert_eq!(Plan::decode(encode(&plan).as_slice()).unwrap(), plan);
    }

    #[test]
    fn json_declares_uris_beside_urns_and_reads_back_the_same_plan() {
        let plan = plan();
        let bytes = encode_json(&plan).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            json["extensionUris"],
            serde_json::json!([{
                "extensionUriAnchor": 1,
                "uri": "https://github.com/substrait-io/substrait/blob/main/extensions/functions_comparison.yaml",
            }])
        );
        let f = &json["extensions"][0]["extensionFunction"];
        assert_eq!(
            (&f["extensionUriReference"], &f["extensionUrnReference"]),
            (&1.into(), &1.into())
        );
        assert_eq!(
            json["extensionUrns"][0]["urn"],
            "extension:io.substrait:functions_comparison"
        );
        let read = crate::sql::plan_file::decode_plan(&bytes, true).unwrap();
        assert_eq!(read, plan);
    }

    #[test]
    fn older_definitions_find_the_uris() {
        let header = UriHeader::decode(encode(&plan()).as_slice()).unwrap();
        assert_eq!(
            header.extension_uris,
            [ExtensionUri {
                extension_uri_anchor: 1,
                uri: "https://github.com/substrait-io/substrait/blob/main/extensions/functions_comparison.yaml"
                    .into(),
            }]
        );
        let f = header.extensions[0].extension_function.as_ref().unwrap();
        assert_eq!((f.extension_uri_reference, f.anchor), (1, 1));
        assert_eq!(f.name, "equal");
    }
}
