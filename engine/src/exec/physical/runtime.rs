//! One query's AI state ([`AiRuntime`]): made by whoever runs the query and
//! found by its AI operators in the query's task context.

use super::*;

/// One query's AI state, shared by its AI operators: made for each query by
/// whoever runs it ([`crate::sql::SqlSession::run_plan_into`]) and handed to
/// the operators in the query's task context ([`AiRuntime::of`]), so a
/// physical plan holds nothing of any query.
pub struct AiRuntime {
    /// The query on the backend, which answers.
    pub query: Arc<dyn QueryBackend>,
    /// Where answers are recorded.
    pub recorder: Arc<AnswerRecorder>,
    /// The query's answers so far, shared by its operators.
    pub memo: std::sync::Mutex<AnswerMemo>,
    /// The budget and row-error policy, and the query's rows answered,
    /// failed and not reached per operator.
    pub controls: Arc<QueryControls>,
    /// The query's live progress.
    pub progress: Arc<crate::exec::progress::Progress>,
}

impl fmt::Debug for AiRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AiRuntime").finish_non_exhaustive()
    }
}

impl AiRuntime {
    /// The runtime of the query `context` runs: an error outside a query
    /// (a plan executed by hand, without one).
    pub fn of(context: &TaskContext) -> DfResult<Arc<AiRuntime>> {
        context
            .session_config()
            .get_extension::<AiRuntime>()
            .ok_or_else(|| {
                DataFusionError::Execution(
                    "an AI operator runs only within a query: run the plan through the SQL \
                     session (SqlSession::run_plan_into), which begins the query on its backend"
                        .into(),
                )
            })
    }
}
