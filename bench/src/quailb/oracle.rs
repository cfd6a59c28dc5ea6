//! The oracle backend: every question answered from the reference labels of a
//! collection ([`LabelStore`]), so the relational half of the engine can be
//! proved exact before any model runs, and `--simulate` can schedule a model's
//! work without one.

use std::sync::Arc;

use aisql_engine::inference::backend::{AiCall, AiKind, AiRequest, Answer, Answerer};
use aisql_engine::{EngineError, Result};

use super::labels::LabelStore;

/// Answers every question from the reference labels of a collection: the
/// relational half of the engine can be proved exact before any model runs.
#[derive(Debug, Clone)]
pub struct OracleBackend {
    labels: Arc<LabelStore>,
}

impl OracleBackend {
    /// An oracle over `labels`.
    pub fn new(labels: Arc<LabelStore>) -> Self {
        Self { labels }
    }
}

impl Answerer for OracleBackend {
    fn name(&self) -> &str {
        "oracle"
    }

    /// Decisions and labels from the reference labels; a score is the
    /// reference decision's certainty (1 or 0) and label probabilities put all
    /// mass on the reference label. No label set holds generated text.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        if call.kind.generates() {
            return Err(EngineError::NoAnswer(format!(
                "{}: the oracle has no answers for generated text ({}); run it with \
                 --simulate to count its tokens, or with a model",
                call.op_id,
                call.kind.name()
            )));
        }
        let set = self.labels.require_template(&call.template, &call.op_id)?;
        requests
            .iter()
            .map(|r| {
                let partner = r.partner.map(|p| p.id);
                if !call.kind.has_labels() {
                    let b = set.require_bool(r.anchor.id, partner)?;
                    return Ok(match call.kind {
                        AiKind::Score => Answer::Score(if b { 1.0 } else { 0.0 }),
                        _ => Answer::Bool(b),
                    });
                }
                let label = set.require_label(r.anchor.id, partner)?;
                let i = call.labels.iter().position(|l| l == label).ok_or_else(|| {
                    EngineError::NoAnswer(format!(
                        "{}: reference label {label:?} is not among the plan's labels",
                        call.op_id
                    ))
                })?;
                Ok(match call.kind {
                    AiKind::ClassifyScores => Answer::LabelScores(
                        (0..call.labels.len())
                            .map(|j| if j == i { 1.0 } else { 0.0 })
                            .collect(),
                    ),
                    _ => Answer::Label(i as u32),
                })
            })
            .collect()
    }
}
