//! The scoring API the engine calls: prefill prompts into shareable KV handles, then
//! score batches of continuations on top of them — TRUE/FALSE decisions from eight
//! output-head rows (SPEC §B.5), or label log-probabilities from the full vocabulary
//! at label positions only. Every batch is packed into one forward pass, whatever
//! mix of prefixes and lengths it holds.

use candle_core::{DType, Tensor};

use crate::kv::{KvHandle, Segment};
use crate::qwen3::{PackedSeq, Qwen3};
use crate::tokenizer::AnswerIds;
use crate::{ModelError, Result};

/// Rows of full-vocabulary logits materialised at once when scoring labels (bounds
/// memory at about `LOGIT_CHUNK_ROWS × vocab × 4` bytes).
const LOGIT_CHUNK_ROWS: usize = 64;

/// Packed tokens, their sequences, and per sequence `(item index, first packed row)`.
pub(crate) type Packing = (Vec<u32>, Vec<PackedSeq>, Vec<(usize, usize)>);

/// The hidden state a handle's prompt ends with, or an error for a prefix view.
pub(crate) fn final_hidden(h: &KvHandle) -> Result<Tensor> {
    h.segment()?.last_hidden.ok_or_else(|| {
        ModelError::InvalidInput(format!(
            "KV #{} is a prefix view: it can be continued but not scored",
            h.id()
        ))
    })
}

/// Tokens continuing an optional cached prefix: one item of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Continuation<'a> {
    /// The prefix these tokens follow (`None`: start of sequence).
    pub prefix: Option<&'a KvHandle>,
    /// The new tokens.
    pub tokens: &'a [u32],
}

impl<'a> Continuation<'a> {
    /// `tokens` after `prefix`.
    pub fn new(prefix: Option<&'a KvHandle>, tokens: &'a [u32]) -> Self {
        Self { prefix, tokens }
    }
}

/// A TRUE/FALSE answer read from one next-token distribution (SPEC §B.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// TRUE when the best TRUE logit exceeds the best FALSE logit (ties are FALSE).
    pub answer: bool,
    /// `true_logit - false_logit`.
    pub margin: f32,
    /// Max logit over the four TRUE ids.
    pub true_logit: f32,
    /// Max logit over the four FALSE ids.
    pub false_logit: f32,
}

impl Decision {
    /// Reads a decision from the logits of [`AnswerIds::all`] (TRUE ids first).
    pub fn from_logits(logits8: &[f32]) -> Self {
        let max = |s: &[f32]| s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (t, f) = (max(&logits8[..4]), max(&logits8[4..8]));
        Self {
            answer: t > f,
            margin: t - f,
            true_logit: t,
            false_logit: f,
        }
    }

    /// P(TRUE) over TRUE+FALSE from the two max logits (`ai_score`, SPEC §B.5):
    /// their softmax, in f64.
    pub fn p_true(&self) -> f64 {
        1.0 / (1.0 + (f64::from(self.false_logit) - f64::from(self.true_logit)).exp())
    }
}

/// One classification: a prompt (optionally after a cached prefix) and the label
/// continuations to score, each the tokens of `" " + label` encoded alone.
#[derive(Debug, Clone, Copy)]
pub struct ClassifyRequest<'a> {
    /// Cached prefix (e.g. the document), or `None`.
    pub prefix: Option<&'a KvHandle>,
    /// Prompt tokens after the prefix (may be empty when `prefix` is given).
    pub prompt: &'a [u32],
    /// Label continuations.
    pub labels: &'a [Vec<u32>],
}

impl Qwen3 {
    /// Prefills `tokens` on top of `prefix` (or from scratch) and returns the KV
    /// handle of the whole sequence. The handle refers to `prefix` instead of copying it.
    pub fn prefill(&self, prefix: Option<&KvHandle>, tokens: &[u32]) -> Result<KvHandle> {
        Ok(self
            .prefill_batch(&[Continuation::new(prefix, tokens)])?
            .remove(0))
    }

