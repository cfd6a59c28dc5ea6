//! Answering AI calls: the call vocabulary and what each answer kind is, the
//! backend trait and its prompts, the typed work measurements, and what serves
//! a backend: the model scheduler with its KV tiers, the memo and answer
//! cache, shards and remote workers.

pub mod answer_cache;
pub mod backend;
pub mod backend_meta;
pub mod call;
pub mod distributed;
pub mod field_type;
pub mod grammar;
pub mod key_trie;
pub mod kinds;
pub mod kv_cache;
pub mod kv_store;
pub mod lazy;
pub mod memo;
pub mod prompt;
pub mod scheduler;
pub mod shard;
pub mod work;
