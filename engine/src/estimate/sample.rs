//! The answers an estimate runs on: the backend that will run the query is
//! asked only about a seeded sample of each AI operator's questions; every
//! other question gets an answer drawn from what the sample said (or from a
//! `--selectivity` hint), so that the rows reaching later operators follow the
//! sample's selectivities without the model reading them.
//!
//! Which questions are sampled, and what an unsampled one is answered, depends
//! only on the seed and the question (operator, document ids), never on the
//! order batches arrive in: the estimate's two simulations (the fresh tokens
//! under the real KV budget, and the minimum under an unlimited one) and the
//! scheduler's look-ahead all see one answer per question.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answerer, InferenceBackend, QueryBackend, QueryStart, check_answers,
};
use crate::inference::kinds::SampleSoFar;
use crate::inference::work::Work;

/// The seed of an estimate's sample: one fixed value, so that two estimates of
/// one query over one table ask the same rows.
pub const ESTIMATE_SEED: u64 = 0x5eed_e571_3a7e;

/// A question is a candidate for the sample when its hash falls under this
/// fraction: a large sample is spread over the first batches' questions
/// rather than taken from the first batch alone.
const SAMPLE_FRACTION: f64 = 0.5;

/// The largest share of a decision operator's questions (as many as have
/// reached it so far) that its sample may grow to past the base quota, while
/// its selectivity is still uncertain: a rare predicate sampled on 48
/// questions (FEV's joins, 0.26 % TRUE) decides the rows of every operator
/// after it on a guess.
const ADAPTIVE_SHARE: f64 = 0.02;

/// A sample grows past the base quota only while what the backend computed
/// for the sample stays under this share of the fresh tokens the estimate
/// has simulated for the query so far: sampled questions fall on documents
/// the query shares among many questions, so a question's share is no bound
/// on the tokens' (BIO-4's sample grew to a third of its query's tokens).
const ADAPTIVE_TOKEN_SHARE: f64 = 0.02;

/// A selectivity is known well enough when its 95 % interval's half-width is
/// at most this share of it.
const NARROW_ENOUGH: f64 = 0.1;

/// What one operator's sample said so far.
#[derive(Debug, Default, Clone)]
pub struct SampleStats {
    /// Questions asked of the backend.
    pub asked: usize,
    /// Sampled questions the backend answered TRUE (decisions).
    pub true_answers: usize,
    /// Sampled answers per label index (classifications).
    pub label_counts: Vec<usize>,
    /// Sampled answers, kept to draw unsampled ones from (scores, label
    /// probabilities).
    pub examples: Vec<Answer>,
    /// The fraction of TRUE used for unsampled decisions, when a hint gave it.
    pub hint: Option<f64>,
    /// The TRUE owed to unsampled filter decisions so far (error diffusion):
    /// they come out TRUE at the selectivity's exact rate, not by independent
    /// draws, whose own noise would add to the sample's.
    carry: Option<f64>,
    /// Distinct questions that reached the operator so far.
    pub seen: usize,
}

impl SampleStats {
    /// The 95 % Wilson interval of the TRUE fraction the sample measured
    /// (`None` without a sample): how far the selectivity, and so the rows
    /// reaching later operators, may be off.
    pub fn interval(&self) -> Option<(f64, f64)> {
        if self.hint.is_some() || self.asked == 0 {
            return None;
        }
        let (n, z) = (self.asked as f64, 1.96f64);
        let p = self.true_answers as f64 / n;
        let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
        let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
        Some(((centre - half).max(0.0), (centre + half).min(1.0)))
    }

    /// The fraction of TRUE decisions unsampled questions get: the hint, else
    /// the sample's fraction with half a question of prior either way (a
    /// sample with no TRUE still lets a few rows through, as a rare predicate
    /// does), else one half.
    pub fn selectivity(&self) -> f64 {
        if let Some(h) = self.hint {
            return h;
        }
        (self.true_answers as f64 + 0.5) / (self.asked as f64 + 1.0)
    }

    /// Questions the sample may hold now: the base `quota`, and for a
    /// decision whose selectivity is still uncertain, while the sample's
    /// tokens are within budget (`affordable`), up to [`ADAPTIVE_SHARE`] of
    /// the questions seen.
    fn quota(&self, base: usize, decides: bool, affordable: bool) -> usize {
        if !decides || self.asked < base {
            return base;
        }
        if !affordable {
            return self.asked;
        }
        let narrow = self
            .interval()
            .is_none_or(|(lo, hi)| (hi - lo) / 2.0 <= NARROW_ENOUGH * self.selectivity());
        if narrow {
            return self.asked;
        }
        base.max((self.seen as f64 * ADAPTIVE_SHARE) as usize)
    }
}

