//! The SQL types a generated answer can be asked in. A field of `ai_extract`
//! is declared `name` (text, as before) or `name TYPE`: `year INT`, `rating
//! DOUBLE`, `released DATE`, `sequel BOOLEAN`, `genre ENUM(drama, comedy)`.
//! This module owns the declaration (parsed and spelled canonically, the
//! spelling the call's label holds, so that the answer cache, workers and
//! Substrait plans carry the type with the name), the Arrow type a field
//! gives, the regular language its text is decoded in (the grammar the
//! decoder masks tokens by, [`crate::inference::grammar`]), and the reading of
//! that text as a value.
//!
//! Type keywords are recognised in upper case only, so that an untyped field
//! named `release date` stays a text field named so.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, PrimitiveArray, StringArray};
use datafusion::arrow::compute::kernels::cast_utils::Parser;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Float64Type, Int64Type,
};

/// The type of one generated answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldType {
    /// Free text (`VARCHAR`), decoded unconstrained.
    Text,
    /// `INT`: a 64-bit integer, at most 18 digits.
    Int,
    /// `DOUBLE`: a decimal number, at most 15 digits before the point and 15
    /// after it.
    Double,
    /// `BOOLEAN`: `true` or `false`.
    Boolean,
    /// `DATE`: a valid calendar date, `YYYY-MM-DD`.
    Date,
    /// `ENUM(a, b, ...)`: one of the listed values, as text.
    Enum(Vec<String>),
    /// `JSON {schema}`: a JSON text valid under the schema (compact, as
    /// serde_json writes it), as text.
    Json(String),
}

/// One declared field: its name and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDecl {
    /// The field's name (the struct field's).
    pub name: String,
    /// What its answer is.
    pub ty: FieldType,
}

impl FieldDecl {
    /// Reads `name` or `name TYPE` (see the module header); the error says
    /// what is wrong with the declaration.
    pub fn parse(decl: &str) -> Result<Self, String> {
        let decl = decl.trim();
        if decl.contains(" FROM ") {
            return Err(format!(
                "{decl:?}: a field whose answers are a column's keys (name FROM table.column) \
                 is read in SQL statements only, where the keys are read before planning"
            ));
        }
        let (name, ty) = split_type(decl)?;
        if name.is_empty() {
            return Err(format!("{decl:?} has no name"));
        }
        // The canonical spelling must read back as this declaration: a name
        // that ends in a type keyword itself would not.
        if !matches!(split_type(name), Ok((_, FieldType::Text))) || name.contains(" ENUM(") {
            return Err(format!(
                "the field name {name:?} ends in a type keyword; rename the field"
            ));
        }
        Ok(Self {
            name: name.to_string(),
            ty,
        })
    }

    /// The declaration of every label of a call (an extraction's fields).
    pub fn parse_all(labels: &[String]) -> Result<Vec<Self>, String> {
        labels.iter().map(|l| Self::parse(l)).collect()
    }
}

impl fmt::Display for FieldDecl {
    /// The canonical declaration: the name alone for text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ty {
            FieldType::Text => write!(f, "{}", self.name),
            ty => write!(f, "{} {ty}", self.name),
        }
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldType::Text => f.write_str("VARCHAR"),
            FieldType::Int => f.write_str("INT"),
            FieldType::Double => f.write_str("DOUBLE"),
            FieldType::Boolean => f.write_str("BOOLEAN"),
            FieldType::Date => f.write_str("DATE"),
            FieldType::Enum(values) => {
                let quoted: Vec<String> = values
                    .iter()
                    .map(|v| format!("'{}'", v.replace('\'', "''")))
                    .collect();
                write!(f, "ENUM({})", quoted.join(", "))
            }
            FieldType::Json(schema) => write!(f, "JSON {schema}"),
        }
    }
}

