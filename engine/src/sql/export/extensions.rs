//! Which Substrait extension declares each function of an exported plan, and
//! the plan's extension declarations.
//!
//! A standard function goes under the standard extension file that defines a
//! function of its name (`extension:io.substrait:functions_comparison`, …);
//! where several files define the name, the family of its argument types picks
//! one (decimals: the `_decimal` files, dates and times: `functions_datetime`).
//! The AI functions go under QUAIL-B's extension
//! (`bench/quailb/plans/substrait_extensions.yaml`), and every other function
//! or type, one DataFusion has and the standard files lack, under
//! [`DATAFUSION_URN`]: that extension has no YAML, its names mean DataFusion
//! 55's built-ins of that name. Consumers of Substrait before 0.75 identify an
//! extension by URI instead of URN: [`uri_of`] gives the one such consumers
//! used.

use datafusion::arrow::datatypes::DataType;
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::substrait::proto::extensions::SimpleExtensionDeclaration;
use datafusion_substrait::substrait::proto::extensions::SimpleExtensionUrn;
use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::{
    ExtensionFunction, ExtensionType, MappingType,
};

use crate::exec::ai_functions::AiFunction;

/// Functions and types DataFusion has and Substrait's standard extensions lack.
pub const DATAFUSION_URN: &str = "extension:aisql:functions_datafusion";

/// The owner of Substrait's standard extensions in their URNs.
const STANDARD_OWNER: &str = "extension:io.substrait:";

/// Where Substrait before 0.75 found its standard extension files.
const STANDARD_URI_BASE: &str = "https://github.com/substrait-io/substrait/blob/main/extensions/";

/// The standard extension files (Substrait 0.85) and the scalar, aggregate and
/// window functions each defines, in the order a name is looked up. Geometry,
/// approximate and decimal-output aggregates are left out: DataFusion has no
/// function of those names and meanings.
const STANDARD: &[(&str, &[&str])] = &[
    (
        "functions_comparison",
        &[
            "between",
            "coalesce",
            "equal",
            "greatest",
            "greatest_skip_null",
            "gt",
            "gte",
            "is_distinct_from",
            "is_false",
            "is_finite",
            "is_infinite",
            "is_nan",
            "is_not_distinct_from",
            "is_not_false",
            "is_not_null",
            "is_not_true",
            "is_null",
            "is_true",
            "least",
            "least_skip_null",
            "lt",
            "lte",
            "not_equal",
            "nullif",
        ],
    ),
    (
        "functions_boolean",
        &["and", "and_not", "bool_and", "bool_or", "not", "or", "xor"],
    ),
    (
        "functions_arithmetic",
        &[
            "abs",
            "acos",
            "acosh",
            "add",
            "asin",
            "asinh",
            "atan",
            "atan2",
            "atanh",
            "avg",
            "bitwise_and",
            "bitwise_not",
            "bitwise_or",
            "bitwise_xor",
            "corr",
            "cos",
            "cosh",
            "cume_dist",
            "degrees",
            "dense_rank",
            "divide",
            "exp",
            "factorial",
            "first_value",
            "lag",
            "last_value",
            "lead",
            "max",
            "median",
            "min",
            "mode",
            "modulus",
            "multiply",
            "negate",
            "nth_value",
            "ntile",
            "percent_rank",
            "power",
            "product",
            "quantile",
            "radians",
            "rank",
            "row_number",
            "shift_left",
            "shift_right",
            "shift_right_unsigned",
            "sign",
            "sin",
            "sinh",
            "sqrt",
            "std_dev",
            "subtract",
            "sum",
            "sum0",
            "tan",
            "tanh",
            "variance",
        ],
    ),
    (
        "functions_arithmetic_decimal",
        &[
            "abs",
            "add",
            "avg",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "divide",
            "factorial",
            "max",
            "min",
            "modulus",
            "multiply",
            "power",
            "sqrt",
            "subtract",
            "sum",
            "sum0",
        ],
    ),
    (
        "functions_string",
        &[
            "bit_length",
            "capitalize",
            "center",
            "char_length",
            "concat",
            "concat_ws",
            "contains",
            "count_substring",
            "ends_with",
            "initcap",
            "left",
            "like",
            "lower",
            "lpad",
            "ltrim",
            "octet_length",
            "regexp_count_substring",
            "regexp_match_substring",
            "regexp_match_substring_all",
            "regexp_replace",
            "regexp_string_split",
            "regexp_strpos",
            "repeat",
            "replace",
            "replace_slice",
            "reverse",
            "right",
            "rpad",
            "rtrim",
            "starts_with",
            "string_agg",
            "string_split",
            "strpos",
            "substring",
            "swapcase",
            "title",
            "trim",
            "upper",
        ],
    ),
    ("functions_rounding", &["ceil", "floor", "round"]),
    ("functions_rounding_decimal", &["ceil", "floor", "round"]),
    (
        "functions_logarithmic",
        &["ln", "log10", "log1p", "log2", "logb"],
    ),
    ("functions_aggregate_generic", &["any_value", "count"]),
    (
        "functions_datetime",
        &[
            "add",
            "add_intervals",
            "assume_timezone",
            "extract",
            "extract_boolean",
            "gt",
            "gte",
            "local_timestamp",
            "lt",
            "lte",
            "max",
            "min",
            "multiply",
            "round_calendar",
            "round_temporal",
            "strftime",
            "strptime_date",
            "strptime_time",
            "strptime_timestamp",
            "subtract",
        ],
    ),
    (
        "functions_list",
        &[
            "all_match",
            "any_match",
            "cardinality",
            "filter",
            "sort",
            "transform",
        ],
    ),
    ("functions_set", &["index_in"]),
];

