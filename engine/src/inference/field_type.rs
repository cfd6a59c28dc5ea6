//! The SQL types a generated answer can be asked in. A field of `ai_extract`
//! is declared `name` (text, as before) or `name TYPE`: `year INT`, `rating
//! DOUBLE`, `released DATE`, `sequel BOOLEAN`, `genre ENUM(drama, comedy)`,
//! `cast ARRAY<VARCHAR>`, `film STRUCT<title VARCHAR, year INT>` (BigQuery's
//! `INT64`, `FLOAT64`, `BOOL` and `STRING` read too). A struct or an array
//! is decoded as one JSON value under the JSON schema of its type and read
//! into Arrow by arrow-json.
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
    ArrowPrimitiveType, DataType, Date32Type, Field, Float64Type, Int64Type,
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
    /// `ENUM(a, b, ...)`: one of the listed values, as text; `ENUM(...) OR
    /// NULL` also lets the model answer none (NULL) where its best token
    /// leaves the values' spellings.
    Enum {
        /// The values, as declared.
        values: Vec<String>,
        /// Whether no value (NULL) is an answer too.
        or_null: bool,
    },
    /// `JSON {schema}`: a JSON text valid under the schema (compact, as
    /// serde_json writes it), as text.
    Json(String),
    /// `STRUCT<name TYPE, ...>`: a JSON object with every field, read as a
    /// struct. A field's name is letters, digits and `_`.
    Struct(Vec<FieldDecl>),
    /// `ARRAY<TYPE>`: a JSON array of values of the type, read as a list.
    Array(Box<FieldType>),
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
            FieldType::Enum { values, or_null } => {
                let quoted: Vec<String> = values
                    .iter()
                    .map(|v| format!("'{}'", v.replace('\'', "''")))
                    .collect();
                write!(f, "ENUM({})", quoted.join(", "))?;
                match or_null {
                    true => f.write_str(OR_NULL),
                    false => Ok(()),
                }
            }
            FieldType::Json(schema) => write!(f, "JSON {schema}"),
            FieldType::Struct(fields) => {
                let spelled: Vec<String> = fields
                    .iter()
                    .map(|d| format!("{} {}", d.name, d.ty))
                    .collect();
                write!(f, "STRUCT<{}>", spelled.join(", "))
            }
            FieldType::Array(item) => write!(f, "ARRAY<{item}>"),
        }
    }
}

/// Where each type of a declaration begins (` STRUCT<` and so on): the first
/// one found is the declaration's type, whatever its body holds.
const TYPE_OPENERS: [&str; 4] = [" JSON {", " ENUM(", " STRUCT<", " ARRAY<"];

/// The most STRUCT and ARRAY levels a type nests (BigQuery's limit): deeper
/// types would recurse without bound in every reading of them.
const MOST_NESTED: usize = 15;

/// `decl` split into its name and type: text when it ends in no type.
fn split_type(decl: &str) -> Result<(&str, FieldType), String> {
    split_type_within(decl, 0)
}