/// `decl` split into its name and type: text when it ends in no type.
fn split_type(decl: &str) -> Result<(&str, FieldType), String> {
    if let Some(at) = decl.find(" JSON {") {
        let text = &decl[at + " JSON ".len()..];
        let schema: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("{decl:?}: the JSON schema cannot be read: {e}"))?;
        crate::inference::grammar::check_json_schema(&schema)
            .map_err(|e| format!("{decl:?}: {e}"))?;
        return Ok((decl[..at].trim_end(), FieldType::Json(schema.to_string())));
    }
    if let Some(open) = decl.find(" ENUM(") {
        let Some(inner) = decl[open + " ENUM(".len()..].strip_suffix(')') else {
            return Err(format!("{decl:?}: ENUM( has no closing ')' at the end"));
        };
        let values = enum_values(inner).map_err(|e| format!("{decl:?}: {e}"))?;
        return Ok((decl[..open].trim_end(), FieldType::Enum(values)));
    }
    let Some((name, word)) = decl.rsplit_once(char::is_whitespace) else {
        return Ok((decl, FieldType::Text));
    };
    let ty = match word {
        "INT" | "INTEGER" | "BIGINT" => FieldType::Int,
        "DOUBLE" | "FLOAT" | "REAL" => FieldType::Double,
        "BOOLEAN" | "BOOL" => FieldType::Boolean,
        "DATE" => FieldType::Date,
        "VARCHAR" | "TEXT" | "STRING" => return Ok((name.trim_end(), FieldType::Text)),
        _ => return Ok((decl, FieldType::Text)),
    };
    Ok((name.trim_end(), ty))
}

/// The values of `ENUM(...)`: comma-separated, each bare or in single quotes
/// (`''` a quote inside); none empty, none twice, at least one.
fn enum_values(inner: &str) -> Result<Vec<String>, String> {
    let mut values: Vec<String> = Vec::new();
    let mut rest = inner.trim_start();
    loop {
        let value = if let Some(quoted) = rest.strip_prefix('\'') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '\'')) if quoted[i + 1..].starts_with('\'') => {
                        value.push('\'');
                        chars.next();
                    }
                    Some((i, '\'')) => break i + 1,
                    Some((_, c)) => value.push(c),
                    None => return Err("an ENUM value's quote is not closed".into()),
                }
            };
            rest = quoted[end..].trim_start();
            value
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let value = rest[..end].trim().to_string();
            rest = &rest[end..];
            value
        };
        if value.is_empty() {
            return Err("an ENUM value is empty".into());
        }
        if value.trim() != value {
            return Err(format!("the ENUM value {value:?} has spaces around it"));
        }
        if values.contains(&value) {
            return Err(format!("the ENUM value {value:?} comes twice"));
        }
        values.push(value);
        match rest.strip_prefix(',') {
            Some(next) => rest = next.trim_start(),
            None if rest.is_empty() => return Ok(values),
            None => return Err(format!("unexpected {rest:?} after an ENUM value")),
        }
    }
}

/// A valid calendar date, `YYYY-MM-DD` (29 February in leap years only).
const DATE_REGEX: &str = concat!(
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])",
    "|(0[469]|11)-(0[1-9]|[12][0-9]|30)",
    "|02-(0[1-9]|1[0-9]|2[0-8])))",
    "|(([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)",
);

impl FieldType {
    /// Whether the answer's text is free (decoded unconstrained).
    pub fn is_text(&self) -> bool {
        matches!(self, FieldType::Text)
    }

    /// The Arrow type of the answers.
    pub fn data_type(&self) -> DataType {
        match self {
            FieldType::Text | FieldType::Enum(_) | FieldType::Json(_) => DataType::Utf8,
            FieldType::Int => DataType::Int64,
            FieldType::Double => DataType::Float64,
            FieldType::Boolean => DataType::Boolean,
            FieldType::Date => DataType::Date32,
        }
    }

    /// The regular expression every decoded text matches whole (an optional
    /// leading space, as a model's first token often carries one); `None`
    /// for free text, for a set of values, which the decoder follows by a
    /// token trie instead ([`crate::inference::key_trie`]), and for JSON,
    /// whose grammar is its schema's.
    pub fn regex(&self) -> Option<String> {
        let body = match self {
            FieldType::Text | FieldType::Enum(_) | FieldType::Json(_) => return None,
            FieldType::Int => "-?(0|[1-9][0-9]{0,17})".to_string(),
            FieldType::Double => "-?(0|[1-9][0-9]{0,14})(\\.[0-9]{1,15})?".to_string(),
            FieldType::Boolean => "(true|false)".to_string(),
            FieldType::Date => DATE_REGEX.to_string(),
        };
        Some(format!(" ?({body})"))
    }

