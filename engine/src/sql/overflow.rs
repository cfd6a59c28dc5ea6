//! Integer overflow is an error, as in PostgreSQL and DuckDB: DataFusion's
//! `+`, `-`, `*` and unary `-` wrap around (`9223372036854775807 + 1` gives
//! `-9223372036854775808`), and its `enable_ansi_mode` only concerns its Spark
//! functions. [`CheckedArithmetic`], an analyzer rule right after type
//! coercion, makes each of them over integers a call of a checked function
//! with the same name, type and nullability. The rule runs before the
//! optimizer, so constant folding evaluates the checked function: an overflow
//! in constants is left for execution, which reports it, instead of being
//! folded into a wrapped value.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::arrow::error::ArrowError;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use crate::error::EngineError;

/// The analyzer rule's name.
pub const RULE_NAME: &str = "checked_arithmetic";

/// Makes integer `+`, `-`, `*` and unary `-` checked function calls.
#[derive(Debug, Default)]
pub struct CheckedArithmetic;

impl AnalyzerRule for CheckedArithmetic {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let mut schema = merge_schema(&node.inputs());
            if let LogicalPlan::TableScan(scan) = &node {
                schema.merge(&DFSchema::try_from_qualified_schema(
                    scan.table_name.clone(),
                    &scan.source.schema(),
                )?);
            }
            let changed = node.map_expressions(|e| e.transform_up(|e| checked(e, &schema)))?;
            if changed.transformed {
                changed.map_data(|node| node.recompute_schema())
            } else {
                Ok(changed)
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        RULE_NAME
    }
}

/// `expr` as a checked call when it is integer arithmetic.
fn checked(expr: Expr, schema: &DFSchema) -> DfResult<Transformed<Expr>> {
    let integer = |e: &Expr| e.get_type(schema).ok().filter(DataType::is_integer);
    let call = |op: Arith, args: Vec<Expr>| {
        Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
            op.udf(),
            args,
        )))
    };
    Ok(match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right })
            if integer(&left).is_some_and(|t| integer(&right) == Some(t)) =>
        {
            match op {
                Operator::Plus => call(Arith::Add, vec![*left, *right]),
                Operator::Minus => call(Arith::Sub, vec![*left, *right]),
                Operator::Multiply => call(Arith::Mul, vec![*left, *right]),
                op => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
            }
        }
        Expr::Negative(inner) if integer(&inner).is_some_and(|t| t.is_signed_integer()) => {
            call(Arith::Neg, vec![*inner])
        }
        other => Transformed::no(other),
    })
}

/// The arithmetic a [`Checked`] function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Arith {
    Add,
    Sub,
    Mul,
    Neg,
}

impl Arith {
    fn name(self) -> &'static str {
        match self {
            Arith::Add => "checked_add",
            Arith::Sub => "checked_sub",
            Arith::Mul => "checked_mul",
            Arith::Neg => "checked_neg",
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub | Arith::Neg => "-",
            Arith::Mul => "*",
        }
    }

    /// Arrow's checked kernel (an error on overflow).
    fn apply(self, args: &[ArrayRef]) -> Result<ArrayRef, ArrowError> {
        match self {
            Arith::Add => numeric::add(&args[0], &args[1]),
            Arith::Sub => numeric::sub(&args[0], &args[1]),
            Arith::Mul => numeric::mul(&args[0], &args[1]),
            Arith::Neg => numeric::neg(&args[0]),
        }
    }

    /// The one function of each kind.
    fn udf(self) -> Arc<ScalarUDF> {
        static UDFS: LazyLock<[Arc<ScalarUDF>; 4]> = LazyLock::new(|| {
            [Arith::Add, Arith::Sub, Arith::Mul, Arith::Neg].map(|op| {
                Arc::new(ScalarUDF::new_from_impl(Checked {
                    op,
                    signature: Signature::any(
                        if op == Arith::Neg { 1 } else { 2 },
                        Volatility::Immutable,
                    ),
                }))
            })
        });
        UDFS[self as usize].clone()
    }
}

/// Integer arithmetic that fails on overflow, named like the operator it
/// replaces (`a + b`), so plans keep their column names.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    op: Arith,
    signature: Signature,
}

impl ScalarUDFImpl for Checked {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn schema_name(&self, args: &[Expr]) -> DfResult<String> {
        Ok(match args {
            [inner] => format!("(- {})", inner.schema_name()),
            [left, right] => format!(
                "{} {} {}",
                left.schema_name(),
                self.op.symbol(),
                right.schema_name()
            ),
            _ => self.op.name().to_string(),
        })
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(arg_types[0].clone())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        Ok(Arc::new(Field::new(
            self.name(),
            args.arg_fields[0].data_type().clone(),
            args.arg_fields.iter().any(|f| f.is_nullable()),
        )))
    }

    fn is_strict(&self) -> bool {
        true
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let result = match self.op.apply(&arrays) {
            Ok(result) => result,
            Err(ArrowError::ArithmeticOverflow(_)) => return Err(self.overflow(&arrays)),
            Err(e) => return Err(e.into()),
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

impl Checked {
    /// The error naming the type and the first row's values that overflow.
    fn overflow(&self, args: &[ArrayRef]) -> DataFusionError {
        let ty = args[0].data_type();
        let rows = args[0].len();
        let row = (0..rows).find(|&i| {
            let one: Vec<ArrayRef> = args.iter().map(|a| a.slice(i, 1)).collect();
            self.op.apply(&one).is_err()
        });
        let value = |a: &ArrayRef, i: usize| {
            let v =
                ScalarValue::try_from_array(a, i).map_or_else(|_| "?".into(), |v| v.to_string());
            if v.starts_with('-') {
                format!("({v})")
            } else {
                v
            }
        };
        let what = match row {
            Some(i) if self.op == Arith::Neg => format!("-{}", value(&args[0], i)),
            Some(i) => format!(
                "{} {} {}",
                value(&args[0], i),
                self.op.symbol(),
                value(&args[1], i)
            ),
            None => self.op.name().to_string(),
        };
        let wider = match ty.primitive_width() {
            Some(8) => "DECIMAL(38, 0)",
            _ => "BIGINT",
        };
        DataFusionError::External(Box::new(EngineError::Sql(format!(
            "{ty} overflow in {what} (the result does not fit in {ty}; cast an operand to a \
             wider type, e.g. CAST(x AS {wider}))"
        ))))
    }
}