/// [`split_type`] of a declaration inside `depth` STRUCT or ARRAY levels.
fn split_type_within(decl: &str, depth: usize) -> Result<(&str, FieldType), String> {
    let opener = TYPE_OPENERS
        .iter()
        .filter_map(|o| Some((decl.find(o)?, *o)))
        .min();
    if let Some((open, o @ (" STRUCT<" | " ARRAY<"))) = opener {
        if depth >= MOST_NESTED {
            return Err(format!(
                "STRUCT and ARRAY types nest at most {MOST_NESTED} levels deep"
            ));
        }
        let Some(inner) = decl[open + o.len()..].strip_suffix('>') else {
            return Err(format!(
                "{decl:?}: {}< has no closing '>' at the end",
                o.trim_matches([' ', '<'])
            ));
        };
        // The whole declaration names the error once, at the top.
        let named = |e: String| match depth {
            0 => format!("{decl:?}: {e}"),
            _ => e,
        };
        let ty = match o {
            " STRUCT<" => FieldType::Struct(struct_fields(inner, depth + 1).map_err(named)?),
            _ => FieldType::Array(Box::new(
                nested_type(inner.trim(), depth + 1).map_err(named)?,
            )),
        };
        // The whole type's schema, once.
        if depth == 0 {
            crate::inference::grammar::check_json_schema(&ty.json_schema())
                .map_err(|e| format!("{decl:?}: {e}"))?;
        }
        return Ok((decl[..open].trim_end(), ty));
    }
    if let Some((at, " JSON {")) = opener {
        let text = &decl[at + " JSON ".len()..];
        let schema: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("{decl:?}: the JSON schema cannot be read: {e}"))?;
        crate::inference::grammar::check_json_schema(&schema)
            .map_err(|e| format!("{decl:?}: {e}"))?;
        return Ok((decl[..at].trim_end(), FieldType::Json(schema.to_string())));
    }
    if let Some((open, " ENUM(")) = opener {
        let (body, or_null) = match decl.strip_suffix(OR_NULL) {
            Some(body) => (body, true),
            None => (decl, false),
        };
        let Some(inner) = body[open + " ENUM(".len()..].strip_suffix(')') else {
            return Err(format!(
                "{decl:?}: ENUM( has no closing ')' at the end (or before {:?})",
                OR_NULL.trim_start()
            ));
        };
        let values = enum_values(inner).map_err(|e| format!("{decl:?}: {e}"))?;
        return Ok((decl[..open].trim_end(), FieldType::Enum { values, or_null }));
    }
    if decl.ends_with(OR_NULL) {
        return Err(format!(
            "{decl:?}: OR NULL follows a set of values (ENUM(...) or FROM table.column) only"
        ));
    }
    let Some((name, word)) = decl.rsplit_once(char::is_whitespace) else {
        return Ok((decl, FieldType::Text));
    };
    let ty = match word {
        "INT" | "INTEGER" | "BIGINT" | "INT64" => FieldType::Int,
        "DOUBLE" | "FLOAT" | "REAL" | "FLOAT64" => FieldType::Double,
        "BOOLEAN" | "BOOL" => FieldType::Boolean,
        "DATE" => FieldType::Date,
        "VARCHAR" | "TEXT" | "STRING" => return Ok((name.trim_end(), FieldType::Text)),
        _ => return Ok((decl, FieldType::Text)),
    };
    Ok((name.trim_end(), ty))
}

/// The fields of `STRUCT<...>` (at `depth` levels): `name TYPE` each,
/// comma-separated, at least one, names of letters, digits and `_`, none
/// twice.
fn struct_fields(inner: &str, depth: usize) -> Result<Vec<FieldDecl>, String> {
    let mut fields: Vec<FieldDecl> = Vec::new();
    for spelled in top_level_items(inner)? {
        let spelled = spelled.trim();
        let (name, ty) = spelled
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("the STRUCT field {spelled:?} has no type"))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "the STRUCT field name {name:?} is not letters, digits and _"
            ));
        }
        if fields.iter().any(|d| d.name.eq_ignore_ascii_case(name)) {
            return Err(format!("the STRUCT field {name:?} comes twice"));
        }
        let ty =
            nested_type(ty.trim(), depth).map_err(|e| format!("the STRUCT field {name}: {e}"))?;
        fields.push(FieldDecl {
            name: name.to_string(),
            ty,
        });
    }
    if fields.is_empty() {
        return Err("STRUCT<> has no field".into());
    }
    Ok(fields)
}

/// The type spelled `spelled` inside `depth` STRUCT or ARRAY levels: any
/// type but JSON (arrow-json reads no JSON value into text).
fn nested_type(spelled: &str, depth: usize) -> Result<FieldType, String> {
    let unknown = || format!("{spelled:?} is not a type");
    if spelled.is_empty() {
        return Err(unknown());
    }
    let decl = format!("item {spelled}");
    let (name, ty) = split_type_within(&decl, depth)?;
    // An unknown word stays in the name (`item WORD`), as for any text field.
    match ty {
        _ if name != "item" => Err(unknown()),
        FieldType::Json(_) => Err("JSON inside a STRUCT or an ARRAY is not read; \
             spell its fields as a STRUCT"
            .into()),
        ty => Ok(ty),
    }
}

