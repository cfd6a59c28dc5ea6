//! DataFusion's Substrait producer, with what it leaves out of a plan filled
//! in so that other consumers and validators accept it:
//!
//! - output types on aggregate measures, window functions and the calls the
//!   producer builds itself (`like`, the `not` of `NOT LIKE`, `NOT IN`, `NOT
//!   EXISTS`);
//! - a condition on every join: an inner join without one is a `CrossRel`,
//!   any other join gets the literal `true`;
//! - a simple `CASE x WHEN v ...` as the searched `CASE WHEN x = v ...` it
//!   means (DataFusion writes the operand as a clause without `then`, which
//!   only its own consumer reads);
//! - `IN`-list literals as nullable as the value they are compared with;
//! - read projections that keep a one-column record a struct;
//! - `make_array` of literals (ai_classify's labels) as the list literal the
//!   AI extension declares;
//! - fixed-size lists (`ai_embed`'s vectors) typed as lists, which Substrait
//!   has and DataFusion's producer writes;
//! - function anchors from 1, each declared under the extension that defines
//!   it ([`super::extensions`]).
//!
//! Everything else is DataFusion's own producer, called through its public
//! functions.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{DFSchema, DFSchemaRef, ScalarValue, internal_err};
use datafusion::logical_expr::expr::{InList, ScalarFunction, WindowFunction};
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Case, Cast, Expr, ExprSchemable, Join, JoinType, Operator, TableScan,
    binary_expr,
};
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::logical_plan::producer::{
    DefaultSubstraitLambdaProducer, SubstraitProducer, from_binary_expr, from_case, from_cast,
    from_in_list, from_join, from_scalar_function, from_table_scan, from_window_function,
    lambda_parameters_map, to_substrait_agg_measure, to_substrait_groupings, to_substrait_rex,
};
use datafusion_substrait::substrait::proto::expression::literal::LiteralType;
use datafusion_substrait::substrait::proto::expression::{
    Literal, RexType, ScalarFunction as SubstraitCall,
};
use datafusion_substrait::substrait::proto::function_argument::ArgType;
use datafusion_substrait::substrait::proto::rel::RelType;
use datafusion_substrait::substrait::proto::{
    AggregateRel, CrossRel, Expression, FunctionArgument, Rel, Type,
};

use super::extensions::{Family, Registry};

type DfResult<T> = datafusion::common::Result<T>;

/// The producer of exported plans.
#[derive(Default)]
pub struct ExportProducer {
    registry: Registry,
    /// The argument family of each call being produced, innermost last: the
    /// producer registers a call's function without its arguments' types.
    families: Vec<Family>,
    lambdas: DefaultSubstraitLambdaProducer,
}

impl ExportProducer {
    /// The functions and types the produced relations use.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Produces with `family` as the family of the calls registered meanwhile.
    fn within<T>(
        &mut self,
        family: Family,
        f: impl FnOnce(&mut Self) -> DfResult<T>,
    ) -> DfResult<T> {
        self.families.push(family);
        let out = f(self);
        self.families.pop();
        out
    }

    fn family(exprs: &[&Expr], schema: &DFSchemaRef) -> DfResult<Family> {
        let types = exprs
            .iter()
            .map(|e| e.get_type(schema.as_ref()))
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Family::of(&types))
    }

    /// The Substrait type of `field`. DataFusion's type mapping is private to
    /// its crate; a typed NULL literal is the public way to it.
    fn substrait_type(&mut self, field: FieldRef) -> DfResult<Type> {
        let field = without_fixed_size_lists(&field);
        let null = Cast::new_from_field(Box::new(Expr::Literal(ScalarValue::Null, None)), field);
        let empty = Arc::new(DFSchema::empty());
        match from_cast(self, &null, &empty)?.rex_type {
            Some(RexType::Literal(Literal {
                literal_type: Some(LiteralType::Null(t)),
                ..
            })) => Ok(t),
            other => internal_err!("a typed NULL was produced as {other:?}"),
        }
    }

    /// A call returning `field`, which holds a fixed-size list (`ai_embed`),
    /// as DataFusion's producer writes any call, its output type a list
    /// ([`without_fixed_size_lists`]).
    fn call_typed_as_list(
        &mut self,
        f: &ScalarFunction,
        field: FieldRef,
        schema: &DFSchemaRef,
    ) -> DfResult<Expression> {
        let arguments = f
            .args
            .iter()
            .map(|a| {
                Ok(FunctionArgument {
                    arg_type: Some(ArgType::Value(self.handle_expr(a, schema)?)),
                })
            })
            .collect::<DfResult<Vec<_>>>()?;
        let output_type = self.substrait_type(field)?;
        let function_reference = self.register_function(f.name().to_string());
        // `args` is deprecated in Substrait but part of the struct.
        #[allow(deprecated)]
        Ok(Expression {
            rex_type: Some(RexType::ScalarFunction(SubstraitCall {
                function_reference,
                arguments,
                output_type: Some(output_type),
                options: vec![],
                args: vec![],
            })),
        })
    }

    fn type_of(&mut self, expr: &Expr, schema: &DFSchemaRef) -> DfResult<Type> {
        let (_, field) = expr.to_field(schema.as_ref())?;
        self.substrait_type(field)
    }
}

