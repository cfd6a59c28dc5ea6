//! AI operator work on other processes and hosts, through datafusion-distributed.
//!
//! An `aisql worker` holds one model on one device and serves
//! datafusion-distributed's gRPC worker service ([`serve`]). A coordinator
//! (`--workers ADDR,...`) keeps planning and the relational part of the query,
//! and sends each worker its share of every AI batch as a [`WorkerTaskExec`]
//! stage, encoded by [`WorkerTaskCodec`] ([`RemoteWorker`]). The share is
//! chosen by [`ShardedBackend`](crate::inference::shard::ShardedBackend), by document, the
//! same rule as for several GPUs of one host: a document's KV lives on one
//! worker, and every question, partner and later operator about it goes there.
//!
//! A worker runs only aisql's `WorkerTaskExec` stages, asks the shared token
//! of every call when it has one, and checks sizes and ranges of a request
//! before the worker service sees it ([`guard`]); it serves several
//! coordinators' queries one after the other ([`worker`]).
//!
//! datafusion-distributed has no task retries; a query that loses a worker fails
//! naming it, and `--answer-cache` on the coordinator makes its rerun ask only
//! what was not answered yet.

mod codec;
mod guard;
mod message;
mod remote;
pub(crate) mod task;
#[cfg(test)]
mod wire_tests;
mod worker;