    /// Whether `text` is an answer of this type ([`Self::regex`]'s language).
    pub fn accepts(&self, text: &str) -> bool {
        let value = text.strip_prefix(' ').unwrap_or(text);
        match self {
            FieldType::Text => true,
            FieldType::Int => {
                value.trim_start_matches('-').len() <= 18
                    && !value.starts_with('+')
                    && value.parse::<i64>().is_ok()
            }
            FieldType::Double => {
                !value.starts_with('+')
                    && !value.contains(['e', 'E', 'i', 'n', 'N', 'I'])
                    && value.parse::<f64>().is_ok()
            }
            FieldType::Boolean => value == "true" || value == "false",
            FieldType::Date => value.len() == 10 && Date32Type::parse(value).is_some(),
            FieldType::Enum(values) => values.iter().any(|v| v == value),
            // Parsed, not checked against the schema: the decoder's mask
            // keeps the model's text inside it.
            FieldType::Json(_) => serde_json::from_str::<serde_json::Value>(value).is_ok(),
        }
    }

    /// The column of `texts` (each an answer of this type, or NULL); the
    /// error names the first text that is not one.
    pub fn column(&self, texts: &[Option<&str>]) -> Result<ArrayRef, String> {
        let bad = |t: &str| format!("{t:?} is not a {self} answer");
        // The value's text: the answer without its optional leading space.
        let value = |t: &'_ str| -> Result<String, String> {
            match self.accepts(t) {
                true => Ok(t.strip_prefix(' ').unwrap_or(t).to_string()),
                false => Err(bad(t)),
            }
        };
        fn primitive<T: ArrowPrimitiveType>(
            texts: &[Option<&str>],
            read: impl Fn(&str) -> Result<T::Native, String>,
        ) -> Result<ArrayRef, String> {
            let array: PrimitiveArray<T> = texts
                .iter()
                .map(|t| t.map(&read).transpose())
                .collect::<Result<_, String>>()?;
            Ok(Arc::new(array))
        }
        Ok(match self {
            // Free text is kept as decoded.
            FieldType::Text => Arc::new(texts.iter().copied().collect::<StringArray>()),
            FieldType::Enum(_) | FieldType::Json(_) => Arc::new(
                texts
                    .iter()
                    .map(|t| t.map(value).transpose())
                    .collect::<Result<StringArray, String>>()?,
            ),
            FieldType::Boolean => Arc::new(
                texts
                    .iter()
                    .map(|t| t.map(|t| value(t).map(|v| v == "true")).transpose())
                    .collect::<Result<BooleanArray, String>>()?,
            ),
            FieldType::Int => {
                primitive::<Int64Type>(texts, |t| value(t)?.parse().map_err(|_| bad(t)))?
            }
            FieldType::Double => {
                primitive::<Float64Type>(texts, |t| value(t)?.parse().map_err(|_| bad(t)))?
            }
            FieldType::Date => primitive::<Date32Type>(texts, |t| {
                Date32Type::parse(&value(t)?).ok_or_else(|| bad(t))
            })?,
        })
    }

    /// A value of this type named by `h`, for the simulation and the
    /// content-hash reference; `None` for text (the caller's words).
    pub fn example(&self, h: u64) -> Option<String> {
        Some(match self {
            FieldType::Text => return None,
            FieldType::Int => format!("{}", h % 2000),
            FieldType::Double => format!("{}.{}", h % 100, (h >> 8) % 10),
            FieldType::Boolean => (h & 1 == 1).to_string(),
            FieldType::Date => format!(
                "{}-{:02}-{:02}",
                1950 + h % 70,
                1 + (h >> 8) % 12,
                1 + (h >> 16) % 28
            ),
            FieldType::Enum(values) => values[(h % values.len() as u64) as usize].clone(),
            // Any JSON text: no simulation can say what the schema's would be.
            FieldType::Json(_) => "null".to_string(),
        })
    }

    /// The most tokens an answer of this type decodes under a call's
    /// `max_tokens`: the type's own bound where it is lower.
    pub fn token_bound(&self, max_tokens: u32) -> u32 {
        self.max_tokens().map_or(max_tokens, |t| t.min(max_tokens))
    }

    /// The most tokens an answer of this type can take (every token holds
    /// at least one byte), with the optional space; `None` for text and
    /// JSON (unbounded but by `max_tokens`).
    pub fn max_tokens(&self) -> Option<u32> {
        Some(match self {
            FieldType::Text | FieldType::Json(_) => return None,
            FieldType::Int => 20,
            FieldType::Double => 33,
            FieldType::Boolean => 6,
            FieldType::Date => 11,
            FieldType::Enum(values) => 1 + values.iter().map(|v| v.len()).max().unwrap_or(0) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};

    fn decl(s: &str) -> FieldDecl {
        FieldDecl::parse(s).unwrap()
    }

    #[test]
    fn declarations_read_and_spell_back() {
        assert_eq!(
            decl("year INT"),
            FieldDecl {
                name: "year".into(),
                ty: FieldType::Int
            }
        );
        assert_eq!(decl("  rating   DOUBLE ").ty, FieldType::Double);
        assert_eq!(decl("sequel BOOL").ty, FieldType::Boolean);
        assert_eq!(decl("released DATE").ty, FieldType::Date);
        // Lower case is a name, not a type: an untyped field as before.
        assert_eq!(
            decl("release date"),
            FieldDecl {
                name: "release date".into(),
                ty: FieldType::Text
            }
        );
        assert_eq!(
            decl("summary VARCHAR"),
            FieldDecl {
                name: "summary".into(),
                ty: FieldType::Text
            }
        );
        let genre = decl("genre ENUM(drama, 'comedy, dark', 'it''s')");
        assert_eq!(
            genre.ty,
            FieldType::Enum(vec!["drama".into(), "comedy, dark".into(), "it's".into()])
        );
        let json = decl(r#"r JSON {"type": "object", "properties": {"n": {"type": "integer"}}}"#);
        assert_eq!(
            json.ty,
            FieldType::Json(r#"{"type":"object","properties":{"n":{"type":"integer"}}}"#.into())
        );
        for d in [
            genre,
            json,
            decl("year INT"),
            decl("release date"),
            decl("x DATE"),
        ] {
            assert_eq!(decl(&d.to_string()), d, "{d}");
        }
        for (bad, says) in [
            ("g ENUM(a, b", "closing"),
            ("g ENUM()", "empty"),
            ("g ENUM(a, a)", "twice"),
            ("g ENUM('a)", "not closed"),
            ("g ENUM('a' b)", "unexpected"),
            ("g ENUM(' a')", "spaces around"),
            ("r JSON {\"type\": ", "cannot be read"),
            ("r JSON {\"type\": \"nope\"}", "the JSON schema"),
            ("x INT DATE", "type keyword"),
            ("x INT VARCHAR", "type keyword"),
            ("", "no name"),
        ] {
            let e = FieldDecl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn texts_are_read_as_their_types() {
        let ints = FieldType::Int
            .column(&[Some("42"), None, Some(" -7"), Some("0")])
            .unwrap();
        let ints = ints.as_primitive::<Int64Type>();
        assert_eq!(
            (ints.value(0), ints.is_null(1), ints.value(2)),
            (42, true, -7)
        );
        let doubles = FieldType::Double
            .column(&[Some("3.25"), Some(" 10")])
            .unwrap();
        assert_eq!(
            doubles.as_primitive::<Float64Type>().values().to_vec(),
            [3.25, 10.0]
        );
        let dates = FieldType::Date
            .column(&[Some("1970-01-02"), Some(" 2000-02-29")])
            .unwrap();
        assert_eq!(
            dates.as_primitive::<Date32Type>().values().to_vec(),
            [1, 11016]
        );
        let bools = FieldType::Boolean
            .column(&[Some(" true"), Some("false")])
            .unwrap();
        assert!(bools.as_boolean().value(0) && !bools.as_boolean().value(1));
        let genre = FieldType::Enum(vec!["drama".into(), "comedy".into()]);
        assert_eq!(
            genre
                .column(&[Some(" comedy")])
                .unwrap()
                .as_string::<i32>()
                .value(0),
            "comedy"
        );
        for (ty, bad) in [
            (FieldType::Int, "4.5"),
            (FieldType::Int, "1234567890123456789"),
            (FieldType::Double, "inf"),
            (FieldType::Double, "1e5"),
            (FieldType::Date, "1999-02-29"),
            (FieldType::Date, "1999-2-3"),
            (FieldType::Boolean, "yes"),
            (genre.clone(), "horror"),
        ] {
            let e = ty.column(&[Some(bad)]).unwrap_err();
            assert!(e.contains("is not a"), "{ty} {bad}: {e}");
        }
    }

    /// What the simulation answers is always of its type.
    #[test]
    fn examples_are_answers_of_their_type() {
        let types = [
            FieldType::Int,
            FieldType::Double,
            FieldType::Boolean,
            FieldType::Date,
            FieldType::Enum(vec!["a".into(), "b c".into()]),
        ];
        for ty in types {
            for h in (0..5000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) {
                let e = ty.example(h).unwrap();
                assert!(ty.accepts(&e), "{ty}: {e}");
                assert!(e.len() < ty.max_tokens().unwrap() as usize, "{ty}: {e}");
            }
        }
        assert_eq!(FieldType::Text.example(3), None);
    }
}
