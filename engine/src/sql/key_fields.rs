//! `ai_extract` fields whose answer is one of a column's keys:
//! `'drug FROM drugs.name: Which drug caused the reaction?'` (`... FROM
//! drugs.name OR NULL: ...` where the answer may be none), and
//! `ai_generate('FROM drugs.name', ...)`, one such answer. Before a
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
use crate::inference::field_type::{FieldType, OR_NULL};

/// The most distinct keys a key field may have.
pub const MAX_KEYS: usize = 1_000_000;

/// A key field's column: `(table, column)` as written.
pub type KeyColumn = (String, String);

/// The key columns the statement's key declarations name (after
/// [`super::spelling::normalize`], which makes `ai_extract` lists one
/// literal).
pub fn key_columns(statement: &mut DfStatement) -> Result<Vec<KeyColumn>> {
    let mut found: Vec<KeyColumn> = Vec::new();
    for_each_declaration(statement, &mut |decl| {
        if let Some((_, key, _)) = key_source(decl)?
            && !found.contains(&key)
        {
            found.push(key);
        }
        Ok(None)
    })?;
    Ok(found)
}

/// Rewrites every key declaration as an `ENUM` of its column's `keys`.
pub fn inline(statement: &mut DfStatement, keys: &HashMap<KeyColumn, Vec<String>>) -> Result<()> {
    for_each_declaration(statement, &mut |decl| {
        let Some((name, key, or_null)) = key_source(decl)? else {
            return Ok(None);
        };
        let values = keys.get(&key).expect("every key column was read");
        let ty = FieldType::Enum {
            values: values.clone(),
            or_null,
        };
        Ok(Some(format!("{name} {ty}")))
    })
}

/// The distinct keys read from a column (each as text), checked: at least
/// one, at most [`MAX_KEYS`], sorted.
pub fn checked_keys(key: &KeyColumn, values: BTreeSet<String>) -> Result<Vec<String>> {
    let (table, column) = key;
    let bad = |why: String| EngineError::Sql(format!("the field's keys {table}.{column} {why}"));
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

/// The name, `(table, column)` and `OR NULL` of a declaration `name FROM
/// table.column [OR NULL]` (a field's part before its `:`, or `answer
/// {type}` for `ai_generate`'s type).
fn key_source(decl: &str) -> Result<Option<(&str, KeyColumn, bool)>> {
    let Some((name, source)) = decl.split_once(" FROM ") else {
        return Ok(None);
    };
    let source = source.trim();
    let (source, or_null) = match source.strip_suffix(OR_NULL) {
        Some(source) => (source.trim_end(), true),
        None => (source, false),
    };
    match source.rsplit_once('.') {
        Some((table, column))
            if !name.trim().is_empty() && !table.is_empty() && !column.is_empty() =>
        {
            Ok(Some((
                name.trim(),
                (table.to_string(), column.to_string()),
                or_null,
            )))
        }
        _ => Err(EngineError::Sql(format!(
            "the key declaration {decl:?} must be 'name FROM table.column' (an ai_extract \
             field 'name FROM table.column: question', ai_generate's type 'FROM \
             table.column'), with OR NULL after it where none may be the answer"
        ))),
    }
}

/// Calls `f` on every declaration in an `ai_extract` list literal (a
/// field's part before its `:`) and on every `ai_generate` type literal (as
/// `answer {type}`); a `Some` it returns replaces the declaration.
fn for_each_declaration(
    statement: &mut DfStatement,
    f: &mut dyn FnMut(&str) -> Result<Option<String>>,
) -> Result<()> {
    let statement = match statement {
        DfStatement::Statement(s) => s.as_mut(),
        DfStatement::Explain(e) => return for_each_declaration(e.statement.as_mut(), f),
        _ => return Ok(()),
    };
    let flow = visit_expressions_mut(statement, |e| match declarations_of(e, f) {
        Ok(()) => ControlFlow::Continue(()),
        Err(err) => ControlFlow::Break(err),
    });
    match flow {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The name `ai_generate`'s type is declared under, for [`key_source`].
const TYPE_NAME: &str = "answer ";

fn declarations_of(e: &mut Expr, f: &mut dyn FnMut(&str) -> Result<Option<String>>) -> Result<()> {
    let Expr::Function(call) = e else {
        return Ok(());
    };
    let Some(function) =
        AiFunction::from_name(&call.name.to_string()).filter(|a| a.fields || a.returns_type)
    else {
        return Ok(());
    };
    let FunctionArguments::List(list) = &mut call.args else {
        return Ok(());
    };
    let at = if function.returns_type {
        0
    } else {
        function.leading() + 1
    };
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) = list.args.get_mut(at)
    else {
        return Ok(());
    };
    let Value::SingleQuotedString(literal) = &mut v.value else {
        return Ok(());
    };
    if function.returns_type {
        if let Some(new) = f(&format!("{TYPE_NAME}{literal}"))? {
            *literal = new[TYPE_NAME.len()..].to_string();
        }
        return Ok(());
    }
    let Ok(mut fields) = serde_json::from_str::<Vec<String>>(literal) else {
        return Ok(());
    };
    let mut changed = false;
    for field in &mut fields {
        let Some((decl, question)) = field.split_once(':') else {
            continue;
        };
        if let Some(new) = f(decl)? {
            *field = format!("{new}:{question}");
            changed = true;
        }
    }
    if changed {
        *literal = serde_json::to_string(&fields).expect("strings serialise");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_fields_name_their_columns_and_are_checked() {
        let drugs = || ("drugs".to_string(), "name".to_string());
        assert_eq!(
            key_source("drug FROM db.drugs.name").unwrap(),
            Some(("drug", ("db.drugs".into(), "name".into()), false))
        );
        assert_eq!(key_source("year INT").unwrap(), None);
        assert_eq!(
            key_source("drug FROM drugs.name OR NULL").unwrap(),
            Some(("drug", drugs(), true))
        );
        assert_eq!(
            key_source(&format!("{TYPE_NAME}FROM drugs.name")).unwrap(),
            Some(("answer", drugs(), false))
        );
        for bad in [
            "drug FROM drugs",
            "drug FROM drugs. OR NULL",
            " FROM drugs.name",
        ] {
            let e = key_source(bad).unwrap_err();
            assert!(e.to_string().contains("'name FROM table.column'"), "{e}");
        }
        let key = ("drugs".to_string(), "name".to_string());
        let e = checked_keys(&key, BTreeSet::new()).unwrap_err();
        assert!(e.to_string().contains("drugs.name are empty"), "{e}");
        let e = checked_keys(&key, [" x".to_string()].into()).unwrap_err();
        assert!(e.to_string().contains("spaces around"), "{e}");
        let sorted = checked_keys(&key, ["b".to_string(), "a".to_string()].into()).unwrap();
        assert_eq!(sorted, ["a", "b"]);
    }
}
