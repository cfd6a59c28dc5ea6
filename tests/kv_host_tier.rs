//! IMDB-9 and IMDB-10 visit every review as an anchor twice (r1 then r2), far
//! apart. With a device KV budget far smaller than the documents, their KV is
//! evicted in between and computed again — unless a host tier keeps it (it
//! moves to host memory and comes back by copy), or look-ahead asks each review
//! r2's questions before its KV is dropped. In simulation, at three device
//! budgets, the fresh tokens then equal those of an unbounded KV cache (the
//! minimum: every distinct prefix once) with a host tier, and stay within
//! 0.5 % of it with look-ahead alone; the answers are those of the unbounded run.

mod common;

use std::sync::Arc;

use aisql_bench::quailb::labels::LabelStore;
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::quailb::plan::QueryPlan;
use aisql_bench::quailb::query::QueryOutput;
use aisql_engine::inference::scheduler::{SchedulerConfig, simulation_backend};
use aisql_engine::sql::options::QueryOptions;
use common::*;

/// Simulated KV bytes per position: small, so the tiny corpus outgrows budgets.
const BYTES_PER_TOKEN: usize = 1024;

fn count(out: &QueryOutput, key: &str) -> u64 {
    out.measurements.to_json()[key].as_u64().unwrap()
}

/// Queries of one tiny corpus run in simulation.
struct Simulation<'a> {
    corpus: &'a TinyCorpus,
    store: Arc<LabelStore>,
    options: QueryOptions,
}

impl<'a> Simulation<'a> {
    /// Labels for `plans` drawn over `corpus`; AI operators stream
    /// `batch_rows` rows at a time.
    fn new(corpus: &'a TinyCorpus, plans: &[QueryPlan], batch_rows: usize) -> Self {
        let (store, _) = draw_labels(corpus, plans);
        Self {
            corpus,
            store: Arc::new(store),
            options: QueryOptions {
                batch_rows,
                ..Default::default()
            },
        }
    }

