//! The engines that compute KV for the scheduler: the real model
//! ([`ModelExecutor`]) and the simulation over a virtual KV ([`SimExecutor`]),
//! which answers from labels and counts the positions the model would compute.

use std::sync::Arc;

use aisql_models::{ClassifyRequest, Continuation, KvHandle, Qwen3, Tokenizer};

use crate::backend::{AiCall, AiRequest, InferenceBackend, OracleBackend};
use crate::error::Result;
use crate::kv_cache::KvOps;

/// What the scheduler asks of an execution engine (the model or a simulation).
pub trait Executor: Send + Sync {
    /// KV handle type.
    type Kv: KvOps + Send + Sync;
    /// Name recorded in results.
    fn name(&self) -> &str;
    /// Prefills each `(parent, tokens)`; one handle per item.
    fn prefill(&self, items: &[(Option<&Self::Kv>, &[u32])]) -> Result<Vec<Self::Kv>>;
    /// TRUE/FALSE after each `(prefix, suffix)`; the suffix may be empty when the
    /// prefix ends with the whole prompt. `requests` are the matching prompts.
    fn decide(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&Self::Kv>, &[u32])],
    ) -> Result<Vec<bool>>;
    /// Label index after each `(prefix, suffix)`, scoring `labels` (token ids of `" " + label`).
    fn classify(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&Self::Kv>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>>;
    /// Prompt positions computed so far (label continuations excluded).
    fn fresh_tokens(&self) -> u64;
    /// Label-continuation positions computed so far.
    fn label_tokens(&self) -> u64;
    /// KV bytes per cached position (for the budget check).
    fn kv_bytes_per_token(&self) -> usize;
    /// Longest prompt the model was trained for (`max_position_embeddings`).
    fn max_positions(&self) -> usize;
    /// Bytes per second the simulation charges for moving KV between device
    /// and host memory; `None` where the moves really happen (their time is
    /// in the query's).
    fn simulated_link_bytes_per_second(&self) -> Option<f64> {
        None
    }
}

/// The host link the simulation assumes: PCIe 5 ×16, about 50 GB/s, as an
/// H200's host has.
pub const SIMULATED_LINK_BYTES_PER_SECOND: f64 = 50e9;

impl KvOps for KvHandle {
    fn prefix(&self, len: usize) -> Result<Self> {
        Ok(KvHandle::prefix(self, len)?)
    }
    fn bytes(&self) -> usize {
        self.segment_bytes()
    }
    fn len(&self) -> usize {
        KvHandle::len(self)
    }
    fn segment_len(&self) -> usize {
        KvHandle::segment_len(self)
    }
    fn is_resident(&self) -> bool {
        KvHandle::is_resident(self)
    }
    fn host_bytes(&self) -> usize {
        KvHandle::host_bytes(self)
    }
    fn offload(&self) -> Result<()> {
        Ok(KvHandle::offload(self)?)
    }
    fn restore(&self) -> Result<()> {
        Ok(KvHandle::restore(self)?)
    }
}

/// The real model.
pub struct ModelExecutor {
    model: Arc<Qwen3>,
    answers: aisql_models::AnswerIds,
    name: String,
}

impl ModelExecutor {
    /// Wraps a loaded model; `tokenizer` gives the TRUE/FALSE ids.
    pub fn new(model: Arc<Qwen3>, tokenizer: &Tokenizer, name: impl Into<String>) -> Result<Self> {
        Ok(Self {
            answers: tokenizer.answer_ids()?,
            model,
            name: name.into(),
        })
    }
}

/// Index of the best score; ties go to the earlier label (SPEC §B.5).
pub fn best_label(scores: &[f32]) -> usize {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best
}

impl Executor for ModelExecutor {
    type Kv = KvHandle;

    fn name(&self) -> &str {
        &self.name
    }

    fn prefill(&self, items: &[(Option<&KvHandle>, &[u32])]) -> Result<Vec<KvHandle>> {
        let conts: Vec<Continuation<'_>> = items
            .iter()
            .map(|(p, t)| Continuation::new(*p, t))
            .collect();
        Ok(self.model.prefill_batch(&conts)?)
    }

