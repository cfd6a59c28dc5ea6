//! A backend loaded when a statement first needs it ([`LazyBackend`]):
//! sessions (`aisql sql`, the shell, `aisql serve`, Python) open at once,
//! and a statement without AI calls never loads the model. Until then the
//! backend answers what sessions ask before any AI call (table batch sizes,
//! an embedding's dimensions, the heap a query may add) from
//! [`BackendFacts`] read from the model's configuration; the first query
//! with AI calls loads it, once per process, and every later one uses it.

use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{EngineError, Result};
use crate::inference::backend::{InferenceBackend, QueryBackend, QueryStart};
use crate::inference::kv_store::KvStore;

/// What a backend says of itself before it is loaded: the values its
/// [`InferenceBackend`] methods will give once it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendFacts {
    pub name: String,
    pub reuses_work: bool,
    pub kv_capacity_tokens: Option<usize>,
    pub context_positions: Option<usize>,
    pub embedding_dims: Option<u32>,
    pub host_memory_allowance: usize,
}

impl BackendFacts {
    /// The facts `backend` gives now (to compare with what was read before
    /// it was loaded).
    pub fn of(backend: &dyn InferenceBackend) -> Self {
        Self {
            name: backend.name().to_string(),
            reuses_work: backend.reuses_work(),
            kv_capacity_tokens: backend.kv_capacity_tokens(),
            context_positions: backend.context_positions(),
            embedding_dims: backend.embedding_dims(),
            host_memory_allowance: backend.host_memory_allowance(),
        }
    }
}

/// Makes the backend: loads the model (and whatever wraps it).
pub type Load = Box<dyn FnOnce() -> Result<Arc<dyn InferenceBackend>> + Send>;

/// A backend made by its [`Load`] when a query with AI calls begins.
pub struct LazyBackend {
    facts: BackendFacts,
    /// Taken by the load that runs it; held while it runs, so that a second
    /// query beginning meanwhile waits for the same load.
    load: Mutex<Option<Load>>,
    loaded: OnceLock<Arc<dyn InferenceBackend>>,
}

impl LazyBackend {
    pub fn new(facts: BackendFacts, load: Load) -> Self {
        Self {
            facts,
            load: Mutex::new(Some(load)),
            loaded: OnceLock::new(),
        }
    }

    /// Whether the backend has been loaded.
    pub fn is_loaded(&self) -> bool {
        self.loaded.get().is_some()
    }

    /// The loaded backend, loading it first if need be. A load that fails
    /// leaves the backend unloadable: every later query gets the same
    /// error's cause, not a half-made backend.
    fn backend(&self) -> Result<&Arc<dyn InferenceBackend>> {
        if let Some(backend) = self.loaded.get() {
            return Ok(backend);
        }
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(backend) = self.loaded.get() {
            return Ok(backend);
        }
        let Some(make) = load.take() else {
            return Err(EngineError::Inference(
                "the model failed to load earlier in this process (see the first error)".into(),
            ));
        };
        let backend = make()?;
        let found = BackendFacts::of(&*backend);
        if found != self.facts {
            return Err(EngineError::Inference(format!(
                "the loaded model does not match what its configuration said before loading: \
                 {found:?} against {:?}",
                self.facts
            )));
        }
        Ok(self.loaded.get_or_init(|| backend))
    }
}

impl InferenceBackend for LazyBackend {
    fn name(&self) -> &str {
        &self.facts.name
    }

    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        self.backend()?.clone().begin(start)
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.facts.kv_capacity_tokens
    }

    fn context_positions(&self) -> Option<usize> {
        self.facts.context_positions
    }

    fn embedding_dims(&self) -> Option<u32> {
        self.facts.embedding_dims
    }

    fn host_memory_allowance(&self) -> usize {
        self.facts.host_memory_allowance
    }

    fn reuses_work(&self) -> bool {
        self.facts.reuses_work
    }

    fn turn_order(&self) -> Option<String> {
        // A local model: no order among shared backends to keep.
        None
    }

    /// The store is opened with the model (it is keyed by the weights'
    /// digest): asking for it loads the model.
    fn kv_store(&self) -> Option<Arc<KvStore>> {
        self.backend().ok()?.kv_store()
    }
}

impl std::fmt::Debug for LazyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyBackend")
            .field("facts", &self.facts)
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::scheduler::{ModelSpec, describe_model_backend, load_model_backend};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn tiny_spec() -> ModelSpec {
        ModelSpec {
            model: "tiny".into(),
            gpu: None,
            dtype: None,
            scheduler: Default::default(),
            kv_budget_from_device: true,
            host_kv_from_memory: true,
            kv_store: None,
        }
    }

    #[test]
    fn the_facts_read_before_loading_are_the_loaded_backends() {
        let spec = tiny_spec();
        let facts = describe_model_backend(&spec).unwrap().expect("a CPU model");
        let (loaded, _) = load_model_backend(&spec).unwrap();
        assert_eq!(facts, BackendFacts::of(&*loaded));
        for dtype in [aisql_models::Precision::Bf16, aisql_models::Precision::Q8_0] {
            let spec = ModelSpec {
                dtype: Some(dtype),
                ..tiny_spec()
            };
            let facts = describe_model_backend(&spec).unwrap().unwrap();
            let (loaded, _) = load_model_backend(&spec).unwrap();
            assert_eq!(facts, BackendFacts::of(&*loaded), "{dtype}");
        }
        // A GPU's KV budget depends on the memory its weights leave.
        let gpu = ModelSpec {
            gpu: Some(0),
            ..tiny_spec()
        };
        assert!(describe_model_backend(&gpu).unwrap().is_none());
    }

    #[test]
    fn the_model_loads_once_at_the_first_query_and_a_failed_load_is_said_again() {
        // One spec for both: the default KV budget is a share of the memory
        // available when it is made.
        let spec = tiny_spec();
        let facts = describe_model_backend(&spec).unwrap().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = loads.clone();
        let lazy = Arc::new(LazyBackend::new(
            facts.clone(),
            Box::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(load_model_backend(&spec)?.0 as Arc<dyn InferenceBackend>)
            }),
        ));
        // What sessions ask before any AI call loads nothing.
        assert_eq!(BackendFacts::of(&*lazy), facts);
        assert!(!lazy.is_loaded());
        let queries: Vec<_> = (0..3)
            .map(|_| {
                let lazy = lazy.clone();
                std::thread::spawn(move || lazy.begin(QueryStart::default()).map(|_| ()))
            })
            .collect();
        for query in queries {
            query.join().unwrap().unwrap();
        }
        assert!(lazy.is_loaded());
        assert_eq!(loads.load(Ordering::SeqCst), 1);

        let failing = Arc::new(LazyBackend::new(
            facts,
            Box::new(|| Err(EngineError::Inference("no weights here".into()))),
        ));
        let first = failing.clone().begin(QueryStart::default()).err().unwrap();
        assert!(first.to_string().contains("no weights here"), "{first}");
        let again = failing.clone().begin(QueryStart::default()).err().unwrap();
        assert!(
            again.to_string().contains("failed to load earlier"),
            "{again}"
        );
    }
}