    /// Runs `plan` with a device KV budget of `device` bytes and a host tier
    /// of `host`.
    async fn run(
        &self,
        device: usize,
        host: usize,
        lookahead: bool,
        plan: &QueryPlan,
    ) -> Collected {
        let config = SchedulerConfig {
            prefix_cache: true,
            lookahead,
            kv_budget_bytes: device,
            host_kv_budget_bytes: host,
            batch_tokens: 512,
        };
        let backend = simulation_backend(
            Arc::new(OracleBackend::new(self.store.clone())),
            config,
            BYTES_PER_TOKEN,
        )
        .unwrap();
        collect_query(plan, &self.corpus.paths(), backend, &self.options)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tier_or_lookahead_keeps_imdb_9_and_10_at_the_minimum_under_small_kv_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let ids = ["IMDB-9", "IMDB-10"];
    let plans = load_plans(&ids);
    let sim = Simulation::new(&corpus, &plans, 8);
    for (id, plan) in ids.iter().zip(&plans) {
        let unbounded = sim.run(usize::MAX / 2, 0, true, plan).await;
        let minimum = count(&unbounded, "fresh_tokens");
        let peak = count(&unbounded, "kv_peak_bytes") as usize;
        assert!(!unbounded.answers.is_empty() && minimum > 0, "{id}");
        for device in [peak / 16, peak / 8, peak / 4] {
            let without = sim.run(device, 0, false, plan).await;
            let ahead = sim.run(device, 0, true, plan).await;
            let with = sim.run(device, usize::MAX / 2, false, plan).await;
            let (fresh_without, fresh_ahead, fresh_with) = (
                count(&without, "fresh_tokens"),
                count(&ahead, "fresh_tokens"),
                count(&with, "fresh_tokens"),
            );
            eprintln!(
                "{id} device {device} B: fresh {fresh_without} with neither, {fresh_ahead} \
                 with look-ahead ({} asked ahead, {} questions of which {} unused), \
                 {fresh_with} with a host tier (minimum {minimum}), {} positions restored",
                count(&ahead, "speculative_tokens"),
                count(&ahead, "speculative_questions"),
                count(&ahead, "speculative_unused"),
                count(&with, "restored_tokens")
            );
            // The budget bites: with neither, reviews are computed twice.
            assert!(fresh_without > minimum, "{id} at {device} B");
            assert!(count(&without, "speculative_tokens") == 0, "{id}");
            // Look-ahead asks r2's questions before a review is dropped.
            assert!(
                count(&ahead, "speculative_tokens") > 0,
                "{id} at {device} B"
            );
            assert!(
                fresh_ahead as f64 <= minimum as f64 * 1.005,
                "{id} at {device} B: {fresh_ahead} > {minimum} × 1.005"
            );
            assert_eq!(fresh_with, minimum, "{id} at {device} B");
            assert!(count(&with, "restored_tokens") > 0, "{id} at {device} B");
            // Moving KV is charged at the simulated host link, both ways.
            let moved = count(&with, "kv_offloaded_bytes") + count(&with, "kv_restored_bytes");
            let seconds = with.measurements.kv_transfer_seconds.unwrap().0;
            assert!(moved > 0, "{id}");
            assert!(
                (seconds
                    - moved as f64
                        / aisql_engine::inference::scheduler::SIMULATED_LINK_BYTES_PER_SECOND)
                    .abs()
                    < 1e-12,
                "{id}: {seconds} s for {moved} bytes"
            );
            assert!(count(&with, "kv_peak_bytes") as usize <= peak, "{id}");
            for out in [&without, &ahead, &with] {
                assert_eq!(
                    result_rows(&out.rows),
                    result_rows(&unbounded.rows),
                    "{id} at {device} B: rows"
                );
                for (a, b) in out.answers.iter().zip(&unbounded.answers) {
                    assert_eq!(
                        (&a.ids, &a.answers, &a.labels),
                        (&b.ids, &b.answers, &b.labels),
                        "{id} {}",
                        a.op_id
                    );
                }
            }
        }
        // A host tier too small for the reviews still answers the same.
        let small = sim.run(peak / 8, peak / 8, true, plan).await;
        assert_eq!(
            result_rows(&small.rows),
            result_rows(&unbounded.rows),
            "{id}"
        );
        assert!(
            count(&small, "kv_host_peak_bytes") as usize <= peak / 8,
            "{id}"
        );
    }
}

/// Agent-trace snapshots extend one another, so they share their trajectory's
/// KV. AGENT-3 and AGENT-4 ask two questions of every snapshot (the second of
/// those the first keeps). With both tiers far smaller than the traces, a
/// snapshot that leaves the device must take its trajectory's start with it,
/// and a dropped one the start only dropped snapshots used: otherwise that KV
/// stays on the device owned by no document, crowds out the documents still
/// wanted, and the second question recomputes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_snapshots_keep_the_minimum_when_both_tiers_are_small() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path()).with_agent_snapshots(24, 4);
    let ids = ["AGENT-3", "AGENT-4"];
    let plans = load_plans(&ids);
    let sim = Simulation::new(&corpus, &plans, 4);
    for (id, plan) in ids.iter().zip(&plans) {
        let unbounded = sim.run(usize::MAX / 2, 0, true, plan).await;
        let minimum = count(&unbounded, "fresh_tokens");
        let peak = count(&unbounded, "kv_peak_bytes") as usize;
        for device in [peak / 16, peak / 8, peak / 4] {
            // The host tier at the H200's ratio (256 GiB for 100 GiB of device).
            let out = sim.run(device, device * 5 / 2, true, plan).await;
            let fresh = count(&out, "fresh_tokens");
            eprintln!(
                "{id} device {device} B: fresh {fresh} (minimum {minimum}), {} evictions, \
                 device peak {} B, {} positions restored",
                count(&out, "kv_evictions"),
                count(&out, "kv_peak_bytes"),
                count(&out, "restored_tokens")
            );
            assert!(
                count(&out, "kv_evictions") > 0,
                "{id} at {device} B: the budget bites"
            );
            assert!(
                fresh as f64 <= minimum as f64 * 1.005,
                "{id} at {device} B: {fresh} > {minimum} × 1.005"
            );
            assert_eq!(
                result_rows(&out.rows),
                result_rows(&unbounded.rows),
                "{id} at {device} B: rows"
            );
        }
    }
}

