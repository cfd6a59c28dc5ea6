//! Three in-process workers ([`ShardedBackend`]), each document's questions on
//! one of them: every one of the 43 plans gives the rows and answer tables of
//! one process in simulation, with each worker doing part of the work and the
//! fresh tokens summed over the workers those of one process but for openings
//! that documents on different workers share; the tiny model on three CPU
//! workers answers IMDB-7, FEV-8, IMDB-15 and AGENT-1 as one model does.
//! The same holds across the wire: three loopback `aisql worker` services
//! (datafusion-distributed's gRPC worker, [`LoopbackWorker`]) give the rows and
//! answer tables of one process for all 43 plans, and the very fresh tokens of
//! three in-process workers, and the tiny model behind them answers as one.
//! Two coordinators running queries at once on one shared worker each get the
//! rows, answer tables and fresh tokens of a process of their own.

mod common;

use std::sync::Arc;

use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::quailb::plan::QueryPlan;
use aisql_engine::inference::answer_cache::AnswerIdentity;
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::inference::distributed::{LoopbackWorker, ServedModel, connect_workers};
use aisql_engine::inference::scheduler::{SchedulerConfig, simulation_backend};
use aisql_engine::inference::shard::ShardedBackend;
use aisql_engine::sql::options::QueryOptions;
use common::*;

const WORKERS: usize = 3;

fn unbounded() -> SchedulerConfig {
    SchedulerConfig {
        prefix_cache: true,
        lookahead: true,
        kv_budget_bytes: usize::MAX / 4,
        host_kv_budget_bytes: 0,
        batch_tokens: 512,
    }
}

fn same_answers(id: &str, a: &Collected, b: &Collected) {
    assert_eq!(result_rows(&a.rows), result_rows(&b.rows), "{id}: rows");
    assert_eq!(a.answers.len(), b.answers.len(), "{id}");
    for (x, y) in a.answers.iter().zip(&b.answers) {
        assert_eq!(
            (&x.op_id, &x.ids, &x.answers, &x.labels),
            (&y.op_id, &y.ids, &y.answers, &y.labels),
            "{id}: answer table"
        );
    }
}

fn fresh(c: &Collected) -> u64 {
    c.measurements.fresh_tokens.unwrap().0
}

