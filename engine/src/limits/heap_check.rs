//! The heap bound between every two operators. The memory pool
//! ([`crate::limits::memory_guard::HeapBoundedPool`]) checks the heap when an
//! operator reserves; output batches, a join's probe-side copies and a
//! function's result are never reserved, so a plan whose operators only
//! stream (twenty chained AI self-joins whose answers are mostly TRUE) grew
//! the heap 4.6 GB past its ceiling between two reservations.
//! [`with_heap_checks`] puts a [`HeapCheckExec`] over every operator of a
//! plan about to run: each batch an operator hands up is followed by a check
//! of the whole heap against the query's ceiling, and one over it fails the
//! query with the pool's error. What escapes the bound is then what one
//! operator allocates for one batch.
//!
//! The checks are put in after planning, on the plan that runs, never on the
//! one `EXPLAIN` prints: a plan's text stays what the optimizer made. For the
//! same reason `EXPLAIN ANALYZE`, which prints the plan it ran, runs without
//! them (bounded by the pool's checks alone).

use std::fmt::Formatter;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::analyze::AnalyzeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::limits::memory_guard::HeapBoundedPool;

/// `plan` with a [`HeapCheckExec`] over each of its operators. Operators
/// that ship their subtree to another process (`--workers`) keep their
/// children as they are: the wrapper is not part of the wire format, and the
/// worker's own session bounds its heap.
pub fn with_heap_checks(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    // EXPLAIN ANALYZE prints the plan it ran: it runs as planned (the pool's
    // checks at reservations still bound it).
    if plan.is::<HeapCheckExec>() || plan.is::<AnalyzeExec>() {
        return Ok(plan);
    }
    let plan = if ships_subtree(&plan) || plan.children().is_empty() {
        plan
    } else {
        let children = plan
            .children()
            .into_iter()
            .map(|c| with_heap_checks(c.clone()))
            .collect::<DfResult<Vec<_>>>()?;
        plan.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?
    };
    Ok(Arc::new(HeapCheckExec { input: plan }))
}

/// Whether `plan` serialises its children to run elsewhere.
fn ships_subtree(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.is::<crate::inference::distributed::task::WorkerTaskExec>()
        || plan.name().starts_with("Network")
        || plan.name().starts_with("Distributed")
}

/// One operator's output, passed through unchanged, with the heap checked
/// after every batch (see the module docs).
#[derive(Debug)]
pub struct HeapCheckExec {
    input: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for HeapCheckExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut Formatter) -> std::fmt::Result {
        match t {
            DisplayFormatType::TreeRender => Ok(()),
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(f, "HeapCheckExec"),
        }
    }
}

impl ExecutionPlan for HeapCheckExec {
    fn name(&self) -> &'static str {
        "HeapCheckExec"
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
                "HeapCheckExec has one child, given {}",
                children.len()
            )));
        }
        Ok(Arc::new(HeapCheckExec {
            input: children.swap_remove(0),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let pool = context.memory_pool().clone();
        let stream = self.input.execute(partition, context)?;
        if !pool.is::<HeapBoundedPool>() {
            return Ok(stream);
        }
        let operator = self.input.name().to_string();
        let schema = stream.schema();
        let checked = stream.map(move |batch| {
            let batch = batch?;
            let bounded = pool
                .downcast_ref::<HeapBoundedPool>()
                .expect("checked to be a HeapBoundedPool above");
            bounded.check_heap_now(&operator)?;
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, checked)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
    use datafusion::prelude::SessionContext;

    /// Whether `plan` has any [`HeapCheckExec`].
    fn has_heap_checks(plan: &Arc<dyn ExecutionPlan>) -> bool {
        let mut found = false;
        plan.apply(|node| {
            found |= node.is::<HeapCheckExec>();
            Ok(if found {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })
        .expect("a walk that cannot fail");
        found
    }

    /// `plan` with every [`HeapCheckExec`] taken out again: the plan as planned.
    fn without_heap_checks(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| match node.downcast_ref::<HeapCheckExec>() {
            Some(check) => Ok(Transformed::yes(check.input.clone())),
            None => Ok(Transformed::no(node)),
        })
        .data()
    }

    async fn planned(sql: &str) -> Arc<dyn ExecutionPlan> {
        let ctx = SessionContext::new();
        ctx.sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap()
    }

    /// Every operator gets one check over it, once however often the plan is
    /// wrapped, and taking them out gives the plan as planned.
    #[tokio::test]
    async fn every_operator_is_checked_once_and_the_plan_comes_back() {
        let plan =
            planned("SELECT a, count(*) FROM (VALUES (1), (2), (2)) t(a) GROUP BY a ORDER BY a")
                .await;
        assert!(!has_heap_checks(&plan));
        let checked = with_heap_checks(with_heap_checks(plan.clone()).unwrap()).unwrap();
        let mut operators = 0;
        let mut checks = 0;
        checked
            .apply(|node| {
                if node.is::<HeapCheckExec>() {
                    checks += 1;
                    assert!(!node.children()[0].is::<HeapCheckExec>());
                } else {
                    operators += 1;
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
        assert_eq!(checks, operators, "one check per operator");
        let back = without_heap_checks(checked).unwrap();
        let text = |p: &Arc<dyn ExecutionPlan>| {
            datafusion::physical_plan::displayable(p.as_ref())
                .indent(true)
                .to_string()
        };
        assert_eq!(text(&back), text(&plan));
    }

    /// A heap over the query's ceiling fails the query at the first batch,
    /// naming the operator and `--memory-limit`; under it the rows pass.
    #[tokio::test]
    async fn a_heap_over_the_ceiling_fails_at_the_next_batch() {
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::prelude::SessionConfig;
        let pool = Arc::new(HeapBoundedPool::new(1 << 30));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime);
        let plan = ctx
            .sql("SELECT a * 2 FROM (VALUES (1), (2)) t(a)")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let plan = with_heap_checks(plan).unwrap();
        let rows = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx())
            .await
            .unwrap();
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
        pool.set_ceiling_for_tests(0);
        let e = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("--memory-limit"), "{e}");
        assert!(e.contains("Exec"), "names the operator: {e}");
    }
}