/// What a call's argument types select among files defining its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A decimal argument: the `_decimal` files.
    Decimal,
    /// A date, time, timestamp, interval or duration argument: `functions_datetime`.
    Temporal,
    /// Anything else.
    Other,
}

impl Family {
    /// The family of a call over arguments of `types`.
    pub fn of<'a>(types: impl IntoIterator<Item = &'a DataType>) -> Self {
        let mut family = Family::Other;
        for t in types {
            if t.is_temporal() {
                return Family::Temporal;
            }
            if t.is_decimal() {
                family = Family::Decimal;
            }
        }
        family
    }
}

fn defines(file: &str, name: &str) -> bool {
    STANDARD
        .iter()
        .any(|(f, names)| *f == file && names.contains(&name))
}

/// The standard file declaring `name` for a call of `family`, if any.
fn standard_file(name: &str, family: Family) -> Option<&'static str> {
    let preferred: &[&str] = match family {
        Family::Decimal => &["functions_arithmetic_decimal", "functions_rounding_decimal"],
        // The comparisons take any type: their file, not the datetime one.
        Family::Temporal if !defines("functions_comparison", name) => &["functions_datetime"],
        _ => &[],
    };
    preferred
        .iter()
        .copied()
        .chain(STANDARD.iter().map(|(f, _)| *f))
        .find(|f| defines(f, name))
}

/// The URN of the extension declaring function `name` (as DataFusion's producer
/// names it) for a call of `family`.
pub fn function_urn(name: &str, family: Family) -> String {
    if let Some(f) = AiFunction::from_name(name) {
        return f.urn.to_string();
    }
    match standard_file(name, family) {
        Some(file) => format!("{STANDARD_OWNER}{file}"),
        None => DATAFUSION_URN.to_string(),
    }
}

/// The URI consumers of Substrait before 0.75 know extension `urn` by: the
/// standard files' GitHub address, else the URN itself (as ibis-substrait
/// writes QUAIL-B's).
pub fn uri_of(urn: &str) -> String {
    match urn.strip_prefix(STANDARD_OWNER) {
        Some(file) => format!("{STANDARD_URI_BASE}{file}.yaml"),
        None => urn.to_string(),
    }
}

/// One declared function or type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Declared {
    anchor: u32,
    name: String,
    urn: String,
}

/// The functions and types a plan uses, each with its anchor (from 1: zero reads
/// as "unset" in protobuf) and the URN of its extension.
#[derive(Debug, Default)]
pub struct Registry {
    functions: Vec<Declared>,
    types: Vec<Declared>,
    /// DataFusion's own registry, kept only for its renames to Substrait names
    /// (`substr` → `substring`, `log` → `logb`), which its consumer reverses.
    renames: Extensions,
}

impl Registry {
    /// The anchor of function `name` called with arguments of `family`.
    pub fn function(&mut self, name: &str, family: Family) -> u32 {
        let anchor = self.renames.register_function(name);
        let name = self.renames.functions[&anchor].clone();
        let urn = function_urn(&name, family);
        declare(&mut self.functions, name, urn)
    }

    /// The anchor of DataFusion's extension type `name`.
    pub fn type_anchor(&mut self, name: &str) -> u32 {
        declare(
            &mut self.types,
            name.to_lowercase(),
            DATAFUSION_URN.to_string(),
        )
    }

    /// Anchors to names, as DataFusion's producer reports them.
    pub fn extensions(&self) -> Extensions {
        let map = |d: &[Declared]| d.iter().map(|d| (d.anchor, d.name.clone())).collect();
        Extensions {
            functions: map(&self.functions),
            types: map(&self.types),
            type_variations: Default::default(),
        }
    }

    /// The plan's extension URNs (anchors from 1, in order of first use) and
    /// declarations.
    pub fn declarations(&self) -> (Vec<SimpleExtensionUrn>, Vec<SimpleExtensionDeclaration>) {
        let mut urns: Vec<SimpleExtensionUrn> = Vec::new();
        let mut urn_anchor = |urn: &str| match urns.iter().find(|u| u.urn == urn) {
            Some(u) => u.extension_urn_anchor,
            None => {
                let anchor = urns.len() as u32 + 1;
                urns.push(SimpleExtensionUrn {
                    extension_urn_anchor: anchor,
                    urn: urn.to_string(),
                });
                anchor
            }
        };
        let mut declarations = Vec::new();
        for f in &self.functions {
            declarations.push(MappingType::ExtensionFunction(ExtensionFunction {
                extension_urn_reference: urn_anchor(&f.urn),
                function_anchor: f.anchor,
                name: f.name.clone(),
            }));
        }
        for t in &self.types {
            declarations.push(MappingType::ExtensionType(ExtensionType {
                extension_urn_reference: urn_anchor(&t.urn),
                type_anchor: t.anchor,
                name: t.name.clone(),
            }));
        }
        let declarations = declarations
            .into_iter()
            .map(|m| SimpleExtensionDeclaration {
                mapping_type: Some(m),
            })
            .collect();
        (urns, declarations)
    }
}

