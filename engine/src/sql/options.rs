//! How a query runs: the options every SQL, Substrait and QUAIL-B query is
//! planned and executed with (prompt layout, batching, memory, recursion,
//! budget, row errors, progress).

use crate::exec::coverage::OnRowError;
use crate::inference::prompt::PromptFormat;
use crate::limits::spend::Budget;

/// How a query runs.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// Prompt layout.
    pub format: PromptFormat,
    /// How the AI operators' progress shows on stderr.
    pub progress: crate::exec::progress::ProgressMode,
    /// Terminal progress lines go under this parent's bars (the benchmark's
    /// run bar).
    pub progress_parent: Option<indicatif::MultiProgress>,
    /// Questions each AI operator (by id) is expected to ask, from an
    /// estimate: the totals of the progress lines.
    pub expected_rows: std::collections::HashMap<String, u64>,
    /// Rows per batch streamed through the AI operators: a chain of operators
    /// handles one batch of documents at a time, so their KV stays cached.
    pub batch_rows: usize,
    /// Bytes DataFusion's operators may hold (its memory pool): the AI joins'
    /// partner sides, hash tables, sorts and the result rows. Past it a query
    /// fails with an error naming the operators holding the most.
    pub memory_limit: usize,
    /// Iterations a recursive CTE may run; past them the query fails naming it.
    pub max_recursion: usize,
    /// The model the backend answers with, as the user named it (`--model`):
    /// a Snowflake `AI_COMPLETE(model, ...)` must name this one. `None`: no
    /// model is named (any such call is refused).
    pub model: Option<String>,
    /// What each query may spend on the model, and what spending it does
    /// ([`crate::limits::spend`]); `None`: no limit.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does ([`crate::exec::coverage`]).
    pub on_row_error: OnRowError,
    /// Whether each query may use the KV earlier queries left
    /// ([`crate::inference::backend::QueryStart::reuse_earlier_kv`]).
    pub reuse_earlier_kv: bool,
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            format: PromptFormat::default(),
            progress: Default::default(),
            progress_parent: None,
            expected_rows: Default::default(),
            batch_rows: 256,
            memory_limit: crate::limits::host_memory::default_memory_limit(),
            max_recursion: crate::sql::recursion::DEFAULT_MAX_RECURSION,
            model: None,
            budget: None,
            on_row_error: OnRowError::Fail,
            reuse_earlier_kv: false,
        }
    }
}