pub use codec::WorkerTaskCodec;
pub use guard::{
    GuardedMethod, MAX_MESSAGE_BYTES, MAX_PARTITIONS, MAX_TASKS, TOKEN_HEADER, check_request,
    check_worker_plan,
};
pub use message::{
    PROTOCOL, QueryId, WireDoc, WireRequests, WorkerHello, WorkerMessage, WorkerReply, WorkerTask,
    decode_task,
};
pub use remote::{
    ConnectOptions, DEFAULT_CALL_TIMEOUT, RemoteWorker, connect_workers, connect_workers_with,
    worker_url,
};
pub use task::{REPLY_COLUMN, WorkerTaskExec, reply_schema};
pub use worker::{DEFAULT_QUERY_IDLE, LoopbackWorker, ServeOptions, ServedModel, answer, serve};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::error::Result;
    use crate::inference::answer_cache::AnswerIdentity;
    use crate::inference::backend::{
        AiCall, AiKind, AiRequest, Answer, Answered, Answerer, AskTyped, ContentHashBackend, Doc,
        InferenceBackend, QueryBackend, QueryStart, test_call, test_requests,
    };
    use crate::inference::shard::ShardedBackend;
    use crate::inference::work::{Sum, Work};

    /// The by-length rule's answer: TRUE when anchor and partner lengths sum
    /// to an even number.
    pub(super) fn even_length(r: &AiRequest<'_>) -> bool {
        (r.anchor.text.len() + r.partner.map_or(0, |p| p.text.len())).is_multiple_of(2)
    }

    /// The by-length rule's label: the anchor's length modulo the label count.
    pub(super) fn label_by_length(r: &AiRequest<'_>, labels: usize) -> usize {
        r.anchor.text.len() % labels.max(1)
    }

    /// The by-length answers of `call`'s questions: a decision is
    /// [`even_length`], a label [`label_by_length`].
    pub(super) fn answers_by_length(call: &AiCall, requests: &[AiRequest<'_>]) -> Vec<Answer> {
        requests
            .iter()
            .map(|r| {
                if call.kind.has_labels() {
                    Answer::Label(label_by_length(r, call.labels.len()) as u32)
                } else {
                    Answer::Bool(even_length(r))
                }
            })
            .collect()
    }

    /// Answers by the text ([`even_length`], [`label_by_length`]). Counts its
    /// questions.
    struct ByLength {
        asked: std::sync::atomic::AtomicUsize,
    }

    /// Its queries are itself: one "fresh token" a decision asked.
    impl InferenceBackend for ByLength {
        fn name(&self) -> &str {
            "model"
        }
        fn begin(self: Arc<Self>, _: QueryStart) -> Result<Arc<dyn QueryBackend>> {
            Ok(self)
        }
    }

    impl QueryBackend for ByLength {
        fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
            let asked = if call.kind.is_decision() {
                self.asked
                    .fetch_add(requests.len(), std::sync::atomic::Ordering::Relaxed);
                requests.len() as u64
            } else {
                0
            };
            Ok(Answered {
                answers: answers_by_length(call, requests),
                work: Work {
                    fresh_tokens: Some(Sum(asked)),
                    ..Work::default()
                },
            })
        }
        fn work(&self) -> Work {
            let asked = self.asked.load(std::sync::atomic::Ordering::Relaxed);
            Work {
                fresh_tokens: Some(Sum(asked as u64)),
                ..Work::default()
            }
        }
    }

    fn identity(dtype: &str) -> AnswerIdentity {
        AnswerIdentity {
            model: "tiny".into(),
            weights_sha256: "ab".repeat(32),
            tokenizer_sha256: "cd".repeat(32),
            dtype: dtype.into(),
            prompt_format: String::new(),
        }
    }

    fn start_worker(backend: Arc<dyn InferenceBackend>, dtype: &str) -> LoopbackWorker {
        LoopbackWorker::start(ServedModel::new(
            backend,
            identity(dtype),
            Default::default(),
        ))
        .unwrap()
    }

    /// A loopback worker serving each backend (kept running while the
    /// returned workers live), and one sharded backend over them all.
    fn sharded_over(
        backends: impl Iterator<Item = Arc<dyn InferenceBackend>>,
    ) -> (Vec<LoopbackWorker>, ShardedBackend) {
        let started: Vec<LoopbackWorker> = backends.map(|b| start_worker(b, "f32")).collect();
        let addrs: Vec<String> = started.iter().map(|w| w.addr().to_string()).collect();
        let remote: Vec<Arc<dyn InferenceBackend>> = connect_workers(&addrs)
            .unwrap()
            .into_iter()
            .map(|w| Arc::new(w) as Arc<dyn InferenceBackend>)
            .collect();
        (started, ShardedBackend::try_new(remote).unwrap())
    }

    fn by_length() -> Arc<ByLength> {
        Arc::new(ByLength {
            asked: Default::default(),
        })
    }

    #[test]
    fn three_loopback_workers_answer_as_one_backend_each_question_once() {
        let local = by_length();
        let served: Vec<_> = (0..3).map(|_| by_length()).collect();
        let (_started, sharded) = sharded_over(
            served
                .iter()
                .map(|b| b.clone() as Arc<dyn InferenceBackend>),
        );

        let texts: Vec<String> = (0..60).map(|i| "x".repeat(10 + i * 7)).collect();
        let ids: Vec<String> = (0..60).map(|i| i.to_string()).collect();
        let docs: Vec<Doc<'_>> = ids
            .iter()
            .zip(&texts)
            .map(|(id, text)| Doc { id, text })
            .collect();
        let join = test_call(AiKind::Join, "Is {0} like {1}?", &[]);
        let pairs: Vec<AiRequest<'_>> = docs[..20]
            .iter()
            .flat_map(|&a| {
                docs[50..].iter().map(move |&p| AiRequest {
                    anchor: a,
                    partner: Some(p),
                })
            })
            .collect();
        let sharded = Arc::new(sharded).begin(QueryStart::one(&join)).unwrap();
        assert_eq!(
            sharded.decide(&join, &pairs).unwrap(),
            local.decide(&join, &pairs).unwrap()
        );
        let classify = test_call(AiKind::Classify, "Which kind is {0}?", &["a", "b", "c"]);
        let single: Vec<AiRequest<'_>> = docs
            .iter()
            .map(|&d| AiRequest {
                anchor: d,
                partner: None,
            })
            .collect();
        assert_eq!(
            sharded.classify(&classify, &single).unwrap(),
            local.classify(&classify, &single).unwrap()
        );
        // Every pair was asked of exactly one worker, and at least two worked.
        let asked: Vec<usize> = served
            .iter()
            .map(|b| b.asked.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        assert_eq!(asked.iter().sum::<usize>(), pairs.len(), "{asked:?}");
        assert!(asked.iter().filter(|&&n| n > 0).count() >= 2, "{asked:?}");
        let m = sharded.work();
        assert_eq!(m.fresh(), pairs.len() as u64);
        assert_eq!(m.workers.map(|w| w.0.len()), Some(3));
    }

    #[test]
    fn typed_answers_travel_from_workers_as_they_were_given() {
        let (_started, sharded) = sharded_over(
            (0..2).map(|_| Arc::new(ContentHashBackend::default()) as Arc<dyn InferenceBackend>),
        );
        let local = ContentHashBackend::default();
        let sharded = Arc::new(sharded);
        let texts: Vec<(String, String)> = (0..24)
            .map(|i| format!("document {i} é{}", "z".repeat(i)))
            .map(|t| (t.clone(), t))
            .collect();
        let docs = test_requests(&texts);
        let mut extract = test_call(AiKind::Extract, "", &["dish", "price"]);
        extract.descriptions = vec!["Which dish?\nANSWER:".into(), "What price?\nANSWER:".into()];
        // Typed fields: values of their types from every worker.
        let mut typed = test_call(
            AiKind::Extract,
            "",
            &["year INT", "genre ENUM('a', 'b c')", "on DATE"],
        );
        typed.descriptions = vec!["Year?".into(), "Genre?".into(), "Date?".into()];
        let calls = [
            test_call(AiKind::Score, "Is {0} kind?", &[]),
            test_call(
                AiKind::ClassifyScores,
                "Which kind is {0}?",
                &["a", "b", "c"],
            ),
            test_call(AiKind::Complete, "Summarise {0}.", &[]),
            extract,
            typed,
        ];
        let query = sharded
            .clone()
            .begin(QueryStart {
                calls: calls.to_vec(),
                spend: None,
                ..QueryStart::default()
            })
            .unwrap();
        for call in &calls {
            let got = query.answer(call, &docs).unwrap().answers;
            assert_eq!(got, local.answer(call, &docs).unwrap(), "{:?}", call.kind);
            assert!(got.iter().all(|a| a.fits(call)), "{:?}", call.kind);
        }
        // A worker's context reaches the coordinator (ai_agg packs by it).
        assert_eq!(
            sharded.context_positions(),
            Answerer::context_positions(&local)
        );
    }

    /// [`ByLength`], but a document longer than 40 bytes is a failed row.
    struct LongFails(Arc<ByLength>);

    impl InferenceBackend for LongFails {
        fn name(&self) -> &str {
            "model"
        }
        fn begin(self: Arc<Self>, _: QueryStart) -> Result<Arc<dyn QueryBackend>> {
            Ok(self)
        }
    }

    impl QueryBackend for LongFails {
        fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
            let mut answered = self.0.answer(call, requests)?;
            for (a, r) in answered.answers.iter_mut().zip(requests) {
                if r.anchor.text.len() > 40 {
                    *a = Answer::Failed(format!("row {} is too long", r.anchor.id).into());
                }
            }
            Ok(answered)
        }
        fn work(&self) -> Work {
            self.0.work()
        }
    }

    #[test]
    fn remote_workers_spend_the_budget_between_calls_and_send_failed_rows_back() {
        let served: Vec<Arc<ByLength>> = (0..2).map(|_| by_length()).collect();
        let (_started, sharded) = sharded_over(
            served
                .iter()
                .map(|b| Arc::new(LongFails(b.clone())) as Arc<dyn InferenceBackend>),
        );
        let texts: Vec<(String, String)> = (0..8)
            .map(|i| "y".repeat(3 + i * 7))
            .map(|t| (t.clone(), t))
            .collect();
        let docs = test_requests(&texts);
        let call = test_call(AiKind::Filter, "Is {0} even?", &[]);
        let spend = Arc::new(crate::limits::spend::Spend::new(
            crate::limits::spend::BudgetLimits {
                fresh_tokens: Some(12),
                model_seconds: None,
                cost_usd: None,
                gpu_hourly_rate_usd: 3.5,
            },
        ));
        let sharded = Arc::new(sharded)
            .begin(QueryStart {
                calls: vec![call.clone()],
                spend: Some(spend.clone()),
                ..QueryStart::default()
            })
            .unwrap();
        // Under the limit: asked, and charged what the workers computed (one
        // "fresh token" a question here). Rows over 40 bytes come back failed.
        let first = sharded.answer(&call, &docs).unwrap().answers;
        for (a, (t, _)) in first.iter().zip(&texts) {
            if t.len() > 40 {
                assert_eq!(*a, Answer::Failed(format!("row {t} is too long").into()));
            } else {
                assert_eq!(a.as_bool(), Some(t.len() % 2 == 0), "{t}");
            }
        }
        assert_eq!(spend.fresh_tokens(), 8);
        assert_eq!(spend.reached(), None);
        // Still under it: asked, and now past it.
        assert_eq!(sharded.answer(&call, &docs).unwrap().answers, first);
        assert_eq!(spend.fresh_tokens(), 16);
        assert!(spend.reached().is_some());
        // Spent: nothing more is sent to the workers.
        let third = sharded.answer(&call, &docs).unwrap().answers;
        assert!(third.iter().all(|a| *a == Answer::Unreached), "{third:?}");
        let asked: usize = served
            .iter()
            .map(|b| b.asked.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        assert_eq!(asked, 16);
    }

    #[test]
    fn workers_of_another_dtype_or_address_are_refused_naming_them() {
        let wa = start_worker(by_length(), "f32");
        let wb = start_worker(by_length(), "bf16");
        let (a, b) = (wa.addr().to_string(), wb.addr().to_string());
        let err = connect_workers(&[a.clone(), b.clone()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("worker 1") && err.contains(&b), "{err}");
        assert!(err.contains("same model and dtype"), "{err}");
        let err = connect_workers(&[a.clone(), a.clone()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("listed twice"), "{err}");

        // A port nobody listens on: bind one, learn it, close it.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = closed.local_addr().unwrap().to_string();
        drop(closed);
        let started = std::time::Instant::now();
        let err = connect_workers(std::slice::from_ref(&gone))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(&gone), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(15));
    }

    #[test]
    fn a_worker_that_stops_fails_the_next_question_naming_it() {
        let mut served = start_worker(by_length(), "f32");
        let addr = served.addr().to_string();
        let call = test_call(AiKind::Filter, "Is {0} even?", &[]);
        let worker = Arc::new(RemoteWorker::connect(&addr).unwrap())
            .begin(QueryStart::one(&call))
            .unwrap();
        let doc = Doc {
            id: "1",
            text: "ab",
        };
        let one = [AiRequest {
            anchor: doc,
            partner: None,
        }];
        assert_eq!(worker.decide(&call, &one).unwrap(), vec![true]);
        served.stop();
        let started = std::time::Instant::now();
        let err = worker.decide(&call, &one).unwrap_err().to_string();
        assert!(err.contains(&addr), "{err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "{:?}",
            started.elapsed()
        );
    }
}
