//! Distances between two vectors (lists of numbers), under the names users
//! know: Snowflake's `vector_cosine_similarity`, `vector_l2_distance` and
//! `vector_inner_product`, BigQuery's `cosine_distance` (1 − cosine
//! similarity) and `euclidean_distance`. One implementation, [`VectorUdf`],
//! whose [`Measure`] is the formula. `ai_similarity(a, b)` is written as
//! `vector_cosine_similarity(ai_embed(a), ai_embed(b))` before planning
//! ([`super::spelling`]).
//!
//! The arguments are lists (variable, large or fixed size) of floats or
//! integers, computed in f64. A NULL list gives NULL; a NULL component, two
//! lengths that differ, or a cosine of a zero vector is an error naming the
//! function and the row.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// What a vector function computes of two vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Measure {
    /// a·b / (|a| |b|).
    CosineSimilarity,
    /// 1 − cosine similarity.
    CosineDistance,
    /// |a − b|.
    L2Distance,
    /// a·b.
    InnerProduct,
}

impl Measure {
    /// Every measure with its SQL name.
    pub const ALL: [(&'static str, Measure); 5] = [
        ("vector_cosine_similarity", Measure::CosineSimilarity),
        ("vector_l2_distance", Measure::L2Distance),
        ("vector_inner_product", Measure::InnerProduct),
        ("cosine_distance", Measure::CosineDistance),
        ("euclidean_distance", Measure::L2Distance),
    ];

    /// The measure of `a` and `b` (of one length); an error for a cosine
    /// of a zero vector.
    pub fn of(self, a: &[f64], b: &[f64]) -> Result<f64, String> {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let cosine = || {
            let (na, nb) = (norm(a), norm(b));
            if na == 0.0 || nb == 0.0 {
                return Err("the cosine of a zero vector is undefined".to_string());
            }
            Ok(dot / (na * nb))
        };
        Ok(match self {
            Measure::CosineSimilarity => cosine()?,
            Measure::CosineDistance => 1.0 - cosine()?,
            Measure::InnerProduct => dot,
            Measure::L2Distance => a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f64>()
                .sqrt(),
        })
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// One vector function as a DataFusion scalar function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct VectorUdf {
    name: &'static str,
    measure: Measure,
    signature: Signature,
}

impl VectorUdf {
    /// The function `name` computing `measure`.
    pub fn new(name: &'static str, measure: Measure) -> Self {
        Self {
            name,
            measure,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }

    /// The vectors of one argument as a list array of f64, checked.
    fn vectors(&self, position: usize, array: &ArrayRef) -> DfResult<ArrayRef> {
        let element = match array.data_type() {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                f.data_type().clone()
            }
            DataType::Null => return Ok(array.clone()),
            other => {
                return Err(self.error(format!(
                    "argument {position} must be a list of numbers, not {other}"
                )));
            }
        };
        if !(element.is_numeric() || element == DataType::Null) {
            return Err(self.error(format!(
                "argument {position} must be a list of numbers, not a list of {element}"
            )));
        }
        let f64s = DataType::new_list(DataType::Float64, true);
        Ok(cast(array, &f64s)?)
    }

    fn error(&self, message: String) -> DataFusionError {
        DataFusionError::Execution(format!("{}: {message}", self.name))
    }
}

/// The values of row `row` of a list array of f64, or `None` for a NULL
/// list; an error for a NULL component.
fn row_values(list: &ArrayRef, row: usize) -> Result<Option<Vec<f64>>, String> {
    if list.data_type() == &DataType::Null || list.is_null(row) {
        return Ok(None);
    }
    let values = list.as_list::<i32>().value(row);
    let values = values.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
    if let Some(i) = (0..values.len()).find(|&i| values.is_null(i)) {
        return Err(format!("component {} is NULL", i + 1));
    }
    Ok(Some(values.values().to_vec()))
}

impl ScalarUDFImpl for VectorUdf {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        for (i, t) in args.iter().enumerate() {
            let ok = match t {
                DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                    f.data_type().is_numeric() || f.data_type() == &DataType::Null
                }
                DataType::Null => true,
                _ => false,
            };
            if !ok {
                return Err(DataFusionError::Plan(format!(
                    "{}: argument {} must be a list of numbers, not {t}",
                    self.name,
                    i + 1
                )));
            }
        }
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return Err(self.error(format!("takes two vectors, not {}", args.args.len())));
        };
        let a = self.vectors(1, &a.to_array(rows)?)?;
        let b = self.vectors(2, &b.to_array(rows)?)?;
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let at = |m: String| self.error(format!("row {}: {m}", row + 1));
            let (x, y) = (row_values(&a, row), row_values(&b, row));
            let (x, y) = match (
                x.map_err(|m| at(format!("the first vector's {m}")))?,
                y.map_err(|m| at(format!("the second vector's {m}")))?,
            ) {
                (Some(x), Some(y)) => (x, y),
                _ => {
                    out.push(None);
                    continue;
                }
            };
            if x.len() != y.len() {
                return Err(at(format!(
                    "the vectors have {} and {} components",
                    x.len(),
                    y.len()
                )));
            }
            out.push(Some(self.measure.of(&x, &y).map_err(at)?));
        }
        Ok(ColumnarValue::Array(Arc::new(Float64Array::from(out))))
    }
}