/// The same on the tiny model: KV moved to the host and back by the real
/// handles (an offloaded handle used without a restore is an error, so a
/// forgotten restore fails the run), the answers and fresh tokens those of an
/// unbounded cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_restores_offloaded_kv_and_answers_the_same() {
    use aisql_engine::inference::scheduler::{ModelSpec, load_model_backend};
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let plan = QueryPlan::from_file(&plans_dir().join("IMDB-9.json")).unwrap();
    let options = QueryOptions {
        batch_rows: 8,
        ..Default::default()
    };
    let run = |device: usize, host: usize| {
        let spec = ModelSpec {
            model: "tiny".into(),
            gpu: None,
            dtype: None,
            scheduler: SchedulerConfig {
                prefix_cache: true,
                lookahead: true,
                kv_budget_bytes: device,
                host_kv_budget_bytes: host,
                batch_tokens: 2048,
            },
            kv_budget_from_device: false,
            host_kv_from_memory: false,
            kv_store: None,
        };
        let (paths, options, plan) = (corpus.paths(), options.clone(), plan.clone());
        async move {
            let (backend, _) = load_model_backend(&spec).unwrap();
            collect_query(&plan, &paths, backend, &options)
                .await
                .unwrap()
        }
    };
    let unbounded = run(usize::MAX / 2, 0).await;
    let peak = count(&unbounded, "kv_peak_bytes") as usize;
    let tiered = run(peak / 8, usize::MAX / 2).await;
    assert!(count(&tiered, "restored_tokens") > 0);
    // The model's moves really happen: their time is the query's, not simulated.
    assert!(tiered.measurements.kv_transfer_seconds.is_none());
    assert_eq!(
        count(&tiered, "fresh_tokens"),
        count(&unbounded, "fresh_tokens")
    );
    assert_eq!(result_rows(&tiered.rows), result_rows(&unbounded.rows));
    for (a, b) in tiered.answers.iter().zip(&unbounded.answers) {
        assert_eq!(
            (&a.ids, &a.answers, &a.labels),
            (&b.ids, &b.answers, &b.labels),
            "{}",
            a.op_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_keeps_only_the_token_ids_of_the_tables_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let ids = ["IMDB-2", "FEV-3", "IMDB-2"];
    let plans = load_plans(&ids);
    let sim = Simulation::new(&corpus, &plans, 8);
    let backend = simulation_backend(
        Arc::new(OracleBackend::new(sim.store.clone())),
        SchedulerConfig::default(),
        BYTES_PER_TOKEN,
    )
    .unwrap();
    let mut fresh = Vec::new();
    let mut held = Vec::new();
    for plan in &plans {
        let out = collect_query(plan, &corpus.paths(), backend.clone(), &sim.options)
            .await
            .unwrap();
        fresh.push(count(&out, "fresh_tokens"));
        held.push(backend.tokenized_tables());
    }
    let tables_of = |plan: &QueryPlan| {
        let mut t = plan.tables();
        t.sort();
        t
    };
    // The next query forgets the last one's documents, not its own.
    for (plan, held) in plans.iter().zip(&held) {
        let read = tables_of(plan);
        assert!(!held.is_empty(), "{held:?}");
        assert!(
            held.iter().all(|t| read.contains(t)),
            "{held:?} not within {read:?}"
        );
    }
    assert!(held[1].iter().all(|t| !held[0].contains(t)), "{held:?}");
    // Tokenized again, the documents cost what they cost the first time.
    assert_eq!(fresh[0], fresh[2]);
}
