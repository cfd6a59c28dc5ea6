//! The KV memory budget: how many bytes of KV a query may hold, by default on
//! a CPU and on a GPU once the weights are loaded. Not the spend budget
//! ([`super::spend_gate`]), which bounds the model's work.

/// A quarter of the memory available now (within the process's cgroup and
/// address-space limits), at most 16 GiB.
pub fn default_kv_budget_bytes() -> usize {
    let available = crate::limits::host_memory::memory_available().unwrap_or(8 << 30);
    (available / 4).min(16 << 30)
}

/// Host memory for KV offloaded from a GPU: a quarter of the memory available now.
pub fn default_host_kv_budget_bytes() -> usize {
    crate::limits::host_memory::memory_available().unwrap_or(8 << 30) / 4
}

/// KV budget on a GPU with `free` bytes free after loading the weights: 70 % of it,
/// less 4 GiB kept for activations (a forward batch of 8,192 tokens and the score
/// matrices of a large shared-prefix run each take a few GiB).
pub fn gpu_kv_budget_bytes(free: usize) -> usize {
    (free / 10 * 7).saturating_sub(4 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200 with Qwen3-4B's bf16 weights loaded keeps close to 90 GiB for KV
    /// (the simulation assumes 100 GiB); a nearly full GPU gets no budget rather
    /// than a negative one (the scheduler then names the document that does not fit).
    #[test]
    fn gpu_kv_budget_leaves_room_for_activations() {
        let gib = 1usize << 30;
        let h200_after_4b = 131 * gib;
        let budget = gpu_kv_budget_bytes(h200_after_4b);
        assert!((87 * gib..88 * gib).contains(&budget), "{}", budget / gib);
        assert_eq!(gpu_kv_budget_bytes(5 * gib), 0);
    }
}
