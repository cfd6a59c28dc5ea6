//! Functions whose one call can make a value of any size, bounded by the
//! query's `--memory-limit`: `repeat`, `lpad`, `rpad`, `array_repeat`, and
//! `range`/`generate_series` as list values (what `unnest` then spreads).
//!
//! One call of these allocates its whole result at once, before any pool
//! sees it: `SELECT repeat('x', 2000000000)` and `unnest(generate_series(1,
//! 400000000))` aborted the process when the allocation failed. Each is
//! DataFusion's own function, registered again behind [`SizeChecked`], which
//! works out from the arguments how many bytes the result takes and refuses
//! a call over a quarter of the limit before it runs: a value is copied on
//! its way to the result (a scalar made an array, an output batch, the
//! result rows), and a 1.9 GB `repeat` at a 2 GB limit took 6 GB.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{Result as DfResult, exec_err, human_readable_size};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How a function's result is sized from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ResultBytes {
    Repeat,
    Pad,
    ArrayRepeat,
    Series,
}

impl ResultBytes {
    /// How many bytes a call's result takes at most, from its arguments and
    /// row count; `None` where it cannot be told (the call then runs
    /// unchecked).
    fn of(self, args: &[ColumnarValue], rows: usize) -> Option<u128> {
        match self {
            Self::Repeat => repeat_bytes(args, rows),
            Self::Pad => pad_bytes(args, rows),
            Self::ArrayRepeat => array_repeat_bytes(args, rows),
            Self::Series => series_bytes(args, rows),
        }
    }
}

/// Registers the size-checked versions of DataFusion's unbounded functions
/// in `ctx`, refusing a call whose result passes a quarter of `limit` bytes.
pub fn register(ctx: &SessionContext, limit: usize) {
    let checked: [(&str, ResultBytes); 6] = [
        ("repeat", ResultBytes::Repeat),
        ("lpad", ResultBytes::Pad),
        ("rpad", ResultBytes::Pad),
        ("array_repeat", ResultBytes::ArrayRepeat),
        ("range", ResultBytes::Series),
        ("generate_series", ResultBytes::Series),
    ];
    let state = ctx.state();
    for (name, result_bytes) in checked {
        // A build without the function has nothing to bound.
        if let Some(inner) = state.scalar_functions().get(name) {
            ctx.register_udf(ScalarUDF::new_from_impl(SizeChecked {
                inner: inner.clone(),
                limit,
                result_bytes,
            }));
        }
    }
}

/// A DataFusion function whose result is sized before it is made.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SizeChecked {
    /// DataFusion's function.
    inner: Arc<ScalarUDF>,
    /// `--memory-limit`: no one result may take more than a quarter of it.
    limit: usize,
    /// The result's size from the call's arguments.
    result_bytes: ResultBytes,
}