/// `inner` cut at its commas outside brackets and quotes.
fn top_level_items(inner: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0);
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '<' | '(' | '{' | '[') => depth += 1,
            (None, '>' | ')' | '}' | ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced {c:?} in {inner:?}"));
        }
    }
    if quote.is_some() || depth != 0 {
        return Err(format!("unclosed quote or bracket in {inner:?}"));
    }
    items.push(&inner[start..]);
    Ok(items)
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

/// What follows a set of values that may be answered by none.
pub const OR_NULL: &str = " OR NULL";

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
            FieldType::Text | FieldType::Enum { .. } | FieldType::Json(_) => DataType::Utf8,
            FieldType::Int => DataType::Int64,
            FieldType::Double => DataType::Float64,
            FieldType::Boolean => DataType::Boolean,
            FieldType::Date => DataType::Date32,
            FieldType::Struct(fields) => DataType::Struct(
                fields
                    .iter()
                    .map(|d| Field::new(&d.name, d.ty.data_type(), true))
                    .collect(),
            ),
            FieldType::Array(item) => {
                DataType::List(Arc::new(Field::new_list_field(item.data_type(), true)))
            }
        }
    }

    /// The JSON schema of a value of this type as a STRUCT or an ARRAY
    /// answer holds it (all of a struct's fields required, no other).
    pub fn json_schema(&self) -> serde_json::Value {
        use serde_json::json;
        // INT's 18 digits, so that every integer read is an i64.
        const MOST: i64 = 999_999_999_999_999_999;
        match self {
            FieldType::Text => json!({"type": "string"}),
            FieldType::Int => json!({"type": "integer", "minimum": -MOST, "maximum": MOST}),
            FieldType::Double => json!({"type": "number"}),
            FieldType::Boolean => json!({"type": "boolean"}),
            FieldType::Date => json!({"type": "string", "pattern": format!("^({DATE_REGEX})$")}),
            FieldType::Enum { values, or_null } => {
                let mut values: Vec<serde_json::Value> = values.iter().map(|v| json!(v)).collect();
                if *or_null {
                    values.push(serde_json::Value::Null);
                }
                json!({ "enum": values })
            }
            FieldType::Json(schema) => serde_json::from_str(schema).unwrap_or(json!({})),
            FieldType::Struct(fields) => json!({
                "type": "object",
                "properties": fields
                    .iter()
                    .map(|d| (d.name.clone(), d.ty.json_schema()))
                    .collect::<serde_json::Map<_, _>>(),
                "required": fields.iter().map(|d| d.name.clone()).collect::<Vec<_>>(),
                "additionalProperties": false,
            }),
            FieldType::Array(item) => json!({"type": "array", "items": item.json_schema()}),
        }
    }

    /// Whether answers are one JSON value read into Arrow (a STRUCT or an
    /// ARRAY).
    pub fn is_nested(&self) -> bool {
        matches!(self, FieldType::Struct(_) | FieldType::Array(_))
    }

    /// The regular expression every decoded text matches whole (an optional
    /// leading space, as a model's first token often carries one); `None`
    /// for free text, for a set of values, which the decoder follows by a
    /// token trie instead ([`crate::inference::key_trie`]), and for JSON,
    /// whose grammar is its schema's.
    pub fn regex(&self) -> Option<String> {
        let body = match self {
            FieldType::Text
            | FieldType::Enum { .. }
            | FieldType::Json(_)
            | FieldType::Struct(_)
            | FieldType::Array(_) => return None,
            FieldType::Int => "-?(0|[1-9][0-9]{0,17})".to_string(),
            FieldType::Double => "-?(0|[1-9][0-9]{0,14})(\\.[0-9]{1,15})?".to_string(),
            FieldType::Boolean => "(true|false)".to_string(),
            FieldType::Date => DATE_REGEX.to_string(),
        };
        Some(format!(" ?({body})"))
    }

    /// Whether `text` is an answer of this type ([`Self::regex`]'s language);
    /// the empty text is an `ENUM(...) OR NULL`'s none.
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
            FieldType::Enum { values, or_null } => {
                values.iter().any(|v| v == value) || *or_null && text.is_empty()
            }
            // Parsed, not checked against the schema: the decoder's mask
            // keeps the model's text inside it.
            FieldType::Json(_) => serde_json::from_str::<serde_json::Value>(value).is_ok(),
            FieldType::Struct(_) | FieldType::Array(_) => self.nested_column(&[Some(text)]).is_ok(),
        }
    }

    /// The column of STRUCT or ARRAY answers, each one JSON value read by
    /// arrow-json; the error names the first text that is not one.
    fn nested_column(&self, texts: &[Option<&str>]) -> Result<ArrayRef, String> {
        use datafusion::arrow::datatypes::Schema;
        use datafusion::arrow::json::ReaderBuilder;
        let schema = Arc::new(Schema::new(vec![Field::new("v", self.data_type(), true)]));
        let bad = |t: &str, why: String| format!("{t:?} is not a {self} answer: {why}");
        let read = |lines: &str, rows: usize| -> Result<ArrayRef, String> {
            let mut decoder = ReaderBuilder::new(schema.clone())
                .with_batch_size(rows.max(1))
                .with_strict_mode(true)
                .build_decoder()
                .map_err(|e| e.to_string())?;
            decoder
                .decode(lines.as_bytes())
                .map_err(|e| e.to_string())?;
            let batch = decoder.flush().map_err(|e| e.to_string())?;
            match batch {
                Some(b) if b.num_rows() == rows => Ok(b.column(0).clone()),
                _ => Err(format!("{rows} values read as another count")),
            }
        };
        // Each text is parsed on its own and written back, so that no text
        // can reach into another's line.
        let mut lines = Vec::with_capacity(texts.len());
        for t in texts {
            let value = match t {
                None => serde_json::Value::Null,
                Some(t) => serde_json::from_str::<serde_json::Value>(t)
                    .map_err(|e| bad(t, e.to_string()))?,
            };
            if t.is_some() && value.is_null() {
                return Err(bad(t.unwrap_or_default(), "null".into()));
            }
            lines.push(serde_json::json!({ "v": value }).to_string());
        }
        read(&lines.join("\n"), texts.len()).map_err(|whole| {
            // Name the first text arrow-json refuses on its own.
            texts
                .iter()
                .zip(&lines)
                .find_map(|(t, line)| Some(bad((*t)?, read(line, 1).err()?)))
                .unwrap_or(whole)
        })
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
            FieldType::Enum { .. } | FieldType::Json(_) => {
                // An `OR NULL` set's none is the empty text.
                let none = |t: &&str| {
                    matches!(self, FieldType::Enum { or_null: true, .. }) && t.is_empty()
                };
                Arc::new(
                    texts
                        .iter()
                        .map(|t| t.filter(|t| !none(t)).map(value).transpose())
                        .collect::<Result<StringArray, String>>()?,
                )
            }
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
            FieldType::Struct(_) | FieldType::Array(_) => self.nested_column(texts)?,
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
            FieldType::Enum { values, .. } => values[(h % values.len() as u64) as usize].clone(),
            // Any JSON text: no simulation can say what the schema's would be.
            FieldType::Json(_) => "null".to_string(),
            FieldType::Struct(_) | FieldType::Array(_) => self.example_json(h).to_string(),
        })
    }

    /// [`Self::example`] as the JSON value a STRUCT or an ARRAY holds.
    fn example_json(&self, h: u64) -> serde_json::Value {
        use serde_json::Value;
        let next = |i: usize| {
            h.rotate_left(7 * i as u32 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        match self {
            FieldType::Text => Value::String(format!("text {}", h % 1000)),
            FieldType::Int => Value::from(h % 2000),
            FieldType::Double => Value::from((h % 1000) as f64 / 10.0),
            FieldType::Boolean => Value::Bool(h & 1 == 1),
            FieldType::Json(_) => Value::Null,
            FieldType::Struct(fields) => Value::Object(
                fields
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (d.name.clone(), d.ty.example_json(next(i))))
                    .collect(),
            ),
            FieldType::Array(item) => Value::Array(
                (0..h % 3)
                    .map(|i| item.example_json(next(i as usize)))
                    .collect(),
            ),
            FieldType::Date | FieldType::Enum { .. } => {
                Value::String(self.example(h).expect("a date or a value"))
            }
        }
    }

    /// The most tokens an answer of this type decodes under a call's
    /// `max_tokens`: the type's own bound where it is lower.
    pub fn token_bound(&self, max_tokens: u32) -> u32 {
        self.max_tokens().map_or(max_tokens, |t| t.min(max_tokens))
    }

    /// The most tokens an answer of this type can take (every token holds
    /// at least one byte), with the optional space; `None` for text, JSON,
    /// structs and arrays (unbounded but by `max_tokens`).
    pub fn max_tokens(&self) -> Option<u32> {
        Some(match self {
            FieldType::Text | FieldType::Json(_) | FieldType::Struct(_) | FieldType::Array(_) => {
                return None;
            }
            FieldType::Int => 20,
            FieldType::Double => 33,
            FieldType::Boolean => 6,
            FieldType::Date => 11,
            FieldType::Enum { values, .. } => {
                1 + values.iter().map(|v| v.len()).max().unwrap_or(0) as u32
            }
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
            FieldType::Enum {
                values: vec!["drama".into(), "comedy, dark".into(), "it's".into()],
                or_null: false
            }
        );
        let maybe = decl("g ENUM(a, 'b c') OR NULL");
        assert_eq!(
            maybe.ty,
            FieldType::Enum {
                values: vec!["a".into(), "b c".into()],
                or_null: true
            }
        );
        let json = decl(r#"r JSON {"type": "object", "properties": {"n": {"type": "integer"}}}"#);
        assert_eq!(
            json.ty,
            FieldType::Json(r#"{"type":"object","properties":{"n":{"type":"integer"}}}"#.into())
        );
        for d in [
            genre,
            maybe,
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
            ("g ENUM(a) OR NULL OR NULL", "closing"),
            ("x INT OR NULL", "follows a set of values"),
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
        let genre = FieldType::Enum {
            values: vec!["drama".into(), "comedy".into()],
            or_null: false,
        };
        // An OR NULL set reads its none (the empty text) as NULL.
        let maybe = FieldType::Enum {
            values: vec!["drama".into()],
            or_null: true,
        };
        let read = maybe.column(&[Some(" drama"), Some(""), None]).unwrap();
        let read = read.as_string::<i32>();
        assert_eq!(
            (read.value(0), read.is_null(1), read.is_null(2)),
            ("drama", true, true)
        );
        assert!(maybe.accepts("") && !genre.accepts(""));
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
            (genre.clone(), ""),
            (maybe.clone(), "dra"),
            (FieldType::Json("{}".into()), ""),
        ] {
            let e = ty.column(&[Some(bad)]).unwrap_err();
            assert!(e.contains("is not a"), "{ty} {bad}: {e}");
        }
    }

    /// STRUCT and ARRAY declarations read, spell back and read their JSON
    /// answers into Arrow with their fields' types; a text that is not one
    /// is an error naming it.
    #[test]
    fn structs_and_arrays_read_as_arrow_values() {
        let film = decl(
            "film STRUCT<title STRING, year INT64, score FLOAT64, seen BOOL, \
             on DATE, g ENUM(drama, 'x, y') OR NULL, cast ARRAY<VARCHAR>, \
             place STRUCT<city VARCHAR>>",
        );
        assert_eq!(
            film.to_string(),
            "film STRUCT<title VARCHAR, year INT, score DOUBLE, seen BOOLEAN, on DATE, \
             g ENUM('drama', 'x, y') OR NULL, cast ARRAY<VARCHAR>, place STRUCT<city VARCHAR>>"
        );
        assert_eq!(decl(&film.to_string()), film);
        let DataType::Struct(fields) = film.ty.data_type() else {
            panic!("{film}")
        };
        let types: Vec<String> = fields.iter().map(|f| f.data_type().to_string()).collect();
        assert_eq!(
            types[..6],
            ["Utf8", "Int64", "Float64", "Boolean", "Date32", "Utf8"]
        );
        assert!(matches!(fields[6].data_type(), DataType::List(_)));
        let answer = r#"{"title":"Up","year":2009,"score":8.5,"seen":true,"on":"2000-02-29","g":null,"cast":["a","b"],"place":{"city":"Paris"}}"#;
        assert!(film.ty.accepts(answer));
        let column = film.ty.column(&[Some(answer), None]).unwrap();
        let column = column.as_struct();
        assert!(column.is_valid(0) && column.is_null(1));
        assert_eq!(column.column(1).as_primitive::<Int64Type>().value(0), 2009);
        assert_eq!(
            column.column(4).as_primitive::<Date32Type>().value(0),
            11016
        );
        assert!(column.column(5).is_null(0));
        assert_eq!(column.column(6).as_list::<i32>().value(0).len(), 2);
        let list = FieldType::Array(Box::new(FieldType::Int));
        let ints = list.column(&[Some(" [1, -2]"), Some("[]")]).unwrap();
        assert_eq!(ints.as_list::<i32>().value(0).len(), 2);
        for bad in [
            r#"{"title":"Up","year":"x"}"#,
            r#"{"title":1}},{"v":2"#,
            "null",
            "",
            r#"{"nope":1}"#,
        ] {
            let e = film.ty.column(&[Some(answer), Some(bad)]).unwrap_err();
            assert!(
                e.contains("is not a STRUCT<") && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
            assert!(!film.ty.accepts(bad), "{bad}");
        }
        for (bad, says) in [
            ("x STRUCT<a INT", "no closing '>'"),
            ("x STRUCT<>", "has no type"),
            ("x STRUCT<a-b INT>", "not letters, digits and _"),
            ("x STRUCT<a INT, A DATE>", "comes twice"),
            ("x ARRAY<>", "is not a type"),
            ("x ARRAY<WHAT>", "is not a type"),
            ("x ARRAY<JSON {}>", "JSON inside"),
        ] {
            let e = FieldDecl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // Nesting is bounded: 15 levels read, 16 and 100,000 do not (no
        // recursion without bound).
        let nested =
            |levels: usize| format!("x {}INT{}", "ARRAY<".repeat(levels), ">".repeat(levels));
        assert!(FieldDecl::parse(&nested(15)).is_ok());
        for (bad, says) in [
            (nested(16), "at most 15 levels"),
            (nested(100_000), "at most 15 levels"),
        ] {
            let e = FieldDecl::parse(&bad).unwrap_err();
            assert!(e.contains(says) && e.len() < 2 * bad.len() + 200, "{e}");
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
            FieldType::Enum {
                values: vec!["a".into(), "b c".into()],
                or_null: true,
            },
        ];
        for ty in types {
            for h in (0..5000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) {
                let e = ty.example(h).unwrap();
                assert!(ty.accepts(&e), "{ty}: {e}");
                assert!(e.len() < ty.max_tokens().unwrap() as usize, "{ty}: {e}");
            }
        }
        let nested =
            decl("x STRUCT<a VARCHAR, b ARRAY<STRUCT<c DATE, d DOUBLE>>, e ENUM(p, q)>").ty;
        for h in (0..500u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) {
            let e = nested.example(h).unwrap();
            assert!(nested.accepts(&e), "{e}");
        }
        assert_eq!(FieldType::Text.example(3), None);
    }
}
