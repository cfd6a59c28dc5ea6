//! [`WorkerTaskCodec`]: how a [`WorkerTaskExec`] crosses the wire, for
//! datafusion-distributed's plan encoding on both the coordinator and the worker.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use super::message::{decode_task, encode};
use super::task::WorkerTaskExec;

/// Encodes a [`WorkerTaskExec`] as its [`WorkerTask`](super::message::WorkerTask)'s JSON; decoding refuses
/// inputs (it is a leaf) and bytes that are not a task, with an error.
#[derive(Debug, Default)]
pub struct WorkerTaskCodec;

impl PhysicalExtensionCodec for WorkerTaskCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(DataFusionError::Internal(format!(
                "WorkerTaskExec is a leaf, got {} inputs",
                inputs.len()
            )));
        }
        let task = decode_task(buf)?;
        Ok(Arc::new(WorkerTaskExec::new(task)))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let Some(task) = node.downcast_ref::<WorkerTaskExec>() else {
            return Err(DataFusionError::Internal(format!(
                "WorkerTaskCodec encodes WorkerTaskExec, not {}",
                node.name()
            )));
        };
        buf.extend_from_slice(&encode(task.task()));
        Ok(())
    }
}