fn declare(declared: &mut Vec<Declared>, name: String, urn: String) -> u32 {
    if let Some(d) = declared.iter().find(|d| d.name == name && d.urn == urn) {
        return d.anchor;
    }
    let anchor = declared.len() as u32 + 1;
    declared.push(Declared { anchor, name, urn });
    anchor
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ai_functions::AI_URN;
    use datafusion::arrow::datatypes::IntervalUnit;

    #[test]
    fn standard_functions_go_to_their_file_by_argument_family() {
        let urn = |n, f| function_urn(n, f);
        assert_eq!(
            urn("equal", Family::Other),
            "extension:io.substrait:functions_comparison"
        );
        assert_eq!(
            urn("gt", Family::Temporal),
            "extension:io.substrait:functions_comparison"
        );
        assert_eq!(
            urn("add", Family::Other),
            "extension:io.substrait:functions_arithmetic"
        );
        assert_eq!(
            urn("add", Family::Decimal),
            "extension:io.substrait:functions_arithmetic_decimal"
        );
        assert_eq!(
            urn("add", Family::Temporal),
            "extension:io.substrait:functions_datetime"
        );
        assert_eq!(
            urn("count", Family::Decimal),
            "extension:io.substrait:functions_aggregate_generic"
        );
        assert_eq!(
            urn("round", Family::Decimal),
            "extension:io.substrait:functions_rounding_decimal"
        );
        assert_eq!(urn("ai_join", Family::Other), AI_URN);
        assert_eq!(urn("make_array", Family::Other), DATAFUSION_URN);
    }

    #[test]
    fn families_follow_argument_types() {
        assert_eq!(
            Family::of(&[DataType::Int64, DataType::Decimal128(10, 2)]),
            Family::Decimal
        );
        assert_eq!(
            Family::of(&[
                DataType::Decimal128(10, 2),
                DataType::Interval(IntervalUnit::DayTime)
            ]),
            Family::Temporal
        );
        assert_eq!(Family::of(&[DataType::Utf8]), Family::Other);
    }

    #[test]
    fn uris_are_the_pre_urn_addresses() {
        assert_eq!(
            uri_of("extension:io.substrait:functions_boolean"),
            "https://github.com/substrait-io/substrait/blob/main/extensions/functions_boolean.yaml"
        );
        assert_eq!(uri_of(AI_URN), AI_URN);
    }

    #[test]
    fn anchors_start_at_one_and_a_name_per_extension_is_declared_once() {
        let mut r = Registry::default();
        assert_eq!(r.function("equal", Family::Other), 1);
        assert_eq!(r.function("ai_filter", Family::Other), 2);
        assert_eq!(r.function("equal", Family::Other), 1);
        // DataFusion's rename, and a second file for one name.
        assert_eq!(r.function("substr", Family::Other), 3);
        assert_eq!(r.function("add", Family::Other), 4);
        assert_eq!(r.function("add", Family::Decimal), 5);
        assert_eq!(r.type_anchor("fp16"), 1);
        let (urns, decls) = r.declarations();
        let urn_names: Vec<&str> = urns.iter().map(|u| u.urn.as_str()).collect();
        assert_eq!(
            urn_names,
            [
                "extension:io.substrait:functions_comparison",
                AI_URN,
                "extension:io.substrait:functions_string",
                "extension:io.substrait:functions_arithmetic",
                "extension:io.substrait:functions_arithmetic_decimal",
                DATAFUSION_URN,
            ]
        );
        assert_eq!(urns[0].extension_urn_anchor, 1);
        let names: Vec<(String, u32, u32)> = decls
            .iter()
            .map(|d| match d.mapping_type.as_ref().unwrap() {
                MappingType::ExtensionFunction(f) => {
                    (f.name.clone(), f.function_anchor, f.extension_urn_reference)
                }
                MappingType::ExtensionType(t) => {
                    (t.name.clone(), t.type_anchor, t.extension_urn_reference)
                }
                MappingType::ExtensionTypeVariation(_) => unreachable!("none declared"),
            })
            .collect();
        assert_eq!(
            names,
            [
                ("equal".to_string(), 1, 1),
                ("ai_filter".to_string(), 2, 2),
                ("substring".to_string(), 3, 3),
                ("add".to_string(), 4, 4),
                ("add".to_string(), 5, 5),
                ("fp16".to_string(), 1, 6),
            ]
        );
        assert_eq!(r.extensions().functions[&3], "substring");
    }
}