/// `field` with every fixed-size list (an `ai_embed` vector) a list of the
/// same items: Substrait has no fixed-size list type (DataFusion's producer
/// refuses one), and the AI extension declares an embedding `list<fp32>`.
/// A consumer that knows `ai_embed` types the call from its arguments again.
fn without_fixed_size_lists(field: &FieldRef) -> FieldRef {
    let relisted = match field.data_type() {
        DataType::FixedSizeList(item, _) | DataType::List(item) => {
            DataType::List(without_fixed_size_lists(item))
        }
        DataType::LargeList(item) => DataType::LargeList(without_fixed_size_lists(item)),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(without_fixed_size_lists)
                .collect::<Vec<_>>()
                .into(),
        ),
        _ => return field.clone(),
    };
    Arc::new(field.as_ref().clone().with_data_type(relisted))
}

/// Whether `e` is a call the producer left without its output type.
fn lacks_output_type(e: &Expression) -> bool {
    match &e.rex_type {
        Some(RexType::ScalarFunction(f)) => f.output_type.is_none(),
        Some(RexType::WindowFunction(w)) => w.output_type.is_none(),
        _ => false,
    }
}

/// Gives `e`, and the untyped calls directly under an untyped call (`like`
/// under `not`: the same boolean), the output type `ty`.
fn fill_output_type(e: &mut Expression, ty: &Type) {
    match &mut e.rex_type {
        Some(RexType::ScalarFunction(f)) if f.output_type.is_none() => {
            f.output_type = Some(ty.clone());
            for a in &mut f.arguments {
                if let Some(ArgType::Value(v)) = &mut a.arg_type {
                    fill_output_type(v, ty);
                }
            }
        }
        Some(RexType::WindowFunction(w)) if w.output_type.is_none() => {
            w.output_type = Some(ty.clone());
        }
        _ => {}
    }
}

/// The arguments of aggregate expression `e` (an aggregate call, perhaps
/// aliased).
fn aggregate_args(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::Alias(a) => aggregate_args(&a.expr),
        Expr::AggregateFunction(f) => f.params.args.iter().collect(),
        _ => Vec::new(),
    }
}

