//! The depth limit of recursive CTEs. DataFusion's `RecursiveQueryExec` runs
//! its recursive term again for as long as the last run produced rows, with no
//! limit ("it is up to the planner to ensure that it won't happen"): a CTE
//! whose `WHERE` never stops it runs until memory runs out. [`RecursionLimit`],
//! the last physical optimizer rule, puts a [`RecursionLimitExec`] over both
//! terms of every recursive query: the static term's restarts the count (each
//! time the recursive query runs), the recursive term's counts its runs and
//! fails the query when one past the limit still produces rows, naming the
//! CTE.

use std::fmt::Formatter;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::error::EngineError;

/// Iterations a recursive CTE may run without `--max-recursion`: far more
/// than a walk of a hierarchy or a graph needs, far fewer than a runaway
/// recursion takes to fill memory.
pub const DEFAULT_MAX_RECURSION: usize = 10_000;

/// Puts a [`RecursionLimitExec`] over both terms of every recursive query.
#[derive(Debug)]
pub struct RecursionLimit {
    /// Runs of a recursive term allowed.
    pub max_iterations: usize,
}

impl PhysicalOptimizerRule for RecursionLimit {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(recursive) = node.downcast_ref::<RecursiveQueryExec>() else {
                return Ok(Transformed::no(node));
            };
            if recursive.static_term().is::<RecursionLimitExec>() {
                return Ok(Transformed::no(node));
            }
            let count = Arc::new(AtomicUsize::new(0));
            let term = |input: &Arc<dyn ExecutionPlan>, recursive_term: bool| {
                Arc::new(RecursionLimitExec {
                    input: input.clone(),
                    cte: recursive.name().to_string(),
                    recursive_term,
                    max_iterations: self.max_iterations,
                    count: count.clone(),
                }) as Arc<dyn ExecutionPlan>
            };
            let limited = RecursiveQueryExec::try_new(
                recursive.name().to_string(),
                recursive.schema(),
                term(recursive.static_term(), false),
                term(recursive.recursive_term(), true),
                recursive.is_distinct(),
            )?;
            Ok(Transformed::yes(Arc::new(limited) as Arc<dyn ExecutionPlan>))
        })
        .data()
    }

    fn name(&self) -> &str {
        "recursion_limit"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// One term of a recursive query, passed through unchanged. Over the static
/// term, its execution restarts the count (the recursive query runs anew);
/// over the recursive term, each execution is one iteration, and a row from
/// an iteration past the limit is an error naming the CTE (a recursion that
/// ends within the limit runs whole).
#[derive(Debug)]
pub struct RecursionLimitExec {
    input: Arc<dyn ExecutionPlan>,
    /// The CTE's name.
    cte: String,
    /// Over the recursive term (else the static one).
    recursive_term: bool,
    max_iterations: usize,
    /// Iterations of the running recursion, shared by both terms' nodes.
    count: Arc<AtomicUsize>,
}

impl DisplayAs for RecursionLimitExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut Formatter) -> std::fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "cte={}", self.cte),
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                if self.recursive_term {
                    write!(
                        f,
                        "RecursionLimitExec: cte={}, max_iterations={}",
                        self.cte, self.max_iterations
                    )
                } else {
                    write!(f, "RecursionLimitExec: cte={}, static term", self.cte)
                }
            }
        }
    }
}

impl ExecutionPlan for RecursionLimitExec {
    fn name(&self) -> &'static str {
        "RecursionLimitExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "RecursionLimitExec has one child, given {}",
                children.len()
            )));
        }
        Ok(Arc::new(RecursionLimitExec {
            input: children.swap_remove(0),
            cte: self.cte.clone(),
            recursive_term: self.recursive_term,
            max_iterations: self.max_iterations,
            count: self.count.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if !self.recursive_term {
            self.count.store(0, Ordering::SeqCst);
            return self.input.execute(partition, context);
        }
        let stream = self.input.execute(partition, context)?;
        if self.count.fetch_add(1, Ordering::SeqCst) < self.max_iterations {
            return Ok(stream);
        }
        // One iteration past the limit runs to see whether the recursion ends
        // there: a row from it is one level too deep.
        let (cte, max) = (self.cte.clone(), self.max_iterations);
        let schema = stream.schema();
        let checked = stream.map(move |batch| match batch {
            Ok(batch) if batch.num_rows() > 0 => Err(DataFusionError::External(Box::new(
                EngineError::Sql(format!(
                    "recursive CTE {cte} passed --max-recursion {max} iterations (its recursive \
                     term still produced rows); give its recursion a WHERE that ends it, or a \
                     larger --max-recursion"
                )),
            ))),
            other => other,
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, checked)))
    }
}
