//! Substrait plan files: read (`.json` as ProtoJSON, anything else as binary
//! protobuf), decoded and encoded, whoever produced them.

use std::path::Path;

use datafusion_substrait::substrait::proto::Plan;
use prost::Message;

use crate::error::{EngineError, Result};

/// Reads a plan file, a regular file ([`crate::data::input_file`]): `.json` as
/// Substrait ProtoJSON, `.substrait`/`.pb` (or anything else) as binary protobuf.
pub fn read_plan_file(path: &Path) -> Result<Plan> {
    let bytes = crate::data::input_file::read(path).map_err(|e| EngineError::io(path, e))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    decode_plan(&bytes, is_json).map_err(|message| EngineError::PlanFile {
        path: path.display().to_string(),
        message,
    })
}

/// Decodes plan bytes as ProtoJSON (`json = true`) or binary protobuf.
pub fn decode_plan(bytes: &[u8], json: bool) -> std::result::Result<Plan, String> {
    if json {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        serde_json::from_str::<Plan>(text).map_err(|e| format!("malformed Substrait JSON: {e}"))
    } else {
        Plan::decode(bytes).map_err(|e| format!("malformed Substrait protobuf: {e}"))
    }
}

/// Serializes a plan as binary protobuf (the `plan.substrait` output file).
pub fn encode_plan(plan: &Plan) -> Vec<u8> {
    plan.encode_to_vec()
}