/// The sampled backend: see the module docs.
pub struct SampledAnswers {
    real: Arc<dyn InferenceBackend>,
    /// The estimated query's own query on `real`, which answers the sample
    /// ([`Self::begin_real`]); none before the estimate's query begins.
    real_query: Mutex<Option<Arc<dyn QueryBackend>>>,
    /// What the last ended query on `real` measured.
    real_ended: Mutex<Work>,
    /// Questions per operator asked of `real`.
    quota: usize,
    /// Fractions of TRUE by prompt template (`--selectivity`): such an
    /// operator asks nothing.
    hints: HashMap<String, f64>,
    state: Mutex<State>,
    /// Fresh tokens the estimate has simulated for the query so far
    /// ([`Self::note_query_fresh`]): what a sample's growth is measured
    /// against.
    query_fresh: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    /// Answers given, by question: one answer per question for every caller.
    given: HashMap<u128, Answer>,
    /// Per operator id.
    stats: HashMap<String, SampleStats>,
}

impl SampledAnswers {
    /// Asks `real` at most `quota` questions per operator; `hints` give some
    /// templates' fractions of TRUE instead.
    pub fn new(real: Arc<dyn InferenceBackend>, quota: usize, hints: HashMap<String, f64>) -> Self {
        Self {
            real,
            real_query: Mutex::new(None),
            real_ended: Mutex::default(),
            quota,
            hints,
            state: Mutex::new(State::default()),
            query_fresh: Default::default(),
        }
    }

