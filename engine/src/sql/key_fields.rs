//! `ai_extract` fields whose answer is one of a column's keys:
//! `'drug FROM drugs.name: Which drug caused the reaction?'`. Before a
//! statement is planned, each such declaration becomes `drug ENUM(...)` over
//! the column's distinct non-NULL values (read once per statement, in
//! sorted order), so that the decoder follows their token trie
//! ([`crate::inference::key_trie`]): one constrained decode per row, whose
//! answer is always a key, instead of one yes/no question per (row, key)
//! pair. The plan, its Substrait form and the answer cache then carry the
//! keys themselves.

use std::collections::{BTreeSet, HashMap};
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Value, visit_expressions_mut,
};

use crate::error::{EngineError, Result};
use crate::exec::ai_functions::AiFunction;
use crate::inference::field_type::FieldType;

/// The most distinct keys a key field may have.
pub const MAX_KEYS: usize = 1_000_000;

/// A key field's column: `(table, column)` as written.
pub type KeyColumn = (String, String);

/// The key columns the statement's `ai_extract` fields name (after
/// [`super::spelling::normalize`], which makes their lists one literal).
pub fn key_columns(statement: &mut DfStatement) -> Result<Vec<KeyColumn>> {
    let mut found: Vec<KeyColumn> = Vec::new();
    for_each_field(statement, &mut |field| {
        if let Some(key) = key_column(field)?
            && !found.contains(&key)
        {
            found.push(key);
        }
        Ok(None)
    })?;
    Ok(found)
}

/// Rewrites every key field as an `ENUM` of its column's `keys`.
pub fn inline(statement: &mut DfStatement, keys: &HashMap<KeyColumn, Vec<String>>) -> Result<()> {
    for_each_field(statement, &mut |field| {
        let Some(key) = key_column(field)? else {
            return Ok(None);
        };
        let (decl, question) = field.split_once(':').expect("a key field has a question");
        let (name, _) = decl.split_once(" FROM ").expect("a key field has FROM");
        let values = keys.get(&key).expect("every key column was read");
        Ok(Some(format!(
            "{} {}:{question}",
            name.trim(),
            FieldType::Enum(values.clone())
        )))
    })
}

/// The distinct keys read from a column (each as text), checked: at least
/// one, at most [`MAX_KEYS`], sorted.
pub fn checked_keys(key: &KeyColumn, values: BTreeSet<String>) -> Result<Vec<String>> {
    let (table, column) = key;
    let bad = |why: String| {
        EngineError::Sql(format!(
            "ai_extract: the field's keys {table}.{column} {why}"
        ))
    };
    if values.is_empty() {
        return Err(bad(
            "are empty (no value that is not NULL): no answer could be given".into(),
        ));
    }
    if values.len() > MAX_KEYS {
        return Err(bad(format!("are more than {MAX_KEYS} distinct values")));
    }
    if let Some(v) = values
        .iter()
        .find(|v| v.is_empty() || v.trim() != v.as_str())
    {
        return Err(bad(format!(
            "hold {v:?}, empty or with spaces around it; trim the column (a view with trim(...))"
        )));
    }
    Ok(values.into_iter().collect())
}

/// `(table, column)` of a field declared `name FROM table.column: ...`.
fn key_column(field: &str) -> Result<Option<KeyColumn>> {
    let Some((decl, _)) = field.split_once(':') else {
        return Ok(None);
    };
    let Some((name, source)) = decl.split_once(" FROM ") else {
        return Ok(None);
    };
    let source = source.trim();
    match source.rsplit_once('.') {
        Some((table, column))
            if !name.trim().is_empty() && !table.is_empty() && !column.is_empty() =>
        {
            Ok(Some((table.to_string(), column.to_string())))
        }
        _ => Err(EngineError::Sql(format!(
            "ai_extract: the field {field:?} must be 'name FROM table.column: question'"
        ))),
    }
}

/// Calls `f` on every field of every `ai_extract` list literal; a `Some`
/// it returns replaces the field.
fn for_each_field(
    statement: &mut DfStatement,
    f: &mut dyn FnMut(&str) -> Result<Option<String>>,
) -> Result<()> {
    let statement = match statement {
        DfStatement::Statement(s) => s.as_mut(),
        DfStatement::Explain(e) => return for_each_field(e.statement.as_mut(), f),
        _ => return Ok(()),
    };
    let flow = visit_expressions_mut(statement, |e| match fields_of(e, f) {
        Ok(()) => ControlFlow::Continue(()),
        Err(err) => ControlFlow::Break(err),
    });
    match flow {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

fn fields_of(e: &mut Expr, f: &mut dyn FnMut(&str) -> Result<Option<String>>) -> Result<()> {
    let Expr::Function(call) = e else {
        return Ok(());
    };
    let Some(function) = AiFunction::from_name(&call.name.to_string()).filter(|a| a.fields) else {
        return Ok(());
    };
    let FunctionArguments::List(list) = &mut call.args else {
        return Ok(());
    };
    let at = function.leading() + 1;
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) = list.args.get_mut(at)
    else {
        return Ok(());
    };
    let Value::SingleQuotedString(json) = &mut v.value else {
        return Ok(());
    };
    let Ok(mut fields) = serde_json::from_str::<Vec<String>>(json) else {
        return Ok(());
    };
    let mut changed = false;
    for field in &mut fields {
        if let Some(new) = f(field)? {
            *field = new;
            changed = true;
        }
    }
    if changed {
        *json = serde_json::to_string(&fields).expect("strings serialise");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_fields_name_their_columns_and_are_checked() {
        assert_eq!(
            key_column("drug FROM db.drugs.name: Which drug?").unwrap(),
            Some(("db.drugs".into(), "name".into()))
        );
        assert_eq!(key_column("year INT: Which year?").unwrap(), None);
        let e = key_column("drug FROM drugs: Which?").unwrap_err();
        assert!(
            e.to_string().contains("'name FROM table.column: question'"),
            "{e}"
        );
        let key = ("drugs".to_string(), "name".to_string());
        let e = checked_keys(&key, BTreeSet::new()).unwrap_err();
        assert!(e.to_string().contains("drugs.name are empty"), "{e}");
        let e = checked_keys(&key, [" x".to_string()].into()).unwrap_err();
        assert!(e.to_string().contains("spaces around"), "{e}");
        let sorted = checked_keys(&key, ["b".to_string(), "a".to_string()].into()).unwrap();
        assert_eq!(sorted, ["a", "b"]);
    }
}