/// `make_array` of literals as the list literal it evaluates to.
fn constant_list(f: &ScalarFunction, schema: &DFSchemaRef) -> DfResult<Option<ScalarValue>> {
    if f.name() != "make_array" || f.args.is_empty() {
        return Ok(None);
    }
    let Some(values) = f
        .args
        .iter()
        .map(|a| match a {
            Expr::Literal(v, _) => Some(v.clone()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
    else {
        return Ok(None);
    };
    let DataType::List(item) = Expr::ScalarFunction(f.clone()).get_type(schema.as_ref())? else {
        return Ok(None);
    };
    let values = values
        .iter()
        .map(|v| v.cast_to(item.data_type()))
        .collect::<DfResult<Vec<_>>>()?;
    Ok(Some(ScalarValue::List(ScalarValue::new_list_nullable(
        &values,
        item.data_type(),
    ))))
}

impl SubstraitProducer for ExportProducer {
    fn register_function(&mut self, name: String) -> u32 {
        let family = self.families.last().copied().unwrap_or(Family::Other);
        self.registry.function(&name, family)
    }

    fn register_type(&mut self, name: String) -> u32 {
        self.registry.type_anchor(&name)
    }

    fn get_extensions(self) -> Extensions {
        self.registry.extensions()
    }

    fn handle_expr(&mut self, expr: &Expr, schema: &DFSchemaRef) -> DfResult<Expression> {
        let mut out = to_substrait_rex(self, expr, schema)?;
        if lacks_output_type(&out) {
            let ty = self.type_of(expr, schema)?;
            fill_output_type(&mut out, &ty);
        }
        Ok(out)
    }

    fn handle_binary_expr(
        &mut self,
        expr: &BinaryExpr,
        schema: &DFSchemaRef,
    ) -> DfResult<Expression> {
        let family = Self::family(&[&expr.left, &expr.right], schema)?;
        self.within(family, |p| from_binary_expr(p, expr, schema))
    }

    fn handle_scalar_function(
        &mut self,
        f: &ScalarFunction,
        schema: &DFSchemaRef,
    ) -> DfResult<Expression> {
        if let Some(list) = constant_list(f, schema)? {
            return self.handle_literal(&list);
        }
        let family = Self::family(&f.args.iter().collect::<Vec<_>>(), schema)?;
        let (_, field) = Expr::ScalarFunction(f.clone()).to_field(schema.as_ref())?;
        if without_fixed_size_lists(&field) != field {
            // DataFusion's producer refuses the output type: written here.
            return self.within(family, |p| p.call_typed_as_list(f, field, schema));
        }
        self.within(family, |p| from_scalar_function(p, f, schema))
    }

    fn handle_window_function(
        &mut self,
        w: &WindowFunction,
        schema: &DFSchemaRef,
    ) -> DfResult<Expression> {
        let family = Self::family(&w.params.args.iter().collect::<Vec<_>>(), schema)?;
        self.within(family, |p| from_window_function(p, w, schema))
    }

    fn handle_aggregate(&mut self, agg: &Aggregate) -> DfResult<Box<Rel>> {
        let input = self.handle_plan(agg.input.as_ref())?;
        let schema = agg.input.schema();
        let (grouping_expressions, groupings) =
            to_substrait_groupings(self, &agg.group_expr, schema)?;
        let mut measures = Vec::with_capacity(agg.aggr_expr.len());
        for e in &agg.aggr_expr {
            let family = Self::family(&aggregate_args(e), schema)?;
            let mut measure = self.within(family, |p| to_substrait_agg_measure(p, e, schema))?;
            if let Some(m) = &mut measure.measure
                && m.output_type.is_none()
            {
                m.output_type = Some(self.type_of(e, schema)?);
            }
            measures.push(measure);
        }
        Ok(Box::new(Rel {
            rel_type: Some(RelType::Aggregate(Box::new(AggregateRel {
                common: None,
                input: Some(input),
                grouping_expressions,
                groupings,
                measures,
                advanced_extension: None,
            }))),
        }))
    }

    fn handle_case(&mut self, case: &Case, schema: &DFSchemaRef) -> DfResult<Expression> {
        let Some(operand) = &case.expr else {
            return from_case(self, case, schema);
        };
        let searched = Case {
            expr: None,
            when_then_expr: case
                .when_then_expr
                .iter()
                .map(|(when, then)| {
                    let test = binary_expr(
                        operand.as_ref().clone(),
                        Operator::Eq,
                        when.as_ref().clone(),
                    );
                    (Box::new(test), then.clone())
                })
                .collect(),
            else_expr: case.else_expr.clone(),
        };
        from_case(self, &searched, schema)
    }

    fn handle_in_list(&mut self, in_list: &InList, schema: &DFSchemaRef) -> DfResult<Expression> {
        let nullable = in_list.expr.nullable(schema.as_ref())?;
        let mut out = from_in_list(self, in_list, schema)?;
        let list = match &mut out.rex_type {
            Some(RexType::SingularOrList(list)) => Some(list),
            // NOT IN: not(singular_or_list).
            Some(RexType::ScalarFunction(f)) => {
                f.arguments.first_mut().and_then(|a| match &mut a.arg_type {
                    Some(ArgType::Value(Expression {
                        rex_type: Some(RexType::SingularOrList(list)),
                    })) => Some(list),
                    _ => None,
                })
            }
            _ => None,
        };
        if let Some(list) = list {
            for option in &mut list.options {
                if let Some(RexType::Literal(l)) = &mut option.rex_type {
                    l.nullable |= nullable;
                }
            }
        }
        Ok(out)
    }

    fn handle_join(&mut self, join: &Join) -> DfResult<Box<Rel>> {
        if join.join_type == JoinType::Inner && join.on.is_empty() && join.filter.is_none() {
            let left = self.handle_plan(join.left.as_ref())?;
            let right = self.handle_plan(join.right.as_ref())?;
            return Ok(Box::new(Rel {
                rel_type: Some(RelType::Cross(Box::new(CrossRel {
                    common: None,
                    left: Some(left),
                    right: Some(right),
                    advanced_extension: None,
                }))),
            }));
        }
        let mut rel = from_join(self, join)?;
        if let Some(RelType::Join(j)) = &mut rel.rel_type
            && j.expression.is_none()
        {
            j.expression = Some(Box::new(
                self.handle_literal(&ScalarValue::Boolean(Some(true)))?,
            ));
        }
        Ok(rel)
    }

    fn handle_table_scan(&mut self, scan: &TableScan) -> DfResult<Box<Rel>> {
        let mut rel = from_table_scan(self, scan)?;
        if let Some(RelType::Read(read)) = &mut rel.rel_type
            && let Some(projection) = &mut read.projection
        {
            projection.maintain_singular_struct = true;
        }
        Ok(rel)
    }

    fn push_lambda_parameters(&mut self, parameters: Vec<FieldRef>) -> DfResult<()> {
        let map = lambda_parameters_map(self, parameters)?;
        self.lambdas.push_lambda_parameters(map);
        Ok(())
    }

    fn pop_lambda_parameters(&mut self) -> DfResult<()> {
        self.lambdas.pop_lambda_parameters()
    }

    fn lambda_variable(&self, name: &str) -> DfResult<(u32, i32)> {
        self.lambdas.lambda_variable(name)
    }

    fn lambda_parameter_type(&self, name: &str) -> DfResult<Type> {
        self.lambdas.lambda_parameter_type(name)
    }
}