impl ScalarUDFImpl for SizeChecked {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> DfResult<String> {
        self.inner.inner().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn is_strict(&self) -> bool {
        self.inner.inner().is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        if let Some(bytes) = self.result_bytes.of(&args.args, args.number_rows)
            && bytes > (self.limit / 4) as u128
        {
            return exec_err!(
                "{}: the result would take {} ({} rows), more than a quarter of --memory-limit {} \
                 (a value is copied on its way to the result)",
                self.name(),
                human_readable_size(usize::try_from(bytes).unwrap_or(usize::MAX)),
                args.number_rows,
                human_readable_size(self.limit)
            );
        }
        self.inner.invoke_with_args(args)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> DfResult<ExprSimplifyResult> {
        self.inner.simplify(args, info)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> DfResult<SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> DfResult<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// Argument `i` of a call as one array of `rows` values, or `None` when it is
/// missing.
fn column(args: &[ColumnarValue], i: usize, rows: usize) -> Option<ArrayRef> {
    args.get(i)?.to_array(rows.max(1)).ok()
}

/// Each row's byte length of a text argument (0 for NULL), `None` if not text.
fn text_lengths(array: &dyn Array) -> Option<Vec<u128>> {
    let lengths: Vec<u128> = match array.data_type() {
        DataType::Utf8 => array
            .as_string::<i32>()
            .iter()
            .map(|s| s.map_or(0, str::len) as u128)
            .collect(),
        DataType::LargeUtf8 => array
            .as_string::<i64>()
            .iter()
            .map(|s| s.map_or(0, str::len) as u128)
            .collect(),
        DataType::Utf8View => array
            .as_string_view()
            .iter()
            .map(|s| s.map_or(0, str::len) as u128)
            .collect(),
        _ => return None,
    };
    Some(lengths)
}

/// Each row's value of an integer argument (negative and NULL as 0), `None`
/// if it is not Int64 (the functions' signatures coerce counts to Int64).
fn counts(array: &dyn Array) -> Option<Vec<u128>> {
    Some(ints(array)?.into_iter().map(|n| n.max(0) as u128).collect())
}

/// `repeat(text, n)`: each row's text length times its count.
fn repeat_bytes(args: &[ColumnarValue], rows: usize) -> Option<u128> {
    let text = text_lengths(column(args, 0, rows)?.as_ref())?;
    let n = counts(column(args, 1, rows)?.as_ref())?;
    Some(text.iter().zip(&n).map(|(t, n)| t.saturating_mul(*n)).sum())
}

/// `lpad`/`rpad(text, n [, fill])`: `n` characters a row, four bytes each at
/// most.
fn pad_bytes(args: &[ColumnarValue], rows: usize) -> Option<u128> {
    let n = counts(column(args, 1, rows)?.as_ref())?;
    Some(n.iter().map(|n| n.saturating_mul(4)).sum())
}

/// `array_repeat(value, n)`: each row's count times the value's share of its
/// array's memory (at least 8 bytes).
fn array_repeat_bytes(args: &[ColumnarValue], rows: usize) -> Option<u128> {
    let value = column(args, 0, rows)?;
    let n = counts(column(args, 1, rows)?.as_ref())?;
    let each = (value.get_array_memory_size() / value.len().max(1)).max(8) as u128;
    Some(n.iter().map(|n| n.saturating_mul(each)).sum())
}

/// `range`/`generate_series(start, stop [, step])` over integers: eight bytes
/// an element (`range(stop)` counts from 0); other kinds run unchecked.
fn series_bytes(args: &[ColumnarValue], rows: usize) -> Option<u128> {
    let arg = |i| ints(column(args, i, rows)?.as_ref());
    let (start, stop, step) = match args.len() {
        1 => (vec![0; rows.max(1)], arg(0)?, vec![1; rows.max(1)]),
        2 => (arg(0)?, arg(1)?, vec![1; rows.max(1)]),
        _ => (arg(0)?, arg(1)?, arg(2)?),
    };
    let elements = start.iter().zip(&stop).zip(&step).map(|((a, b), s)| {
        if *s == 0 {
            return 0; // DataFusion refuses a zero step itself.
        }
        let span = (*b as i128 - *a as i128) / *s as i128;
        span.max(0) as u128 + 1
    });
    Some(elements.map(|e| e.saturating_mul(8)).sum())
}

/// Each row's value of an Int64 argument (NULL as 0).
fn ints(array: &dyn Array) -> Option<Vec<i64>> {
    let ints = array.as_primitive_opt::<Int64Type>()?;
    Some(ints.iter().map(|n| n.unwrap_or(0)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(
        ctx: &SessionContext,
        sql: &str,
    ) -> DfResult<Vec<datafusion::arrow::array::RecordBatch>> {
        ctx.sql(sql).await?.collect().await
    }

    /// Calls under the limit give DataFusion's rows; one over it is refused
    /// naming the function and the limit, before anything is allocated.
    #[tokio::test]
    async fn calls_over_the_limit_are_refused_before_they_run() {
        let ctx = SessionContext::new();
        register(&ctx, 1 << 20);
        let rows = run(&ctx, "SELECT length(repeat('ab', 1000)) AS n, cardinality(range(1, 101)) AS r, length(lpad('x', 50, 'y')) AS p")
            .await
            .unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
            .unwrap()
            .to_string();
        assert!(text.contains("| 2000 | 100 | 50 |"), "{text}");
        for (sql, name) in [
            ("SELECT repeat('x', 2000000000)", "repeat"),
            ("SELECT rpad('x', 1000000)", "rpad"),
            ("SELECT array_repeat(1, 200000)", "array_repeat"),
            (
                "SELECT unnest(generate_series(1, 400000000))",
                "generate_series",
            ),
            (
                "SELECT repeat(body, 600000) FROM (VALUES ('a'), ('b')) AS t(body)",
                "repeat",
            ),
        ] {
            let e = run(&ctx, sql).await.unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains("--memory-limit 1024.0 KB"),
                "{sql}: {e}"
            );
        }
        // Two rows of 600 kB are over a quarter of the limit; one of 200 kB is not.
        run(&ctx, "SELECT length(repeat('a', 200000))")
            .await
            .unwrap();
    }
}