fn fresh_per_worker(c: &Collected) -> Vec<u64> {
    c.measurements
        .workers
        .as_ref()
        .unwrap()
        .0
        .iter()
        .map(|w| w.fresh_tokens.unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_43_plans_on_three_simulated_workers_in_process_and_over_the_wire_match_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let ids = catalog_ids();
    let plans = load_plans(&ids);
    let (store, _) = draw_labels(&corpus, &plans);
    let store = Arc::new(store);
    let options = QueryOptions {
        batch_rows: 8,
        ..Default::default()
    };
    let simulated = || -> Vec<Arc<dyn InferenceBackend>> {
        (0..WORKERS)
            .map(|_| {
                simulation_backend(oracle(&store), unbounded(), 1024).unwrap()
                    as Arc<dyn InferenceBackend>
            })
            .collect()
    };
    // One set of loopback workers serves every query, as a cluster does.
    let (_servers, remote) = over_the_wire(simulated()).await;
    let (mut one_total, mut sharded_total) = (0u64, 0u64);
    for (id, plan) in ids.iter().zip(&plans) {
        let one = simulation_backend(oracle(&store), unbounded(), 1024).unwrap();
        let single = collect_query(plan, &corpus.paths(), one, &options)
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let sharded = Arc::new(ShardedBackend::try_new(simulated()).unwrap());
        let spread = collect_query(plan, &corpus.paths(), sharded, &options)
            .await
            .unwrap_or_else(|e| panic!("{id} on {WORKERS} workers: {e}"));
        same_answers(id, &spread, &single);
        // Across the wire: the same rows, and each worker computes what the
        // in-process worker of the same documents computes.
        let wired = collect_query(plan, &corpus.paths(), remote.clone(), &options)
            .await
            .unwrap_or_else(|e| panic!("{id} on loopback workers: {e}"));
        same_answers(id, &wired, &single);
        let per_worker = fresh_per_worker(&spread);
        assert_eq!(fresh_per_worker(&wired), per_worker, "{id}: over the wire");
        let sum: u64 = per_worker.iter().sum();
        assert_eq!(sum, fresh(&spread), "{id}: the total is the workers' sum");
        // A worker computes what one process computes for its documents, and
        // no document twice: the sum exceeds one process only by openings that
        // documents placed on different workers share (the preamble at least).
        assert!(sum >= fresh(&single), "{id}: {sum} < {}", fresh(&single));
        assert!(
            (sum - fresh(&single)) * 20 <= fresh(&single),
            "{id}: {sum} over the workers, {} in one process",
            fresh(&single)
        );
        let documents: usize = spread.table_rows.values().sum();
        let questions: u64 = spread
            .measurements
            .workers
            .as_ref()
            .unwrap()
            .0
            .iter()
            .map(|w| w.questions)
            .sum();
        if questions as usize > 2 * WORKERS {
            let busy = per_worker.iter().filter(|&&f| f > 0).count();
            assert!(
                busy >= 2,
                "{id}: only {busy} worker(s) did any work: {per_worker:?}"
            );
        }
        eprintln!(
            "{id}: fresh {} in one process, {sum} over {WORKERS} workers {per_worker:?} ({documents} input rows)",
            fresh(&single)
        );
        one_total += fresh(&single);
        sharded_total += sum;
    }
    // Shared openings are a sliver of the work.
    assert!(
        (sharded_total as f64) < 1.10 * one_total as f64,
        "fresh tokens over the workers {sharded_total}, in one process {one_total}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tiny_model_on_three_cpu_workers_in_process_and_over_the_wire_answers_as_one() {
    use aisql_engine::inference::scheduler::{ModelSpec, load_model_backend};
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let options = QueryOptions {
        batch_rows: 8,
        ..Default::default()
    };
    let spec = ModelSpec {
        model: "tiny".into(),
        gpu: None,
        dtype: None,
        scheduler: SchedulerConfig {
            batch_tokens: 2048,
            ..unbounded()
        },
        kv_budget_from_device: false,
        host_kv_from_memory: false,
        kv_store: None,
    };
    let load = || load_model_backend(&spec).unwrap().0 as Arc<dyn InferenceBackend>;
    let (_servers, remote) = over_the_wire((0..WORKERS).map(|_| load()).collect()).await;
    for id in ["IMDB-7", "FEV-8", "IMDB-15", "AGENT-1"] {
        let plan = QueryPlan::from_file(&plans_dir().join(format!("{id}.json"))).unwrap();
        let single = collect_query(&plan, &corpus.paths(), load(), &options)
            .await
            .unwrap();
        let sharded =
            Arc::new(ShardedBackend::try_new((0..WORKERS).map(|_| load()).collect()).unwrap());
        let spread = collect_query(&plan, &corpus.paths(), sharded, &options)
            .await
            .unwrap();
        same_answers(id, &spread, &single);
        assert!(fresh(&spread) >= fresh(&single), "{id}");
        let wired = collect_query(&plan, &corpus.paths(), remote.clone(), &options)
            .await
            .unwrap_or_else(|e| panic!("{id} on loopback workers: {e}"));
        same_answers(id, &wired, &single);
        assert_eq!(
            fresh_per_worker(&wired),
            fresh_per_worker(&spread),
            "{id}: over the wire"
        );
        assert!(
            !single
                .answers
                .iter()
                .all(|t| t.answers.is_empty() && t.labels.is_empty()),
            "{id}: asked nothing"
        );
    }
}

#[test]
fn two_coordinators_at_once_on_one_worker_each_answer_as_their_own_process() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let ids: Vec<String> = catalog_ids().into_iter().take(8).collect();
    let plans = load_plans(&ids);
    let (store, _) = draw_labels(&corpus, &plans);
    let store = Arc::new(store);
    let options = QueryOptions {
        batch_rows: 8,
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _) = rt.block_on(over_the_wire(vec![
        simulation_backend(oracle(&store), unbounded(), 1024).unwrap(),
    ]));
    let addr = server[0].addr().to_string();
    let want: Vec<Collected> = ids
        .iter()
        .zip(&plans)
        .map(|(id, plan)| {
            let one = simulation_backend(oracle(&store), unbounded(), 1024).unwrap();
            rt.block_on(collect_query(plan, &corpus.paths(), one, &options))
                .unwrap_or_else(|e| panic!("{id}: {e}"))
        })
        .collect();
    // Each coordinator its own thread and runtime, as separate processes; the
    // second runs the plans in the other order, so their queries overlap.
    let run = |reversed: bool| {
        let (addr, corpus_paths, options) = (addr.clone(), corpus.paths(), options.clone());
        let order: Vec<usize> = match reversed {
            false => (0..ids.len()).collect(),
            true => (0..ids.len()).rev().collect(),
        };
        let plans = plans.clone();
        std::thread::spawn(move || {
            let worker = connect_workers(&[addr]).unwrap().pop().unwrap();
            let backend = Arc::new(worker) as Arc<dyn InferenceBackend>;
            let rt = tokio::runtime::Runtime::new().unwrap();
            order
                .into_iter()
                .map(|i| {
                    let got = rt.block_on(collect_query(
                        &plans[i],
                        &corpus_paths,
                        backend.clone(),
                        &options,
                    ));
                    (i, got.map_err(|e| e.to_string()))
                })
                .collect::<Vec<_>>()
        })
    };
    let (a, b) = (run(false), run(true));
    for (i, got) in a.join().unwrap().into_iter().chain(b.join().unwrap()) {
        let id = &ids[i];
        let got = got.unwrap_or_else(|e| panic!("{id} on the shared worker: {e}"));
        same_answers(id, &got, &want[i]);
        assert_eq!(fresh(&got), fresh(&want[i]), "{id}: fresh tokens");
    }
}

/// Serves each of `backends` from a loopback worker, and a backend over them
/// all as a coordinator connects to them.
async fn over_the_wire(
    backends: Vec<Arc<dyn InferenceBackend>>,
) -> (Vec<LoopbackWorker>, Arc<dyn InferenceBackend>) {
    tokio::task::spawn_blocking(move || {
        let identity = AnswerIdentity {
            model: "tiny".into(),
            weights_sha256: "0".repeat(64),
            tokenizer_sha256: "0".repeat(64),
            dtype: "f32".into(),
            prompt_format: String::new(),
        };
        let servers: Vec<LoopbackWorker> = backends
            .into_iter()
            .map(|b| {
                LoopbackWorker::start(ServedModel::new(b, identity.clone(), Default::default()))
                    .unwrap()
            })
            .collect();
        let addrs: Vec<String> = servers.iter().map(|w| w.addr().to_string()).collect();
        let remote = connect_workers(&addrs)
            .unwrap()
            .into_iter()
            .map(|w| Arc::new(w) as Arc<dyn InferenceBackend>)
            .collect();
        let backend =
            Arc::new(ShardedBackend::try_new(remote).unwrap()) as Arc<dyn InferenceBackend>;
        (servers, backend)
    })
    .await
    .unwrap()
}

/// The oracle over `store`, as a backend to simulate with.
fn oracle(
    store: &Arc<aisql_bench::quailb::labels::LabelStore>,
) -> Arc<dyn aisql_engine::inference::backend::Answerer> {
    Arc::new(OracleBackend::new(store.clone()))
}