/// Registers every vector function on `ctx`.
pub fn register(ctx: &SessionContext) {
    for (name, measure) in Measure::ALL {
        ctx.register_udf(ScalarUDF::new_from_impl(VectorUdf::new(name, measure)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn query(sql: &str) -> DfResult<Vec<Option<f64>>> {
        let ctx = SessionContext::new();
        register(&ctx);
        let batches = ctx.sql(sql).await?.collect().await?;
        let mut out = Vec::new();
        for b in batches {
            let c = cast(b.column(0), &DataType::Float64)?;
            let c = c.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
            out.extend(c.iter());
        }
        Ok(out)
    }

    fn one(sql: &str) -> DfResult<Option<f64>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        Ok(rt.block_on(query(sql))?[0])
    }

    fn close(sql: &str, want: f64) {
        let got = one(sql).unwrap().unwrap_or_else(|| panic!("{sql}: NULL"));
        assert!((got - want).abs() < 1e-12, "{sql}: {got}, want {want}");
    }

    #[test]
    fn each_function_against_hand_computed_values() {
        // a = (1, 2, 2): |a| = 3; b = (2, 0, 0): |b| = 2; a·b = 2.
        close(
            "SELECT vector_inner_product([1.0, 2.0, 2.0], [2.0, 0.0, 0.0])",
            2.0,
        );
        close(
            "SELECT vector_cosine_similarity([1.0, 2.0, 2.0], [2.0, 0.0, 0.0])",
            1.0 / 3.0,
        );
        close(
            "SELECT cosine_distance([1.0, 2.0, 2.0], [2.0, 0.0, 0.0])",
            2.0 / 3.0,
        );
        // a − b = (−1, 2, 2): its length is 3.
        close(
            "SELECT vector_l2_distance([1.0, 2.0, 2.0], [2.0, 0.0, 0.0])",
            3.0,
        );
        close("SELECT euclidean_distance([1, 2, 2], [2, 0, 0])", 3.0);
        close(
            "SELECT vector_cosine_similarity([3.0, 4.0], [3.0, 4.0])",
            1.0,
        );
        close(
            "SELECT vector_cosine_similarity([1.0, 0.0], [-1.0, 0.0])",
            -1.0,
        );
    }

    /// Every row of a query's first column.
    fn all(sql: &str) -> DfResult<Vec<Option<f64>>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(query(sql))
    }

    #[test]
    fn columns_of_lists_row_by_row_with_nulls() {
        // Row 1: (1, 2)·(3, 4) = 11; row 2 a NULL list; row 3: (0, 5)·(2, 2) = 10.
        let got = all("SELECT vector_inner_product(a, b) FROM (VALUES \
             ([1.0, 2.0], [3.0, 4.0]), (NULL, [1.0, 1.0]), ([0.0, 5.0], [2.0, 2.0])) AS v(a, b)")
        .unwrap();
        assert_eq!(got, [Some(11.0), None, Some(10.0)]);
        // The mismatch is named at its row, with both lengths.
        let e = all("SELECT euclidean_distance(a, b) FROM (VALUES \
             ([1.0, 2.0], [3.0, 4.0]), ([1.0, 2.0, 3.0], [1.0])) AS v(a, b)")
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("euclidean_distance: row 2: the vectors have 3 and 1 components"),
            "{e}"
        );
    }

    #[test]
    fn fixed_size_and_large_lists_are_vectors_too() {
        // (3, 4) − (0, 0) has length 5, whatever list type holds it.
        close(
            "SELECT vector_l2_distance(arrow_cast([3.0, 4.0], 'FixedSizeList(2, Float32)'), \
             arrow_cast([0, 0], 'LargeList(Int32)'))",
            5.0,
        );
        close(
            "SELECT vector_inner_product(arrow_cast([1.0, 2.0], 'FixedSizeList(2, Float64)'), \
             [3.0, 4.0])",
            11.0,
        );
        let e = one(
            "SELECT vector_cosine_similarity(arrow_cast([1.0, 2.0], 'FixedSizeList(2, Float64)'), \
             [3.0, 4.0, 5.0])",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("vector_cosine_similarity: row 1: the vectors have 2 and 3 components"),
            "{e}"
        );
    }

    #[test]
    fn a_null_vector_gives_null() {
        assert_eq!(
            one("SELECT vector_l2_distance(CAST(NULL AS DOUBLE[]), [1.0])").unwrap(),
            None
        );
        assert_eq!(one("SELECT cosine_distance(NULL, [1.0])").unwrap(), None);
    }

    #[test]
    fn bad_vectors_are_errors_naming_function_and_row() {
        let e = one("SELECT vector_l2_distance([1.0, 2.0], [1.0])")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vector_l2_distance: row 1: the vectors have 2 and 1 components"),
            "{e}"
        );
        let e = one("SELECT vector_inner_product([1.0, NULL], [1.0, 2.0])")
            .unwrap_err()
            .to_string();
        assert!(e.contains("the first vector's component 2 is NULL"), "{e}");
        let e = one("SELECT vector_cosine_similarity([0.0, 0.0], [1.0, 2.0])")
            .unwrap_err()
            .to_string();
        assert!(e.contains("zero vector"), "{e}");
        let e = one("SELECT cosine_distance('a', [1.0])")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cosine_distance: argument 1 must be a list of numbers"),
            "{e}"
        );
    }
}
