//! [`WorkerTaskExec`]: the plan node that carries AI operator work to a worker.
//!
//! The coordinator builds a two-task stage of this leaf (one variant per task,
//! in a `DistributedLeafExec`) under a `NetworkCoalesceExec`;
//! datafusion-distributed sends each task only its variant, encoded with
//! [`WorkerTaskCodec`](super::WorkerTaskCodec), and streams each task's one-row
//! reply back. On the worker, `execute` hands the [`WorkerMessage`] to the model
//! the worker serves (a session extension, [`ServedModel`](super::ServedModel)).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{BinaryArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use super::message::{WorkerMessage, WorkerReply, WorkerTask, encode};
use super::worker::{ServedModel, answer};

/// Name of the reply column: each task returns one row holding its
/// [`WorkerReply`] as JSON.
pub const REPLY_COLUMN: &str = "reply";

/// The schema of a worker task's output: `reply: Binary`, one row.
pub fn reply_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        REPLY_COLUMN,
        DataType::Binary,
        false,
    )]))
}

/// A leaf that asks the worker it runs on one message.
#[derive(Debug)]
pub struct WorkerTaskExec {
    /// What to ask, and for which query.
    task: WorkerTask,
    /// `reply: Binary`.
    schema: SchemaRef,
    /// One partition, bounded, emitted at the end.
    properties: Arc<PlanProperties>,
}

impl WorkerTaskExec {
    /// A leaf asking `task`.
    pub fn new(task: WorkerTask) -> Self {
        let schema = reply_schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            task,
            schema,
            properties,
        }
    }

    /// What it asks, and for which query.
    pub fn task(&self) -> &WorkerTask {
        &self.task
    }
}

impl DisplayAs for WorkerTaskExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match &self.task.message {
            WorkerMessage::Answer(call, r) => write!(
                f,
                "WorkerTaskExec: {} {} questions",
                call.op_id,
                r.requests.len()
            ),
            other => {
                let shown: String = format!("{other:?}").chars().take(40).collect();
                write!(f, "WorkerTaskExec: {shown}")
            }
        }
    }
}

impl ExecutionPlan for WorkerTaskExec {
    fn name(&self) -> &str {
        "WorkerTaskExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return Err(DataFusionError::Internal("WorkerTaskExec is a leaf".into()));
        }
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let task = self.task.clone();
        let Some(served) = context.session_config().get_extension::<ServedModel>() else {
            return Err(DataFusionError::Execution(
                "no model is served here: WorkerTaskExec runs on an `aisql worker`".into(),
            ));
        };
        let schema = self.schema.clone();
        let out_schema = schema.clone();
        let reply = async move {
            // Model work blocks for a whole batch: off the async threads.
            let reply = tokio::task::spawn_blocking(move || answer(&served, task))
                .await
                .unwrap_or_else(|e| WorkerReply::Failed(format!("worker task panicked: {e}")));
            let bytes = encode(&reply);
            let column = BinaryArray::from_iter_values([bytes.as_slice()]);
            RecordBatch::try_new(schema, vec![Arc::new(column)]).map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            out_schema,
            futures::stream::once(reply),
        )))
    }
}