    /// Tells the sample how many fresh tokens the query's simulation has
    /// counted so far.
    pub fn note_query_fresh(&self, fresh: u64) {
        self.query_fresh
            .store(fresh, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the sample's own tokens leave room to grow it.
    fn affordable(&self) -> bool {
        let query = self.query_fresh.load(std::sync::atomic::Ordering::Relaxed);
        let sample = self.real_work().fresh();
        sample == 0 || (sample as f64) < ADAPTIVE_TOKEN_SHARE * query as f64
    }

    /// The backend that answers the sample.
    pub fn real(&self) -> &Arc<dyn InferenceBackend> {
        &self.real
    }

    /// Begins the estimated query on the real backend, whose query answers
    /// the sample until [`Self::end_real`].
    pub fn begin_real(&self, start: QueryStart) -> Result<()> {
        let query = self.real.clone().begin(start)?;
        *self.real_query.lock().expect("sample query lock") = Some(query);
        Ok(())
    }

    /// Ends the real backend's query (a worker serves its next coordinator).
    pub fn end_real(&self) {
        let ended = self.real_query.lock().expect("sample query lock").take();
        if let Some(query) = ended {
            *self.real_ended.lock().expect("sample work lock") = query.work();
        }
    }

    /// The real backend's query, while one is begun.
    pub fn real_query(&self) -> Option<Arc<dyn QueryBackend>> {
        self.real_query.lock().expect("sample query lock").clone()
    }

    /// What answering the sample has cost on the real backend: so far in
    /// the query begun, else in the last one ended.
    pub fn real_work(&self) -> Work {
        match self.real_query() {
            Some(query) => query.work(),
            None => self.real_ended.lock().expect("sample work lock").clone(),
        }
    }

    /// What each operator's sample said, by operator id.
    pub fn stats(&self) -> HashMap<String, SampleStats> {
        self.state.lock().expect("sample lock").stats.clone()
    }

    /// What tells `call`'s questions from another call's of the same operator
    /// (an `ai_agg`'s rounds share its id): its kind, pieces and labels.
    fn call_digest(call: &AiCall) -> u128 {
        let text = serde_json::to_vec(&(
            &call.op_id,
            call.kind,
            &call.pieces,
            &call.labels,
            &call.descriptions,
            call.max_tokens,
        ))
        .expect("a call serialises");
        twox_hash::XxHash3_128::oneshot_with_seed(ESTIMATE_SEED, &text)
    }

    /// A question's hash under the seed: its identity and its place in the
    /// sample order.
    fn question_hash(call: u128, r: &AiRequest<'_>) -> u128 {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&call.to_le_bytes());
        for part in [r.anchor.id, r.partner.map_or("", |p| p.id)] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        twox_hash::XxHash3_128::oneshot_with_seed(ESTIMATE_SEED, &bytes)
    }

    /// A number in [0, 1) from a hash's high bits.
    fn unit(h: u128) -> f64 {
        (h >> 75) as f64 / (1u64 << 53) as f64
    }

    /// The answer an unsampled question of `call` gets from the sample so far.
    fn drawn(call: &AiCall, stats: &mut SampleStats, h: u128) -> Answer {
        // Low bits pick; the high bits decided whether it was a candidate.
        let u = (h as u64 >> 11) as f64 / (1u64 << 53) as f64;
        let sample = SampleSoFar {
            selectivity: stats.selectivity(),
            carry: &mut stats.carry,
            label_counts: &stats.label_counts,
            examples: &stats.examples,
        };
        call.kind.describe().drawn(call, sample, u)
    }

    /// Asks `real` the sampled questions. Those an oracle has no label for
    /// (the rows reaching an operator in an estimate are not quite the
    /// query's) and those the model could not answer (a failed row) are left
    /// to the draw; any other error is the estimate's.
    fn ask_real(&self, call: &AiCall, asked: &[AiRequest<'_>]) -> Result<Vec<Option<Answer>>> {
        let usable = |a: Answer| (a.fits(call) && a.is_answer()).then_some(a);
        let real = self.real_query().ok_or_else(|| {
            EngineError::Inference(format!(
                "{}: the estimate asked its sample before its query began",
                call.op_id
            ))
        })?;
        match real.answer(call, asked).map(|a| a.answers) {
            Ok(answers) => {
                check_answers(call, self.real.name(), &answers, asked.len())?;
                Ok(answers.into_iter().map(usable).collect())
            }
            Err(EngineError::NoAnswer(_)) => asked
                .iter()
                .map(|r| {
                    match real
                        .answer(call, std::slice::from_ref(r))
                        .map(|a| a.answers)
                    {
                        Ok(mut a) if a.len() == 1 => Ok(a.pop().and_then(usable)),
                        Ok(a) => {
                            check_answers(call, self.real.name(), &a, 1)?;
                            Ok(None)
                        }
                        Err(EngineError::NoAnswer(_)) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .collect(),
            Err(e) => Err(e),
        }
    }
}

impl Answerer for SampledAnswers {
    fn name(&self) -> &str {
        "estimate"
    }

    fn context_positions(&self) -> Option<usize> {
        self.real.context_positions()
    }

    /// Sampled questions answered by the real backend, the others drawn; a
    /// generating call is never sampled (its answers decide no row, and its
    /// decoding is bounded by `max_tokens`).
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        let digest = Self::call_digest(call);
        let hashes: Vec<u128> = requests
            .iter()
            .map(|r| Self::question_hash(digest, r))
            .collect();
        let hint = self.hints.get(&call.template).copied();
        // The sample: unanswered candidates by rising hash, up to the quota.
        let affordable = self.affordable();
        let sampled: Vec<usize> = {
            let mut state = self.state.lock().expect("sample lock");
            let State { given, stats } = &mut *state;
            let stats = stats.entry(call.op_id.clone()).or_default();
            stats.hint = hint;
            stats.seen += hashes.iter().filter(|h| !given.contains_key(h)).count();
            let left = if hint.is_some() || call.kind.generates() {
                0
            } else {
                stats
                    .quota(self.quota, call.kind.is_decision(), affordable)
                    .saturating_sub(stats.asked)
            };
            let mut candidates: Vec<usize> = (0..requests.len())
                .filter(|&i| {
                    Self::unit(hashes[i]) < SAMPLE_FRACTION && !given.contains_key(&hashes[i])
                })
                .collect();
            candidates.sort_by_key(|&i| hashes[i]);
            candidates.dedup_by_key(|i| hashes[*i]);
            candidates.truncate(left);
            candidates
        };
        if !sampled.is_empty() {
            let asked: Vec<AiRequest<'_>> = sampled.iter().map(|&i| requests[i]).collect();
            let answers = self.ask_real(call, &asked)?;
            let mut state = self.state.lock().expect("sample lock");
            let State { given, stats } = &mut *state;
            let stats = stats.get_mut(&call.op_id).expect("stats made above");
            for (&i, answer) in sampled.iter().zip(answers) {
                let Some(answer) = answer else { continue };
                stats.asked += 1;
                match &answer {
                    Answer::Bool(true) => stats.true_answers += 1,
                    Answer::Label(l) => {
                        let l = *l as usize;
                        if stats.label_counts.len() <= l {
                            stats.label_counts.resize(l + 1, 0);
                        }
                        stats.label_counts[l] += 1;
                    }
                    Answer::Score(_) | Answer::LabelScores(_) | Answer::Vector(_) => {
                        stats.examples.push(answer.clone())
                    }
                    _ => {}
                }
                given.insert(hashes[i], answer);
            }
        }
        let mut state = self.state.lock().expect("sample lock");
        let State { given, stats } = &mut *state;
        let stats = stats.get_mut(&call.op_id).expect("stats made above");
        Ok(hashes
            .iter()
            .map(|&h| {
                given
                    .entry(h)
                    .or_insert_with(|| Self::drawn(call, stats, h))
                    .clone()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample over `real` whose query has begun.
    fn begun(
        real: Arc<dyn InferenceBackend>,
        quota: usize,
        hints: HashMap<String, f64>,
    ) -> SampledAnswers {
        let sampled = SampledAnswers::new(real, quota, hints);
        sampled.begin_real(QueryStart::default()).unwrap();
        sampled
    }
    use crate::inference::backend::{AiKind, Answered, ContentHashBackend, Doc, test_call};

    fn requests(ids: &[String]) -> Vec<AiRequest<'_>> {
        ids.iter()
            .map(|id| AiRequest {
                anchor: Doc { id, text: id },
                partner: None,
            })
            .collect()
    }

    #[test]
    fn asks_at_most_the_quota_and_follows_the_sample() {
        let real = Arc::new(ContentHashBackend::default());
        let sampled = begun(real.clone(), 40, HashMap::new());
        let call = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let ids: Vec<String> = (0..4000).map(|i| format!("row{i}")).collect();
        let reqs = requests(&ids);
        let mut answers = Vec::new();
        for chunk in reqs.chunks(256) {
            answers.extend(sampled.answer(&call, chunk).unwrap());
        }
        // 40, then, the interval of a 45 % predicate being wide at 40,
        // up to 2 % of the 4,000 questions.
        assert_eq!(real.prompts(), 80, "only the sample reaches the backend");
        let stats = &sampled.stats()["op-1"];
        assert_eq!(stats.asked, 80);
        assert_eq!(stats.seen, 4000);
        // The content hash says TRUE for about 45 %: the draws follow it.
        let trues = answers.iter().filter(|a| **a == Answer::Bool(true)).count();
        let fraction = trues as f64 / answers.len() as f64;
        assert!(
            (fraction - stats.selectivity()).abs() < 0.05,
            "{fraction} vs sample {}",
            stats.selectivity()
        );
        // One answer per question, whoever asks and in whatever order.
        let mut again = Vec::new();
        for chunk in reqs.chunks(100).rev() {
            let mut a = sampled.answer(&call, chunk).unwrap();
            a.reverse();
            again.extend(a);
        }
        again.reverse();
        assert_eq!(again, answers);
        assert_eq!(real.prompts(), 80);
    }

    /// A sample grows past its base quota only while what the backend
    /// computed for it is under 2 % of the query's fresh tokens so far.
    #[test]
    fn a_sample_grows_only_within_its_token_budget() {
        use crate::inference::work::{Sum, Work};
        struct Costly;
        impl InferenceBackend for Costly {
            fn name(&self) -> &str {
                "costly"
            }
            fn begin(self: Arc<Self>, _: QueryStart) -> Result<Arc<dyn QueryBackend>> {
                Ok(Arc::new(Costly))
            }
        }
        impl QueryBackend for Costly {
            fn answer(&self, _: &AiCall, r: &[AiRequest<'_>]) -> Result<Answered> {
                Ok(Answered::free(
                    (0..r.len()).map(|i| Answer::Bool(i % 2 == 0)).collect(),
                ))
            }
            fn work(&self) -> Work {
                Work {
                    fresh_tokens: Some(Sum(1_000_000)),
                    ..Work::default()
                }
            }
        }
        let call = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let ids: Vec<String> = (0..4000).map(|i| format!("row{i}")).collect();
        for (query_fresh, asked) in [(10_000_000, 40), (100_000_000, 80)] {
            let sampled = begun(Arc::new(Costly), 40, HashMap::new());
            sampled.note_query_fresh(query_fresh);
            for chunk in requests(&ids).chunks(256) {
                sampled.answer(&call, chunk).unwrap();
            }
            assert_eq!(sampled.stats()["op-1"].asked, asked, "{query_fresh}");
        }
    }

    /// A selectivity the base sample already knows well keeps the sample at
    /// the base quota; a join's unsampled pairs are drawn each on its own,
    /// so the partners that match are spread as the rate says, not the same
    /// few for every anchor.
    #[test]
    fn a_narrow_sample_stops_at_the_quota_and_join_draws_spread() {
        struct Always(bool);
        impl Answerer for Always {
            fn name(&self) -> &str {
                "always"
            }
            fn answer(&self, _: &AiCall, r: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
                Ok(vec![Answer::Bool(self.0); r.len()])
            }
        }
        let sampled = begun(Arc::new(Always(true)), 40, HashMap::new());
        let call = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let ids: Vec<String> = (0..4000).map(|i| format!("row{i}")).collect();
        for chunk in requests(&ids).chunks(256) {
            sampled.answer(&call, chunk).unwrap();
        }
        assert_eq!(sampled.stats()["op-1"].asked, 40);

        // A rare join (the sample sees no TRUE in 300 x 300 x 2 %): the
        // pairs drawn TRUE reach many distinct partners.
        let sampled = begun(Arc::new(Always(false)), 40, HashMap::new());
        let call = test_call(AiKind::Join, "Does {0} support {1}?", &[]);
        let anchors: Vec<String> = (0..300).map(|i| format!("a{i}")).collect();
        let partners: Vec<String> = (0..300).map(|i| format!("p{i}")).collect();
        let mut matched = std::collections::HashSet::new();
        let mut trues = 0;
        for a in &anchors {
            let reqs: Vec<AiRequest<'_>> = partners
                .iter()
                .map(|p| AiRequest {
                    anchor: Doc { id: a, text: a },
                    partner: Some(Doc { id: p, text: p }),
                })
                .collect();
            for (answer, p) in sampled.answer(&call, &reqs).unwrap().iter().zip(&partners) {
                if *answer == Answer::Bool(true) {
                    trues += 1;
                    matched.insert(p.clone());
                }
            }
        }
        assert_eq!(sampled.stats()["op-1"].asked, 1800, "2 % of 90,000 pairs");
        assert!(trues >= 20, "{trues} pairs drawn TRUE");
        // Drawn each on its own, the TRUE pairs fall on 300 (1 - (1 - 1/300)^n)
        // distinct partners; periodic draws fell on a handful.
        let spread = 300.0 * (1.0 - (1.0 - 1.0 / 300.0f64).powi(trues));
        assert!(
            (matched.len() as f64) > 0.8 * spread,
            "{trues} TRUE pairs on {} distinct partners, {spread:.0} expected",
            matched.len()
        );
    }

    #[test]
    fn rows_without_labels_are_drawn_and_a_model_error_is_the_estimates() {
        let call = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let ids: Vec<String> = (0..200).map(|i| format!("row{i}")).collect();
        // An oracle with no labels: nothing sampled, every answer drawn.
        let oracle = Arc::new(crate::inference::backend::NoAnswers);
        let sampled = begun(oracle, 20, HashMap::new());
        let answers = sampled.answer(&call, &requests(&ids)).unwrap();
        assert_eq!(answers.len(), 200);
        assert_eq!(sampled.stats()["op-1"].asked, 0);
        // A model that fails fails the estimate, never a silent draw.
        struct Broken;
        impl Answerer for Broken {
            fn name(&self) -> &str {
                "broken"
            }
            fn answer(&self, _: &AiCall, _: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
                Err(EngineError::Inference("the model crashed".into()))
            }
        }
        let sampled = begun(Arc::new(Broken), 20, HashMap::new());
        let err = sampled.answer(&call, &requests(&ids)).unwrap_err();
        assert!(err.to_string().contains("the model crashed"), "{err}");
    }

    #[test]
    fn a_hint_asks_nothing_and_sets_the_fraction() {
        let real = Arc::new(ContentHashBackend::default());
        let call = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let hints = HashMap::from([(call.template.clone(), 0.1)]);
        let sampled = begun(real.clone(), 40, hints);
        let ids: Vec<String> = (0..2000).map(|i| format!("row{i}")).collect();
        let answers = sampled.answer(&call, &requests(&ids)).unwrap();
        assert_eq!(real.prompts(), 0);
        let trues = answers.iter().filter(|a| **a == Answer::Bool(true)).count();
        assert!((150..250).contains(&trues), "{trues} of 2000 at 0.1");
    }

    #[test]
    fn labels_follow_the_sample_and_generations_ask_nothing() {
        let real = Arc::new(ContentHashBackend::default());
        let sampled = begun(real.clone(), 30, HashMap::new());
        let call = test_call(AiKind::Classify, "Tone of {0}?", &["a", "b", "c"]);
        let ids: Vec<String> = (0..900).map(|i| format!("row{i}")).collect();
        let answers = sampled.answer(&call, &requests(&ids)).unwrap();
        assert!(answers.iter().all(|a| a.fits(&call)));
        assert_eq!(real.prompts(), 30);
        let call = test_call(AiKind::Complete, "Summarise {0}", &[]);
        let answers = sampled.answer(&call, &requests(&ids)).unwrap();
        assert!(answers.iter().all(|a| *a == Answer::Text("".into())));
        assert_eq!(real.prompts(), 30);
    }
}