    fn decide(
        &self,
        _call: &AiCall,
        _requests: &[AiRequest<'_>],
        items: &[(Option<&KvHandle>, &[u32])],
    ) -> Result<Vec<bool>> {
        let conts: Vec<Continuation<'_>> = items
            .iter()
            .map(|(p, t)| Continuation::new(*p, t))
            .collect();
        Ok(self
            .model
            .decide(&conts, &self.answers)?
            .into_iter()
            .map(|d| d.answer)
            .collect())
    }

    fn classify(
        &self,
        _call: &AiCall,
        _requests: &[AiRequest<'_>],
        items: &[(Option<&KvHandle>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>> {
        let reqs: Vec<ClassifyRequest<'_>> = items
            .iter()
            .map(|(p, t)| ClassifyRequest {
                prefix: *p,
                prompt: t,
                labels,
            })
            .collect();
        Ok(self
            .model
            .classify(&reqs)?
            .iter()
            .map(|s| best_label(s))
            .collect())
    }

    fn fresh_tokens(&self) -> u64 {
        self.model.fresh_tokens() - self.model.label_tokens()
    }

    fn label_tokens(&self) -> u64 {
        self.model.label_tokens()
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.model.kv_bytes_per_token()
    }

    fn max_positions(&self) -> usize {
        self.model.config().max_position_embeddings
    }
}

/// A virtual KV: only the positions it covers.
#[derive(Debug, Clone)]
pub struct VirtualKv {
    len: usize,
    segment: usize,
    bytes_per_token: usize,
    /// Shared by clones, as a real handle's place is: offloading one offloads all.
    resident: Arc<std::sync::atomic::AtomicBool>,
}

impl VirtualKv {
    fn new(len: usize, segment: usize, bytes_per_token: usize, resident: bool) -> Self {
        Self {
            len,
            segment,
            bytes_per_token,
            resident: Arc::new(std::sync::atomic::AtomicBool::new(resident)),
        }
    }
}

impl KvOps for VirtualKv {
    fn prefix(&self, len: usize) -> Result<Self> {
        // A real view copies the positions of its own segment it keeps.
        let start = self.len - self.segment;
        Ok(VirtualKv::new(
            len,
            if len > start { len - start } else { len },
            self.bytes_per_token,
            self.is_resident(),
        ))
    }
    fn bytes(&self) -> usize {
        if self.is_resident() {
            self.segment * self.bytes_per_token
        } else {
            0
        }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn segment_len(&self) -> usize {
        self.segment
    }
    fn is_resident(&self) -> bool {
        self.resident.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn host_bytes(&self) -> usize {
        if self.is_resident() {
            0
        } else {
            self.segment * self.bytes_per_token
        }
    }
    fn offload(&self) -> Result<()> {
        self.resident
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn restore(&self) -> Result<()> {
        self.resident
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Bytes per position the simulation charges by default: Qwen3-4B in bf16
/// (36 layers × K and V × 8 KV heads × 128 dims × 2 bytes).
pub const QWEN3_4B_KV_BYTES_PER_TOKEN: usize = 147_456;

/// Qwen3-4B's `max_position_embeddings`: the simulation refuses longer prompts
/// as the model would.
pub const QWEN3_4B_MAX_POSITIONS: usize = 40_960;

/// The simulation: no forward passes; answers from labels; counts positions.
pub struct SimExecutor {
    oracle: OracleBackend,
    bytes_per_token: usize,
    fresh: std::sync::atomic::AtomicU64,
    labels: std::sync::atomic::AtomicU64,
}

impl SimExecutor {
    /// A simulation answering from `oracle`, charging `bytes_per_token` of KV
    /// per cached position (the model it stands for).
    pub fn new(oracle: OracleBackend, bytes_per_token: usize) -> Self {
        Self {
            oracle,
            bytes_per_token,
            fresh: Default::default(),
            labels: Default::default(),
        }
    }
}

impl Executor for SimExecutor {
    type Kv = VirtualKv;

    fn name(&self) -> &str {
        "simulation"
    }

    fn prefill(&self, items: &[(Option<&VirtualKv>, &[u32])]) -> Result<Vec<VirtualKv>> {
        Ok(items
            .iter()
            .map(|(p, t)| {
                self.fresh
                    .fetch_add(t.len() as u64, std::sync::atomic::Ordering::Relaxed);
                VirtualKv::new(
                    p.map_or(0, |k| k.len) + t.len(),
                    t.len(),
                    self.bytes_per_token,
                    true,
                )
            })
            .collect())
    }

    fn decide(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&VirtualKv>, &[u32])],
    ) -> Result<Vec<bool>> {
        let fed: usize = items.iter().map(|(_, t)| t.len()).sum();
        self.fresh
            .fetch_add(fed as u64, std::sync::atomic::Ordering::Relaxed);
        self.oracle.decide(call, requests)
    }

    fn classify(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&VirtualKv>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>> {
        let fed: usize = items.iter().map(|(_, t)| t.len()).sum();
        let label_fed: usize = labels.iter().map(|l| l.len().saturating_sub(1)).sum();
        self.fresh
            .fetch_add(fed as u64, std::sync::atomic::Ordering::Relaxed);
        self.labels.fetch_add(
            (label_fed * items.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.oracle.classify(call, requests)
    }

    fn fresh_tokens(&self) -> u64 {
        self.fresh.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn label_tokens(&self) -> u64 {
        self.labels.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    fn max_positions(&self) -> usize {
        QWEN3_4B_MAX_POSITIONS
    }

    fn simulated_link_bytes_per_second(&self) -> Option<f64> {
        Some(SIMULATED_LINK_BYTES_PER_SECOND)
    }
}
