//! The planners that lower [`AiNode`]s to [`AiExec`]s inside DataFusion's
//! physical planner.

use super::*;

/// Lowers [`AiNode`]s to [`AiExec`].
#[derive(Debug)]
pub struct AiExtensionPlanner {
    backend: Arc<dyn InferenceBackend>,
}

#[async_trait]
impl ExtensionPlanner for AiExtensionPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(ai) = node.as_any().downcast_ref::<AiNode>() else {
            return Ok(None);
        };
        Ok(Some(Arc::new(AiExec::try_new(
            ai,
            physical_inputs.to_vec(),
            self.backend.clone(),
            session,
        )?)))
    }
}

/// The query planner that knows AI operators.
#[derive(Debug)]
pub struct AiQueryPlanner {
    planner: Arc<AiExtensionPlanner>,
}

impl AiQueryPlanner {
    /// A planner whose AI operators ask the queries of `backend`.
    pub fn new(backend: Arc<dyn InferenceBackend>) -> Self {
        Self {
            planner: Arc::new(AiExtensionPlanner { backend }),
        }
    }
}

#[async_trait]
impl QueryPlanner for AiQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![self.planner.clone()])
            .create_physical_plan(logical_plan, session)
            .await
    }
}