    /// Prefills many sequences in one packed forward pass; one handle per item.
    /// Items with no tokens return their prefix handle itself.
    pub fn prefill_batch(&self, items: &[Continuation<'_>]) -> Result<Vec<KvHandle>> {
        let (tokens, seqs, rows) = self.pack(items)?;
        let mut out: Vec<Option<KvHandle>> = items
            .iter()
            .map(|c| c.tokens.is_empty().then(|| c.prefix.cloned()).flatten())
            .collect();
        if let Some((i, _)) = items
            .iter()
            .enumerate()
            .find(|(i, c)| c.tokens.is_empty() && out[*i].is_none())
        {
            return Err(ModelError::InvalidInput(format!(
                "item {i}: nothing to prefill (no prefix and no tokens)"
            )));
        }
        if !seqs.is_empty() {
            let packed = self.forward_packed(&tokens, &seqs, true, 0)?;
            let kv = packed.kv.expect("keep_kv was requested");
            for ((layers, &(item, start)), seq) in kv.into_iter().zip(&rows).zip(&seqs) {
                let last_hidden = packed.hidden.get(start + seq.len - 1)?;
                let seg = Segment {
                    layers: std::sync::Arc::new(layers),
                    last_hidden: Some(last_hidden),
                };
                out[item] = Some(self.new_handle(items[item].prefix.cloned(), seg));
            }
        }
        Ok(out
            .into_iter()
            .map(|h| h.expect("every item was filled"))
            .collect())
    }

    /// Final-normed hidden state of the last position of each item `(items, hidden)`:
    /// computed for non-empty items, read from the prefix handle for empty ones.
    pub(crate) fn last_hidden(&self, items: &[Continuation<'_>]) -> Result<Tensor> {
        let (tokens, seqs, rows) = self.pack(items)?;
        let mut out: Vec<Option<Tensor>> = vec![None; items.len()];
        for (i, c) in items.iter().enumerate() {
            if c.tokens.is_empty() {
                let h = c.prefix.ok_or_else(|| {
                    ModelError::InvalidInput(format!("item {i}: no prefix and no tokens"))
                })?;
                out[i] = Some(final_hidden(h)?);
            }
        }
        if !seqs.is_empty() {
            let packed = self.forward_packed(&tokens, &seqs, false, 0)?;
            for (&(item, start), seq) in rows.iter().zip(&seqs) {
                out[item] = Some(packed.hidden.get(start + seq.len - 1)?);
            }
        }
        if out.is_empty() {
            return Ok(Tensor::zeros(
                (0, self.config().hidden_size),
                self.dtype(),
                self.device(),
            )?);
        }
        let rows: Vec<Tensor> = out.into_iter().map(|t| t.expect("filled")).collect();
        Ok(Tensor::stack(&rows, 0)?)
    }

    /// The final hidden state (after the final norm, before the output head) of
    /// each item's last position, as f32: what an embedding pools (last-token
    /// pooling, as Qwen3-Embedding). One packed forward for the batch; an item
    /// with no tokens reads its prefix handle's.
    pub fn final_hidden_states(&self, items: &[Continuation<'_>]) -> Result<Vec<Vec<f32>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.last_hidden(items)?.to_dtype(DType::F32)?.to_vec2()?)
    }

    /// Next-token logits of `rows` (vocabulary ids) after each item: only those rows
    /// of the output head are multiplied. Returns `items × rows.len()` values.
    pub fn next_token_logits(
        &self,
        items: &[Continuation<'_>],
        rows: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        self.check_tokens(rows)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let hidden = self.last_hidden(items)?;
        Ok(aisql_kernels::restricted_head(&hidden, self.lm_head(), rows)?.to_vec2()?)
    }

    /// TRUE/FALSE decision after each item (SPEC §B.5), from the eight answer rows.
    pub fn decide(&self, items: &[Continuation<'_>], answers: &AnswerIds) -> Result<Vec<Decision>> {
        let logits = self.next_token_logits(items, &answers.all())?;
        Ok(logits.iter().map(|l| Decision::from_logits(l)).collect())
    }

    /// Full-vocabulary logits at every position of each item's tokens, `(len, vocab)`
    /// f32 per item (for tests and generation; scoring needs only the methods above).
    pub fn logits(&self, items: &[Continuation<'_>]) -> Result<Vec<Tensor>> {
        let (tokens, seqs, rows) = self.pack(items)?;
        let mut out: Vec<Tensor> = items
            .iter()
            .map(|_| Tensor::zeros((0, self.config().vocab_size), DType::F32, self.device()))
            .collect::<candle_core::Result<_>>()?;
        if !seqs.is_empty() {
            let packed = self.forward_packed(&tokens, &seqs, false, 0)?;
            let all = packed
                .hidden
                .matmul(&self.lm_head().t()?)?
                .to_dtype(DType::F32)?;
            for (&(item, start), seq) in rows.iter().zip(&seqs) {
                out[item] = all.narrow(0, start, seq.len)?;
            }
        }
        Ok(out)
    }

    /// Sum of log-probabilities of each label continuation after the prompt ending at
    /// `prompt` (SPEC §B.5: full-vocabulary log-softmax at temperature 1 at every label
    /// token). The first label token is scored from the prompt's cached last hidden
    /// state, so a one-token label costs no forward pass; longer labels are packed as
    /// suffixes on top of `prompt`, sharing its KV.
    pub fn label_logprobs(&self, prompt: &KvHandle, labels: &[Vec<u32>]) -> Result<Vec<f32>> {
        Ok(self.label_logprobs_batch(&[(prompt, labels)])?.remove(0))
    }

    /// [`Self::label_logprobs`] for many prompts in one packed forward pass.
    pub fn label_logprobs_batch(
        &self,
        items: &[(&KvHandle, &[Vec<u32>])],
    ) -> Result<Vec<Vec<f32>>> {
        // Every label token `l_j` is predicted by one hidden row: the prompt's last
        // hidden for j = 0, the row of `l_{j-1}` otherwise; the last label token itself
        // is never fed, as nothing is scored after it.
        let mut conts = Vec::new();
        let mut owners = Vec::new();
        for (p, &(prompt, labels)) in items.iter().enumerate() {
            self.check_handle(prompt)?;
            for (l, label) in labels.iter().enumerate() {
                if label.is_empty() {
                    return Err(ModelError::InvalidInput(format!(
                        "prompt {p}: label {l} has no tokens"
                    )));
                }
                self.check_tokens(label)?;
                conts.push(Continuation::new(Some(prompt), &label[..label.len() - 1]));
                owners.push((p, l));
            }
        }
        let (tokens, seqs, rows) = self.pack(&conts)?;
        self.count_label_tokens(tokens.len());
        let packed = if seqs.is_empty() {
            None
        } else {
            Some(self.forward_packed(&tokens, &seqs, false, 0)?)
        };
        let mut fed_start = vec![None; conts.len()];
        for &(item, start) in &rows {
            fed_start[item] = Some(start);
        }
        let mut prompt_hidden: Vec<Option<Tensor>> = vec![None; items.len()];
        let mut hidden_rows = Vec::new();
        let mut targets = Vec::new();
        for (c, &(p, l)) in owners.iter().enumerate() {
            let label = &items[p].1[l];
            if prompt_hidden[p].is_none() {
                prompt_hidden[p] = Some(final_hidden(items[p].0)?);
            }
            hidden_rows.push(prompt_hidden[p].clone().expect("set above"));
            for j in 1..label.len() {
                let start = fed_start[c].expect("labels longer than one token are fed");
                hidden_rows.push(packed.as_ref().expect("fed").hidden.get(start + j - 1)?);
            }
            targets.extend_from_slice(label);
        }
        let mut logprob = Vec::with_capacity(targets.len());
        for (rows, ids) in hidden_rows
            .chunks(LOGIT_CHUNK_ROWS)
            .zip(targets.chunks(LOGIT_CHUNK_ROWS))
        {
            let h = Tensor::stack(rows, 0)?;
            logprob.extend(aisql_kernels::target_logprobs(&h, self.lm_head(), ids)?);
        }
        let mut out: Vec<Vec<f32>> = items
            .iter()
            .map(|(_, labels)| vec![0f32; labels.len()])
            .collect();
        let mut k = 0;
        for &(p, l) in &owners {
            let n = items[p].1[l].len();
            out[p][l] = logprob[k..k + n].iter().sum();
            k += n;
        }
        Ok(out)
    }

    /// Scores the labels of each request: prefills every prompt on top of its prefix in
    /// one pass, then scores all labels on top of those prompt KVs in a second pass,
    /// so each prompt is computed once however many labels it has. The prompt KVs are
    /// released before returning.
    pub fn classify(&self, requests: &[ClassifyRequest<'_>]) -> Result<Vec<Vec<f32>>> {
        let conts: Vec<Continuation<'_>> = requests
            .iter()
            .map(|r| Continuation::new(r.prefix, r.prompt))
            .collect();
        let prompts = self.prefill_batch(&conts)?;
        let items: Vec<(&KvHandle, &[Vec<u32>])> = prompts
            .iter()
            .zip(requests)
            .map(|(h, r)| (h, r.labels))
            .collect();
        let scores = self.label_logprobs_batch(&items);
        for (h, r) in prompts.iter().zip(requests) {
            if !r.prompt.is_empty() {
                h.release();
            }
        }
        scores
    }

    /// Packs the non-empty items: all tokens back to back, their [`PackedSeq`]s, and
    /// for each packed sequence `(item index, first packed row)`. Validates handles.
    pub(crate) fn pack(&self, items: &[Continuation<'_>]) -> Result<Packing> {
        let mut tokens = Vec::new();
        let mut seqs = Vec::new();
        let mut rows = Vec::new();
        for (i, c) in items.iter().enumerate() {
            let prefix = match c.prefix {
                Some(h) => {
                    self.check_handle(h)?;
                    h.chain()?
                }
                None => Vec::new(),
            };
            if c.tokens.is_empty() {
                continue;
            }
            self.check_tokens(c.tokens)?;
            rows.push((i, tokens.len()));
            tokens.extend_from_slice(c.tokens);
            seqs.push(PackedSeq {
                prefix,
                len: c.tokens.len(),
            });
        }
        Ok((tokens, seqs, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Reference, big_dir, max_abs_diff, tiny_dir, tokens};
    use crate::tokenizer::Tokenizer;
    use std::path::Path;

    const TOL: f32 = 1e-4;

    fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
        a.iter().chain(b).copied().collect()
    }

    /// Suffix logits from the shared-prefix path equal the reference's logits at the
    /// same positions of the whole prompt, for a batch mixing prefixes and lengths.
    fn check_mixed_batch(dir: &Path, vocab: u32) {
        let model = Qwen3::load_for_test(dir);
        let reference = Reference::load(dir);
        let (doc_a, doc_b) = (tokens(23, 1, vocab), tokens(7, 2, vocab));
        let a = model.prefill(None, &doc_a).unwrap();
        let b = model.prefill(None, &doc_b).unwrap();
        let sufs = [
            tokens(5, 3, vocab),
            tokens(1, 4, vocab),
            tokens(9, 5, vocab),
            tokens(12, 6, vocab),
        ];
        let prefixes: [(Option<&KvHandle>, &[u32]); 4] = [
            (Some(&a), &doc_a),
            (Some(&b), &doc_b),
            (Some(&a), &doc_a),
            (None, &[]),
        ];
        let items: Vec<Continuation> = prefixes
            .iter()
            .zip(&sufs)
            .map(|((h, _), s)| Continuation::new(*h, s))
            .collect();
        let got = model.logits(&items).unwrap();
        for (((_, p), s), g) in prefixes.iter().zip(&sufs).zip(&got) {
            let full = reference.logits(&cat(p, s));
            let want = full.narrow(0, p.len(), s.len()).unwrap();
            let diff = max_abs_diff(g, &want);
            assert!(
                diff <= TOL,
                "prefix {} + suffix {}: max |Δlogit| {diff}",
                p.len(),
                s.len()
            );
            // The comparison is only meaningful if logits are spread and depend on the prefix.
            let spread = want.max_all().unwrap().to_scalar::<f32>().unwrap()
                - want.min_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(spread > 1.0, "degenerate logits (spread {spread})");
            if !p.is_empty() {
                let other = reference
                    .logits(&cat(&tokens(p.len(), 99, vocab), s))
                    .narrow(0, p.len(), s.len())
                    .unwrap();
                assert!(
                    max_abs_diff(&other, &want) > 100.0 * TOL,
                    "suffix logits ignore the prefix"
                );
            }
            eprintln!(
                "prefix {} + suffix {}: max |Δlogit| {diff:e}, spread {spread}",
                p.len(),
                s.len()
            );
        }
    }

    #[test]
    fn tiny_mixed_batch_equals_full_forward() {
        check_mixed_batch(tiny_dir(), 151_669);
    }

    #[test]
    fn gqa_untied_model_mixed_batch_equals_full_forward() {
        check_mixed_batch(big_dir(), 1000);
    }

    #[test]
    fn decisions_equal_full_forward_and_prefix_is_reusable() {
        let dir = tiny_dir();
        let model = Qwen3::load_for_test(dir);
        let reference = Reference::load(dir);
        let tok = Tokenizer::vendored().unwrap();
        let answers = tok.answer_ids().unwrap();
        let doc = tok
            .encode("DOCUMENT:\nThis movie was great, the acting superb and the plot tight.\n\n")
            .unwrap();
        let handle = model.prefill(None, &doc).unwrap();
        let questions = [
            "Evaluate TRUE or FALSE for the following question: Is this positive?\nANSWER:",
            "Evaluate TRUE or FALSE for the following question: Is it about a film?\nANSWER:",
            "Is it long?\nANSWER:",
        ];
        // Three separate calls reuse the same prefix; the last batches two questions.
        for batch in [&questions[..1], &questions[1..2], &questions[..]] {
            let qs = tok.encode_batch(batch).unwrap();
            let items: Vec<Continuation> = qs
                .iter()
                .map(|q| Continuation::new(Some(&handle), q))
                .collect();
            let before = model.fresh_tokens();
            let got = model.decide(&items, &answers).unwrap();
            let fed: usize = qs.iter().map(Vec::len).sum();
            assert_eq!(
                model.fresh_tokens() - before,
                fed as u64,
                "the prefix must not be recomputed"
            );
            for (q, d) in qs.iter().zip(&got) {
                let full = reference.logits(&cat(&doc, q));
                let last = full.get(full.dim(0).unwrap() - 1).unwrap();
                let l8: Vec<f32> = answers
                    .all()
                    .iter()
                    .map(|&i| last.get(i as usize).unwrap().to_scalar().unwrap())
                    .collect();
                let want = Decision::from_logits(&l8);
                assert_eq!(d.answer, want.answer);
                assert!((d.margin - want.margin).abs() <= TOL, "{d:?} vs {want:?}");
                assert!((d.true_logit - want.true_logit).abs() <= TOL);
            }
        }
        // An empty continuation decides from the prefix's own last position.
        let whole = model
            .prefill(None, &cat(&doc, &tok.encode(questions[2]).unwrap()))
            .unwrap();
        let a = model
            .decide(&[Continuation::new(Some(&whole), &[])], &answers)
            .unwrap()[0];
        let b = model
            .decide(
                &[Continuation::new(
                    Some(&handle),
                    &tok.encode(questions[2]).unwrap(),
                )],
                &answers,
            )
            .unwrap()[0];
        assert!((a.margin - b.margin).abs() <= TOL);
    }

    #[test]
    fn chain_document_question_labels_equals_full_forward() {
        for dir in [tiny_dir(), big_dir()] {
            let model = Qwen3::load_for_test(dir);
            let reference = Reference::load(dir);
            let vocab = model.config().vocab_size.min(151_669) as u32;
            let (doc, question) = (tokens(31, 21, vocab), tokens(11, 22, vocab));
            let labels = vec![
                tokens(1, 23, vocab),
                tokens(3, 24, vocab),
                tokens(2, 25, vocab),
            ];
            let doc_kv = model.prefill(None, &doc).unwrap();
            let q_kv = model.prefill(Some(&doc_kv), &question).unwrap();
            assert_eq!(q_kv.len(), doc.len() + question.len());
            let before = model.fresh_tokens();
            let got = model.label_logprobs(&q_kv, &labels).unwrap();
            // Only label tokens that predict a later label token are fed: 0 + 2 + 1.
            assert_eq!(model.fresh_tokens() - before, 3);
            let prompt = cat(&doc, &question);
            for (label, g) in labels.iter().zip(&got) {
                let want = reference.label_logprob(&prompt, label);
                assert!((g - want).abs() <= TOL, "label {label:?}: {g} vs {want}");
            }
            // `classify` (prompt prefilled on the document, then labels) gives the same.
            let req = [ClassifyRequest {
                prefix: Some(&doc_kv),
                prompt: &question,
                labels: &labels,
            }];
            let via_classify = model.classify(&req).unwrap();
            for (a, b) in via_classify[0].iter().zip(&got) {
                assert!((a - b).abs() <= TOL);
            }
        }
    }

    #[test]
    fn label_batches_mix_prompts() {
        let dir = tiny_dir();
        let model = Qwen3::load_for_test(dir);
        let reference = Reference::load(dir);
        let (d1, d2) = (tokens(9, 31, 151_669), tokens(17, 32, 151_669));
        let labels1 = vec![tokens(2, 33, 151_669), tokens(4, 34, 151_669)];
        let labels2 = vec![tokens(1, 35, 151_669)];
        let (h1, h2) = (
            model.prefill(None, &d1).unwrap(),
            model.prefill(None, &d2).unwrap(),
        );
        let got = model
            .label_logprobs_batch(&[(&h1, &labels1), (&h2, &labels2)])
            .unwrap();
        for ((p, ls), g) in [(&d1, &labels1), (&d2, &labels2)].into_iter().zip(&got) {
            for (l, v) in ls.iter().zip(g) {
                assert!((v - reference.label_logprob(p, l)).abs() <= TOL);
            }
        }
    }

    #[test]
    fn released_prefix_is_an_error_not_a_panic() {
        let model = Qwen3::load_for_test(tiny_dir());
        let doc = model.prefill(None, &[1, 2, 3]).unwrap();
        let q = model.prefill(Some(&doc), &[4, 5]).unwrap();
        assert!(doc.segment_bytes() > 0);
        assert_eq!(q.total_bytes(), doc.segment_bytes() + q.segment_bytes());
        doc.release();
        assert_eq!(doc.segment_bytes(), 0);
        assert!(q.is_released());
        let err = model.decide(
            &[Continuation::new(Some(&q), &[6])],
            &AnswerIds {
                true_ids: [0; 4],
                false_ids: [1; 4],
            },
        );
        assert!(
            matches!(err, Err(ModelError::ReleasedKv { id }) if id == doc.id()),
            "{err:?}"
        );
        assert!(matches!(
            model.prefill(Some(&doc), &[7]),
            Err(ModelError::ReleasedKv { .. })
        ));
        assert!(matches!(
            model.label_logprobs(&doc, &[vec![1]]),
            Err(ModelError::ReleasedKv { .. })
        ));
    }

    /// An offloaded prefix moves its bytes to the host and refuses use; restored,
    /// it gives the answers it gave before. A view of it is made on the host.
    #[test]
    fn offloaded_prefix_is_refused_until_restored() {
        let model = Qwen3::load_for_test(tiny_dir());
        let ids = AnswerIds {
            true_ids: [0; 4],
            false_ids: [1; 4],
        };
        let doc = model.prefill(None, &[1, 2, 3, 4]).unwrap();
        let q = model.prefill(Some(&doc), &[5, 6]).unwrap();
        let before = model
            .decide(&[Continuation::new(Some(&q), &[7])], &ids)
            .unwrap();
        let bytes = doc.segment_bytes();
        doc.offload().unwrap();
        assert_eq!((doc.segment_bytes(), doc.host_bytes()), (0, bytes));
        assert!(!doc.is_resident() && !q.is_released());
        let err = model.decide(&[Continuation::new(Some(&q), &[7])], &ids);
        assert!(
            matches!(err, Err(ModelError::OffloadedKv { id }) if id == doc.id()),
            "{err:?}"
        );
        let view = doc.prefix(2).unwrap();
        assert!(!view.is_resident());
        doc.restore().unwrap();
        assert_eq!((doc.segment_bytes(), doc.host_bytes()), (bytes, 0));
        let after = model
            .decide(&[Continuation::new(Some(&q), &[7])], &ids)
            .unwrap();
        assert_eq!(before[0].answer, after[0].answer);
        assert!((before[0].margin - after[0].margin).abs() < 1e-6);
        view.restore().unwrap();
        assert!(model.prefill(Some(&view), &[9]).is_ok());
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        let model = Qwen3::load_for_test(tiny_dir());
        let err = model.prefill(None, &[1, 151_936]).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::TokenOutOfVocab {
                    id: 151_936,
                    vocab_size: 151_936
                }
            ),
            "{err}"
        );
        assert!(matches!(
            model.prefill(None, &[]),
            Err(ModelError::InvalidInput(_))
        ));
        let h = model.prefill(None, &[1]).unwrap();
        assert!(matches!(
            model.label_logprobs(&h, &[vec![]]),
            Err(ModelError::InvalidInput(_))
        ));
        assert!(matches!(
            model.label_logprobs(&h, &[vec![200_000]]),
            Err(ModelError::TokenOutOfVocab { .. })
        ));
        let other = Qwen3::load_for_test(tiny_dir());
        let err = other.prefill(Some(&h), &[2]).unwrap_err();
        assert!(err.to_string().contains("another model"), "{err}");
    }

    #[test]
    fn prefix_view_continues_like_the_full_sequence() {
        let dir = tiny_dir();
        let model = Qwen3::load_for_test(dir);
        let reference = Reference::load(dir);
        let seq = tokens(40, 7, 151_669);
        // Two segments: 25 then 15 positions; views cut inside each of them.
        let first = model.prefill(None, &seq[..25]).unwrap();
        let whole = model.prefill(Some(&first), &seq[25..]).unwrap();
        for cut in [10usize, 25, 31] {
            let view = whole.prefix(cut).unwrap();
            assert_eq!(view.len(), cut);
            let before = model.fresh_tokens();
            let cont = model.prefill(Some(&view), &seq[cut..]).unwrap();
            assert_eq!(model.fresh_tokens() - before, (40 - cut) as u64);
            assert_eq!(cont.len(), 40);
            // The continuation's last position equals the full forward's.
            let full = reference.logits(&seq);
            let last = full.get(39).unwrap();
            let mine = model
                .next_token_logits(&[Continuation::new(Some(&view), &seq[cut..])], &[0, 1, 2])
                .unwrap();
            for (j, id) in [0usize, 1, 2].iter().enumerate() {
                let want: f32 = last.get(*id).unwrap().to_scalar().unwrap();
                let have = mine[0][j];
                assert!((want - have).abs() <= TOL, "cut {cut}: {want} vs {have}");
            }
        }
        // A view cannot be scored directly: it has no final position output.
        let err = model
            .decide(
                &[Continuation::new(Some(&whole.prefix(31).unwrap()), &[])],
                &model_answer_ids(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("prefix view"), "{err}");
        assert!(whole.prefix(41).is_err());
    }

    fn model_answer_ids() -> AnswerIds {
        Tokenizer::vendored().unwrap().answer_ids().unwrap()
    }
}

#[cfg(test)]
mod prefix_bits {
    use super::*;
    use crate::Precision;
    use crate::testutil::tiny_dir;
    use crate::tokenizer::Tokenizer;

    /// Whether this CPU runs `precision`'s projections on a GEMM of ours, whose rows
    /// do not depend on what they are batched with (candle's matmul gives no such
    /// promise).
    fn batch_invariant(precision: Precision) -> bool {
        use aisql_kernels::{amx_gemm, f32_gemm, q8_gemm};
        match precision {
            Precision::F32 => f32_gemm::f32_gemm_available(),
            Precision::Q8_0 => q8_gemm::q8_gemm_available() || amx_gemm::amx_available(),
            _ => false,
        }
    }

    #[test]
    fn a_cached_document_decides_with_the_bits_of_the_whole_prompt() {
        // Q8_0 rounds every activation to 8 bits, so a last-bit difference between the
        // cached path and the whole prompt could move a margin by 1e-3 and flip an
        // answer between `--prefix-cache on` and `off`; nothing may differ at all.
        let tok = Tokenizer::vendored().unwrap();
        let answers = tok.answer_ids().unwrap();
        let question = tok
            .encode("Evaluate TRUE or FALSE for the following question: Is this positive?\nANSWER:")
            .unwrap();
        for precision in [Precision::F32, Precision::Q8_0] {
            if !batch_invariant(precision) {
                eprintln!("{precision}: no batch-invariant GEMM on this CPU; not checked");
                continue;
            }
            let model =
                Qwen3::load(tiny_dir(), &candle_core::Device::Cpu, Some(precision)).unwrap();
            for i in 0..12 {
                // Documents of 30 to 140 tokens: key blocks of 64 split differently.
                let doc = tok
                    .encode(&format!(
                        "DOCUMENT:\nReview {i}: {}\n\n",
                        "the acting was superb and the plot tight; ".repeat(1 + i)
                    ))
                    .unwrap();
                let cached = model.prefill(None, &doc).unwrap();
                let a = model
                    .decide(&[Continuation::new(Some(&cached), &question)], &answers)
                    .unwrap()[0];
                let whole: Vec<u32> = doc.iter().chain(&question).copied().collect();
                let b = model
                    .decide(&[Continuation::new(None, &whole)], &answers)
                    .unwrap()[0];
                assert_eq!(
                    (a.margin.to_bits(), a.true_logit.to_bits()),
                    (b.margin.to_bits(), b.true_logit.to_bits()),
                    "{precision}, document {i} ({} tokens): {a:?} vs {b:?}",
                    doc.len()
                );
            }
        }
    }
}
