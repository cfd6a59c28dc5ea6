//! `aisql kv-store stats|verify|clear DIR`: what an on-disk KV store holds,
//! whether its blocks pass their checks, and emptying it
//! ([`aisql_engine::inference::kv_store`]).

use anyhow::bail;

use aisql_engine::data::cache_dir::cache_dir;
use aisql_engine::inference::answer_cache::{KEY_FILE, RecordKey};
use aisql_engine::inference::kv_store::{StoreStats, clear, stats};
use aisql_engine::outln;

use crate::cli::KvStoreCommand;
use crate::config::UsageError;

/// Runs one `kv-store` subcommand.
pub fn run(cmd: KvStoreCommand) -> anyhow::Result<()> {
    match cmd {
        KvStoreCommand::Stats { dir, format } => {
            let st = stats(&dir, None)?;
            match format.as_str() {
                "json" => outln!("{}", serde_json::to_string_pretty(&st)?)?,
                "text" => print_stats(&dir, &st)?,
                other => {
                    return Err(UsageError(format!("--format {other:?}: give text or json")).into());
                }
            }
        }
        KvStoreCommand::Verify { dir } => {
            // The key is read, never made: a user without one has signed
            // nothing, and every block is someone else's.
            let key_path = cache_dir().join(KEY_FILE);
            if !key_path.exists() {
                bail!(
                    "{}: no key in this user's cache folder, so no block of {} was signed by this user",
                    key_path.display(),
                    dir.display()
                );
            }
            let key = RecordKey::load_or_create(&key_path)?;
            let st = stats(&dir, Some(&key))?;
            print_stats(&dir, &st)?;
            let damaged: u64 = st.identities.iter().map(|i| i.damaged).sum();
            if damaged > 0 {
                bail!(
                    "{damaged} block(s) of {} failed their checks: a query that meets them computes their KV again, never uses them",
                    dir.display()
                );
            }
            outln!("every block passed its checks")?;
        }
        KvStoreCommand::Clear { dir } => {
            let (blocks, bytes) = clear(&dir)?;
            outln!(
                "removed {blocks} block(s), {bytes} bytes, from {}",
                dir.display()
            )?;
        }
    }
    Ok(())
}

fn print_stats(dir: &std::path::Path, st: &StoreStats) -> anyhow::Result<()> {
    outln!(
        "{}: {} bytes in blocks ({} recorded against the bound)",
        dir.display(),
        st.bytes,
        st.recorded_bytes
    )?;
    for id in &st.identities {
        let what = id.identity.as_ref().map_or_else(
            || "identity unreadable".to_string(),
            |i| {
                format!(
                    "weights {}…, {}, {}",
                    &i.weights_sha256[..12.min(i.weights_sha256.len())],
                    i.dtype,
                    i.device
                )
            },
        );
        let damaged = if id.damaged > 0 {
            format!(", {} damaged", id.damaged)
        } else {
            String::new()
        };
        outln!(
            "  {} ({what}): {} block(s), {} bytes{damaged}",
            id.key,
            id.blocks,
            id.bytes
        )?;
    }
    Ok(())
}
