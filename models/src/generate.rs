//! Greedy decoding over the shared KV cache. Many sequences, each continuing its
//! own (possibly shared) cached prefix, are decoded together: every step is ONE
//! packed forward holding one token per running sequence, and when a sequence
//! ends its slot goes to the next waiting request (continuous batching), whose
//! prompt is prefilled in that same packed pass.
//!
//! Each sequence's KV is a chain of [`KvHandle`]s: the caller's prefix (shared by
//! every sequence over it, never copied), the prompt's segment, then the generated
//! positions. A one-position segment per step would leave attention walking
//! hundreds of tiny segments, and each costs far more than its one key (the CUDA
//! path copies each one separately into its prefix buffer). So generated positions
//! are gathered into blocks of [`BLOCK`] positions, closed, as a segment of its
//! own, once full: a sequence of `n` generated tokens has at most `n / BLOCK + 1`
//! generated segments. Measured on the tiny model (CPU, 16 sequences × 256 tokens
//! after a shared 128-token prompt, `decode_block_sizes`): 800 tokens/s with
//! one-position segments, 960 with blocks of 8, 1130 with blocks of 64, 1190 with
//! 256. On the CPU the open block is a buffer of `BLOCK` positions per layer that
//! each step writes its position into, in place, its segment a view of the
//! positions written (the attention kernel reads such views where they lie); on a
//! GPU it is copied once per step with the new position appended (at Qwen3-0.6B's
//! shape, 28 layers × 8 KV heads × 128, f32, 7 MB per sequence and step on
//! average).

use std::sync::Arc;

use candle_core::{DType, Tensor};

use crate::constrain::{TokenConstraint, allowed_ids, masked_argmax};
use crate::kv::{KvHandle, LayerKv, Segment};
use crate::qwen3::Qwen3;
use crate::score::{Continuation, final_hidden};
use crate::{ModelError, Result};

/// Generated positions per closed KV segment: the CPU attention kernel's key block,
/// so a closed block fills its tiles exactly.
const BLOCK: usize = 64;

/// One sequence to generate: tokens after an optional cached prefix.
#[derive(Debug, Clone, Copy)]
pub struct GenerateRequest<'a> {
    /// Cached prefix the prompt continues (e.g. a document), or `None`.
    pub prefix: Option<&'a KvHandle>,
    /// Prompt tokens after the prefix; may be empty when `prefix` is given (the
    /// first token then comes from the prefix's own last position).
    pub prompt: &'a [u32],
    /// The most tokens to generate (at least 1).
    pub max_tokens: usize,
}

impl<'a> GenerateRequest<'a> {
    /// Up to `max_tokens` tokens after `prompt` after `prefix`.
    pub fn new(prefix: Option<&'a KvHandle>, prompt: &'a [u32], max_tokens: usize) -> Self {
        Self {
            prefix,
            prompt,
            max_tokens,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced a stop id (not included in the tokens), or the
    /// request's constraint allowed nothing after the last token.
    Stop,
    /// `max_tokens` tokens were generated.
    Length,
}

/// What one request generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The generated tokens, without the stop id.
    pub token_ids: Vec<u32>,
    /// Why generation ended.
    pub finish: FinishReason,
}

/// A request being decoded.
struct Running {
    /// Index of the request.
    item: usize,
    /// The most tokens it may generate.
    max_tokens: usize,
    /// Tokens generated so far; the last one is fed by the next step.
    tokens: Vec<u32>,
    /// The chain's closed part: the caller's prefix, the prompt's segment or the
    /// last full block of generated positions.
    closed: KvHandle,
    /// Generated positions after `closed`, fewer than a block, as one segment.
    open: Option<KvHandle>,
    /// On the CPU, the open block's buffers, `(num_kv_heads, block, head_dim)` per
    /// layer, of which `open` views the positions written.
    buffers: Option<Vec<LayerKv>>,
    /// Handles this generation made (its prompt, its closed blocks): released
    /// when it ends. The caller's prefix is never among them.
    made: Vec<KvHandle>,
}

impl Running {
    /// The handle the next token continues.
    fn tip(&self) -> &KvHandle {
        self.open.as_ref().unwrap_or(&self.closed)
    }

    /// Frees the KV this generation made.
    fn release(&self) {
        self.made
            .iter()
            .chain(&self.open)
            .for_each(KvHandle::release);
    }
}

impl Qwen3 {
    /// Greedy decoding (argmax, ties to the lowest id) of every request, until a
    /// token of `stop_ids` (left out of the result) or `max_tokens` tokens. At most
    /// `max_batch` sequences decode at once, one packed forward per step; a
    /// finished sequence's slot goes to the next request in order. The caller's
    /// prefix handles are shared, not copied, and stay valid; the KV made here is
    /// released before returning. Results are in request order.
    pub fn generate(
        &self,
        requests: &[GenerateRequest<'_>],
        stop_ids: &[u32],
        max_batch: usize,
    ) -> Result<Vec<Generation>> {
        self.generate_until(requests, stop_ids, max_batch, &|| false)
    }

    /// [`Self::generate`] that gives up between two decode steps once
    /// `stopped()` says so (a cancelled or timed-out query), with
    /// [`ModelError::Stopped`]; the KV made so far is released.
    pub fn generate_until(
        &self,
        requests: &[GenerateRequest<'_>],
        stop_ids: &[u32],
        max_batch: usize,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Generation>> {
        self.generate_in_blocks(requests, &mut [], stop_ids, max_batch, BLOCK, stopped)
    }

    /// [`Self::generate_until`] where each request may carry a constraint
    /// (`constraints[i]` for request `i`, `None` for a free one): every token
    /// is the greedy pick among the tokens its constraint allows, and a
    /// sequence ends, as at a stop id, once its constraint says nothing may
    /// follow. A request that ends by its `max_tokens` may leave its
    /// constraint incomplete ([`TokenConstraint::is_complete`] says so).
    pub fn generate_constrained_until(
        &self,
        requests: &[GenerateRequest<'_>],
        constraints: &mut [Option<Box<dyn TokenConstraint>>],
        stop_ids: &[u32],
        max_batch: usize,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Generation>> {
        if constraints.len() != requests.len() {
            return Err(ModelError::InvalidInput(format!(
                "{} constraints for {} requests",
                constraints.len(),
                requests.len()
            )));
        }
        self.generate_in_blocks(requests, constraints, stop_ids, max_batch, BLOCK, stopped)
    }

    /// [`Self::generate_until`] with closed KV blocks of `block` generated
    /// positions.
    fn generate_in_blocks(
        &self,
        requests: &[GenerateRequest<'_>],
        constraints: &mut [Option<Box<dyn TokenConstraint>>],
        stop_ids: &[u32],
        max_batch: usize,
        block: usize,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Generation>> {
        self.check_generate(requests, stop_ids, max_batch)?;
        let mut out: Vec<Option<Generation>> = vec![None; requests.len()];
        let mut running: Vec<Running> = Vec::new();
        let mut waiting = 0..requests.len();
        let result = loop {
            let admit: Vec<usize> = waiting.by_ref().take(max_batch - running.len()).collect();
            if running.is_empty() && admit.is_empty() {
                break Ok(());
            }
            if stopped() {
                break Err(ModelError::Stopped);
            }
            let step =
                self.decode_step(requests, constraints, stop_ids, &admit, &mut running, block);
            if let Err(e) = step {
                break Err(e);
            }
            // Retire finished sequences, freeing their slots and their KV.
            running.retain_mut(|r| {
                let last = *r.tokens.last().expect("every running sequence has a token");
                let closed = constraints
                    .get(r.item)
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.must_stop());
                let finish = if stop_ids.contains(&last) {
                    r.tokens.pop();
                    FinishReason::Stop
                } else if closed {
                    FinishReason::Stop
                } else if r.tokens.len() >= r.max_tokens {
                    FinishReason::Length
                } else {
                    return true;
                };
                r.release();
                out[r.item] = Some(Generation {
                    token_ids: std::mem::take(&mut r.tokens),
                    finish,
                });
                false
            });
        };
        // On an error the sequences still running free their KV too.
        running.iter().for_each(Running::release);
        result?;
        Ok(out
            .into_iter()
            .map(|g| g.expect("every request ran to its end"))
            .collect())
    }

    /// One packed forward: each running sequence feeds its last token, each
    /// admitted request its prompt. Appends the next token of every sequence
    /// (admitted ones join `running`) and the fed positions' KV to their chains.
    fn decode_step(
        &self,
        requests: &[GenerateRequest<'_>],
        constraints: &mut [Option<Box<dyn TokenConstraint>>],
        stop_ids: &[u32],
        admit: &[usize],
        running: &mut Vec<Running>,
        block: usize,
    ) -> Result<()> {
        let mut items: Vec<Continuation<'_>> = running
            .iter()
            .map(|r| Continuation::new(Some(r.tip()), &r.tokens[r.tokens.len() - 1..]))
            .collect();
        items.extend(
            admit
                .iter()
                .map(|&i| Continuation::new(requests[i].prefix, requests[i].prompt)),
        );
        let (tokens, seqs, rows) = self.pack(&items)?;
        let packed = if seqs.is_empty() {
            None
        } else {
            // Running sequences come first, one generated token each.
            Some(self.forward_packed(&tokens, &seqs, true, running.len())?)
        };
        self.count_decode_tokens(running.len());

        // The hidden state that predicts each item's next token: its last fed row,
        // or, for a request with no prompt, its prefix's own last position.
        let mut hidden: Vec<Option<Tensor>> = vec![None; items.len()];
        let mut kv: Vec<Option<Vec<LayerKv>>> = vec![None; items.len()];
        if let Some(packed) = packed {
            let layers = packed.kv.expect("keep_kv was requested");
            for ((&(item, start), seq), layers) in rows.iter().zip(&seqs).zip(layers) {
                hidden[item] = Some(packed.hidden.get(start + seq.len - 1)?);
                kv[item] = Some(layers);
            }
        }
        for (slot, &i) in hidden[running.len()..].iter_mut().zip(admit) {
            if slot.is_none() {
                let prefix = requests[i].prefix.expect("validated: a prefix or a prompt");
                *slot = Some(final_hidden(prefix)?);
            }
        }
        let hidden: Vec<Tensor> = hidden
            .into_iter()
            .map(|h| h.expect("every item has a row"))
            .collect();
        // Rows in item order: the running sequences, then the admitted ones.
        let order: Vec<usize> = running
            .iter()
            .map(|r| r.item)
            .chain(admit.iter().copied())
            .collect();
        let masks = order
            .iter()
            .map(|&i| match constraints.get_mut(i).and_then(Option::as_mut) {
                Some(c) => c.mask().map(Some).map_err(|e| constraint_error(i, &e)),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        // A sequence that leaves its constraint ends as at the first stop id.
        let leaves = order
            .iter()
            .map(|&i| {
                let leaves = constraints
                    .get(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.may_leave());
                match (leaves, stop_ids.first()) {
                    (false, _) => Ok(None),
                    (true, Some(&stop)) => Ok(Some(stop)),
                    (true, None) => Err(constraint_error(
                        i,
                        "it may be left, which ends a sequence at a stop id, and none was given",
                    )),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let next = self.greedy(&Tensor::stack(&hidden, 0)?, &masks, &leaves)?;
        for (&i, &t) in order.iter().zip(&next) {
            if let Some(c) = constraints.get_mut(i).and_then(Option::as_mut)
                && !stop_ids.contains(&t)
            {
                c.accept(t).map_err(|e| constraint_error(i, &e))?;
            }
        }

        let mut kv = kv.into_iter();
        for r in running.iter_mut() {
            let layers = kv
                .next()
                .flatten()
                .expect("a running sequence feeds a token");
            self.append_generated(r, layers, block)?;
        }
        for (&i, layers) in admit.iter().zip(kv) {
            let request = &requests[i];
            let (closed, made) = match layers {
                Some(layers) => {
                    // Never scored: the row that follows it was read above.
                    let segment = Segment {
                        layers: Arc::new(layers),
                        last_hidden: None,
                    };
                    let h = self.new_handle(request.prefix.cloned(), segment);
                    (h.clone(), vec![h])
                }
                None => (
                    request
                        .prefix
                        .expect("validated: a prefix or a prompt")
                        .clone(),
                    Vec::new(),
                ),
            };
            running.push(Running {
                item: i,
                max_tokens: request.max_tokens,
                tokens: Vec::with_capacity(request.max_tokens.min(1024)),
                closed,
                open: None,
                buffers: None,
                made,
            });
        }
        for (r, &t) in running.iter_mut().zip(&next) {
            r.tokens.push(t);
        }
        Ok(())
    }

    /// Appends one fed position's KV to `r`'s chain: to its open block (written in
    /// place on the CPU, else a copy of the block with the position added), which
    /// closes once `block` positions long.
    fn append_generated(&self, r: &mut Running, layers: Vec<LayerKv>, block: usize) -> Result<()> {
        let layers = if self.device().is_cpu() {
            self.write_in_place(r, layers, block)?
        } else {
            match r.open.take() {
                None => layers,
                Some(open) => {
                    let old = open.segment()?;
                    let joined = old
                        .layers
                        .iter()
                        .zip(layers)
                        .map(|((ok, ov), (k, v))| {
                            Ok((Tensor::cat(&[ok, &k], 1)?, Tensor::cat(&[ov, &v], 1)?))
                        })
                        .collect::<Result<Vec<LayerKv>>>()?;
                    open.release();
                    joined
                }
            }
        };
        // Never scored: each position's next token is read when it is fed.
        let segment = Segment {
            layers: Arc::new(layers),
            last_hidden: None,
        };
        let handle = self.new_handle(Some(r.closed.clone()), segment);
        if handle.segment_len() >= block {
            r.made.push(handle.clone());
            r.closed = handle;
            r.buffers = None;
        } else {
            r.open = Some(handle);
        }
        Ok(())
    }

    /// Writes one position's KV (`(num_kv_heads, 1, head_dim)` per layer) after
    /// the open block's positions in its buffers (made when the block opens) and
    /// returns the views of the positions written, the block's new segment; the
    /// old open segment is released (its views share the buffers).
    fn write_in_place(
        &self,
        r: &mut Running,
        layers: Vec<LayerKv>,
        block: usize,
    ) -> Result<Vec<LayerKv>> {
        let written = match r.open.take() {
            Some(open) => {
                let n = open.segment_len();
                open.release();
                n
            }
            None => 0,
        };
        let buffers = match &mut r.buffers {
            Some(b) if written > 0 => b,
            slot => {
                let new = layers
                    .iter()
                    .map(|(k, v)| {
                        let (heads, _, d) = k.dims3()?;
                        let buffer =
                            |t: &Tensor| Tensor::zeros((heads, block, d), t.dtype(), t.device());
                        Ok((buffer(k)?, buffer(v)?))
                    })
                    .collect::<Result<Vec<LayerKv>>>()?;
                slot.insert(new)
            }
        };
        buffers
            .iter()
            .zip(layers)
            .map(|((bk, bv), (k, v))| {
                bk.slice_set(&k.contiguous()?, 1, written)?;
                bv.slice_set(&v.contiguous()?, 1, written)?;
                Ok((bk.narrow(1, 0, written + 1)?, bv.narrow(1, 0, written + 1)?))
            })
            .collect()
    }

    /// The argmax token of each row of `hidden` `(n, hidden)`, ties to the
    /// lowest id, among the tokens of the row's mask where it has one; a row
    /// with `leave[row]` set picks that id instead when a token outside its
    /// mask is strictly better than every allowed one.
    fn greedy(
        &self,
        hidden: &Tensor,
        masks: &[Option<Vec<u32>>],
        leave: &[Option<u32>],
    ) -> Result<Vec<u32>> {
        let picks = if masks.iter().any(Option::is_some) {
            self.masked_picks(hidden, masks, leave)?
        } else {
            self.free_picks(hidden)?
        };
        picks
            .into_iter()
            .enumerate()
            .map(|(row, id)| {
                id.ok_or_else(|| {
                    ModelError::InvalidInput(format!(
                        "sequence {row} of a decode step has NaN logits"
                    ))
                })
            })
            .collect()
    }

    /// Per row of `hidden`, the argmax over the tokens of its mask (all where
    /// it has none), or its `leave` id (see [`Self::greedy`]): the logits
    /// come to the host as rows `(n, vocab)`.
    fn masked_picks(
        &self,
        hidden: &Tensor,
        masks: &[Option<Vec<u32>>],
        leave: &[Option<u32>],
    ) -> Result<Vec<Option<u32>>> {
        // A row that may leave needs the whole vocabulary's best.
        if leave.iter().all(Option::is_none)
            && let Some(picks) = self.few_token_picks(hidden, masks)?
        {
            return Ok(picks);
        }
        let rows = match self.block_head_logits(hidden)? {
            Some(logits) => logits,
            None => self.lm_head().matmul(&hidden.t()?.contiguous()?)?.t()?,
        };
        let vocab = rows.dim(1)?;
        let values = rows
            .to_dtype(DType::F32)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?;
        values
            .chunks_exact(vocab)
            .zip(masks)
            .zip(leave)
            .map(|((row, mask), leave)| {
                let Some(mask) = mask else {
                    return Ok(argmax_row(row));
                };
                let Some(best) = masked_argmax(mask, vocab, |id| row[id])? else {
                    return Ok(None);
                };
                Ok(match leave {
                    None => Some(best),
                    Some(leave) => argmax_row(row).map(|top| {
                        if row[top as usize] > row[best as usize] {
                            *leave
                        } else {
                            best
                        }
                    }),
                })
            })
            .collect()
    }

    /// [`Self::masked_picks`] when every row is masked to few tokens (a
    /// token trie's children, a number's digits) and the head is the
    /// model's own (no block-format decode head, whose logits the picks must
    /// stay those of): only the head rows of the tokens some row allows are
    /// multiplied. `None` when the masks allow too many.
    fn few_token_picks(
        &self,
        hidden: &Tensor,
        masks: &[Option<Vec<u32>>],
    ) -> Result<Option<Vec<Option<u32>>>> {
        /// More allowed tokens than this are cheaper through the whole head.
        const FEW: usize = 4096;
        if self.has_block_head() || masks.iter().any(Option::is_none) {
            return Ok(None);
        }
        let words = masks.iter().flatten().map(Vec::len).max().unwrap_or(0);
        let mut union = vec![0u32; words];
        for mask in masks.iter().flatten() {
            union.iter_mut().zip(mask).for_each(|(u, m)| *u |= m);
        }
        let vocab = self.lm_head().dim(0)?;
        let ids: Vec<u32> = allowed_ids(&union)
            .take_while(|&id| id < vocab)
            .map(|id| id as u32)
            .collect();
        if ids.len() > FEW || ids.is_empty() {
            return Ok(None);
        }
        let logits = aisql_kernels::restricted_head(hidden, self.lm_head(), &ids)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let at = |id: usize| {
            ids.binary_search(&(id as u32))
                .expect("an allowed id is in the union")
        };
        let picks = logits
            .iter()
            .zip(masks.iter().flatten())
            .map(|(row, mask)| masked_argmax(mask, vocab, |id| row[at(id)]))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(picks))
    }

    /// Per row of `hidden`, the argmax over the whole vocabulary.
    fn free_picks(&self, hidden: &Tensor) -> Result<Vec<Option<u32>>> {
        Ok(match self.block_head_logits(hidden)? {
            // A head in the file's block format (a quantized GGUF): its own kernel,
            // rows `(n, vocab)`.
            Some(logits) => argmax_rows_host(&logits)?,
            None => {
                // Logits transposed, `(vocab, n)`: the head's rows stream through
                // the matmul in their stored order (on the CPU about 3× faster than
                // `hidden · headᵀ` at the tiny shape).
                let logits = self
                    .lm_head()
                    .matmul(&hidden.t()?.contiguous()?)?
                    .to_dtype(DType::F32)?;
                // On the CPU the logits are host memory already: one scan. On a
                // device, reduce there so only `n` ids come back.
                if logits.device().is_cpu() {
                    argmax_columns_host(&logits)?
                } else {
                    argmax_columns_device(&logits)?
                }
            }
        })
    }

    /// Rejects requests [`Self::generate`] cannot run, before any work.
    fn check_generate(
        &self,
        requests: &[GenerateRequest<'_>],
        stop_ids: &[u32],
        max_batch: usize,
    ) -> Result<()> {
        let bad = |m: String| Err(ModelError::InvalidInput(m));
        if max_batch == 0 {
            return bad("max_batch must be at least 1".into());
        }
        self.check_tokens(stop_ids)?;
        let limit = self.config().max_position_embeddings;
        for (i, r) in requests.iter().enumerate() {
            if r.max_tokens == 0 {
                return bad(format!("request {i}: max_tokens must be at least 1"));
            }
            self.check_tokens(r.prompt)?;
            let prefix_len = match r.prefix {
                Some(h) => {
                    self.check_handle(h)?;
                    h.chain()?;
                    if r.prompt.is_empty() {
                        final_hidden(h)?;
                    }
                    h.len()
                }
                None if r.prompt.is_empty() => {
                    return bad(format!(
                        "request {i}: no prefix and no prompt: nothing to continue"
                    ));
                }
                None => 0,
            };
            let total = prefix_len
                .saturating_add(r.prompt.len())
                .saturating_add(r.max_tokens);
            if total > limit {
                return bad(format!(
                    "request {i}: {prefix_len} prefix + {} prompt + {} new tokens exceed the \
                     model's {limit} positions (max_position_embeddings)",
                    r.prompt.len(),
                    r.max_tokens
                ));
            }
        }
        Ok(())
    }
}

/// Per column of `logits` `(vocab, n)` f32, the index of its largest value, ties
/// to the lowest index; `None` for a column holding NaN.
fn argmax_columns_host(logits: &Tensor) -> Result<Vec<Option<u32>>> {
    let n = logits.dim(1)?;
    let values = logits.flatten_all()?.to_vec1::<f32>()?;
    let mut best = vec![0u32; n];
    let mut best_value = vec![f32::NEG_INFINITY; n];
    let mut nan = vec![false; n];
    for (id, row) in values.chunks_exact(n).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            // Strictly greater: an equal value later in the vocabulary loses.
            if x > best_value[c] {
                best_value[c] = x;
                best[c] = id as u32;
            }
            nan[c] |= x.is_nan();
        }
    }
    Ok(best
        .into_iter()
        .zip(nan)
        .map(|(id, nan)| (!nan).then_some(id))
        .collect())
}

/// Per row of `logits` `(n, vocab)` f32 on the CPU, the index of its largest
/// value, ties to the lowest index; `None` for a row holding NaN.
fn argmax_rows_host(logits: &Tensor) -> Result<Vec<Option<u32>>> {
    let vocab = logits.dim(1)?;
    let values = logits.flatten_all()?.to_vec1::<f32>()?;
    Ok(values.chunks_exact(vocab).map(argmax_row).collect())
}

/// The index of the largest value of `row`, ties to the lowest index; `None`
/// for a row holding NaN.
fn argmax_row(row: &[f32]) -> Option<u32> {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (id, &x) in row.iter().enumerate() {
        // Strictly greater: an equal value later in the vocabulary loses.
        if x > best_value {
            best_value = x;
            best = id as u32;
        }
    }
    (!row.iter().any(|x| x.is_nan())).then_some(best)
}

/// The error of request `i`'s constraint.
fn constraint_error(i: usize, e: &str) -> ModelError {
    ModelError::InvalidInput(format!("the decoding constraint of request {i}: {e}"))
}

/// [`argmax_columns_host`] in tensor ops on the logits' device: the lowest index
/// holding the column's maximum.
fn argmax_columns_device(logits: &Tensor) -> Result<Vec<Option<u32>>> {
    let (vocab, n) = logits.dims2()?;
    let device = logits.device();
    let ids = Tensor::arange(0u32, vocab as u32, device)?
        .unsqueeze(1)?
        .broadcast_as((vocab, n))?;
    let past_end = Tensor::full(vocab as u32, (vocab, n), device)?;
    let first = logits
        .broadcast_eq(&logits.max_keepdim(0)?)?
        .where_cond(&ids, &past_end)?
        .min(0)?
        .to_vec1::<u32>()?;
    // NaN is the one value not equal to itself.
    let nan = logits.ne(logits)?.max(0)?.to_vec1::<u8>()?;
    Ok(first
        .into_iter()
        .zip(nan)
        .map(|(id, nan)| (nan == 0 && (id as usize) < vocab).then_some(id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Reference, big_dir, tiny_dir, tokens};
    use std::path::Path;

    /// Logits within this of the maximum are a near-tie: f32 rounding may pick
    /// either token, so a different pick there is not a decoding error.
    const NEAR_TIE: f32 = 1e-4;

    /// Index of the largest value, ties to the lowest index.
    fn argmax(v: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Checks `got` against plain greedy decoding by the reference with no cache:
    /// every token (and the stop that ended it) is the argmax of a full forward of
    /// `context` + the tokens before it. Returns how many picks were near-ties.
    fn check_against_reference(
        reference: &Reference,
        context: &[u32],
        max_tokens: usize,
        stop_ids: &[u32],
        got: &Generation,
        what: &str,
    ) -> usize {
        let mut seq = context.to_vec();
        let mut near_ties = 0;
        // The tokens, then the stop id when generation stopped.
        let stop = (got.finish == FinishReason::Stop).then_some(None);
        let picks = got.token_ids.iter().map(Some).chain(stop);
        for (j, pick) in picks.enumerate() {
            let logits = reference.next_logits(&seq);
            let want = argmax(&logits);
            let ok = match pick {
                Some(&t) => {
                    assert!(!stop_ids.contains(&t), "{what}: stop id {t} returned");
                    t
                }
                // The stop id is not returned: whichever the reference picks must be one.
                None => *stop_ids
                    .iter()
                    .find(|&&s| s == want || logits[want as usize] - logits[s as usize] <= NEAR_TIE)
                    .unwrap_or_else(|| {
                        panic!("{what}: stopped, but the reference continues with {want}")
                    }),
            };
            if ok != want {
                let gap = logits[want as usize] - logits[ok as usize];
                assert!(
                    gap <= NEAR_TIE,
                    "{what}: token {j} is {ok}, the reference picks {want} (logit gap {gap})"
                );
                near_ties += 1;
            }
            if let Some(&t) = pick {
                seq.push(t);
            }
        }
        match got.finish {
            FinishReason::Length => assert_eq!(got.token_ids.len(), max_tokens, "{what}"),
            FinishReason::Stop => assert!(got.token_ids.len() < max_tokens, "{what}"),
        }
        near_ties
    }

    /// 50 seeded requests (varied prompt lengths and max_tokens; most over one of
    /// four shared document prefixes, a few with no prompt of their own, a few with
    /// no prefix; one long enough to close several KV blocks) decoded `max_batch` at
    /// a time equal plain greedy decoding by the reference with no cache.
    fn check_generation(dir: &Path, vocab: u32, block: usize) {
        let model = Qwen3::load_for_test(dir);
        let reference = Reference::load(dir);
        let docs: Vec<Vec<u32>> = [5, 17, 33, 70]
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(n, 1000 + i as u64, vocab))
            .collect();
        let handles: Vec<KvHandle> = docs
            .iter()
            .map(|d| model.prefill(None, d).unwrap())
            .collect();
        let prompts: Vec<Vec<u32>> = (0..50u64)
            .map(|j| match j % 9 {
                // Some requests continue their prefix directly.
                4 => Vec::new(),
                _ => tokens(1 + (j as usize * 7) % 23, j, vocab),
            })
            .collect();
        let prefix_of = |j: usize| match j % 9 {
            0 | 7 => None,
            _ => Some(j % 4),
        };
        let max_tokens = |j: usize| match j {
            11 => 2 * block + 13,
            _ => 1 + (j * 5) % 12,
        };
        // A stop id known to come up: the reference's third token for request 1.
        let context = |j: usize| -> Vec<u32> {
            let doc: &[u32] = prefix_of(j).map_or(&[], |d| &docs[d]);
            doc.iter().chain(&prompts[j]).copied().collect()
        };
        let mut seq = context(1);
        for _ in 0..3 {
            seq.push(argmax(&reference.next_logits(&seq)));
        }
        let stop_ids = [seq[seq.len() - 1], vocab - 1];

        let requests: Vec<GenerateRequest> = (0..50)
            .map(|j| {
                GenerateRequest::new(
                    prefix_of(j).map(|d| &handles[d]),
                    &prompts[j],
                    max_tokens(j),
                )
            })
            .collect();
        let got = model
            .generate_in_blocks(&requests, &mut [], &stop_ids, 6, block, &|| false)
            .unwrap();
        let mut near_ties = 0;
        for (j, g) in got.iter().enumerate() {
            near_ties += check_against_reference(
                &reference,
                &context(j),
                max_tokens(j),
                &stop_ids,
                g,
                &format!("request {j}"),
            );
        }
        let stops = got
            .iter()
            .filter(|g| g.finish == FinishReason::Stop)
            .count();
        let generated: usize = got.iter().map(|g| g.token_ids.len()).sum();
        eprintln!(
            "{} requests, {generated} tokens, {stops} stopped, {near_ties} near-ties",
            got.len()
        );
        assert!(stops >= 1 && stops < got.len(), "{stops} of 50 stopped");
        assert!(got[11].token_ids.len() > 2 * block || got[11].finish == FinishReason::Stop);
        assert!(near_ties <= 1, "{near_ties} near-ties");
        // The shared prefixes are the caller's: still there, still usable.
        for h in &handles {
            assert!(!h.is_released());
            model.prefill(Some(h), &[1]).unwrap();
        }
    }

    #[test]
    fn tiny_batched_generation_equals_uncached_greedy() {
        check_generation(tiny_dir(), 151_669, BLOCK);
    }

    /// Small blocks: many closed segments per sequence, and blocks closing while
    /// other sequences join and leave.
    #[test]
    fn tiny_generation_with_small_blocks_equals_uncached_greedy() {
        check_generation(tiny_dir(), 151_669, 3);
    }

    #[test]
    fn gqa_untied_generation_equals_uncached_greedy() {
        check_generation(big_dir(), 1000, 5);
    }

    #[test]
    fn counters_count_the_positions_fed() {
        let model = Qwen3::load_for_test(tiny_dir());
        let doc = model.prefill(None, &tokens(9, 1, 151_669)).unwrap();
        let prompt = tokens(5, 2, 151_669);
        let (fresh, decode) = (model.fresh_tokens(), model.decode_tokens());
        let requests = [
            // 5 prompt positions, then 6 tokens of which the first 5 are fed back.
            GenerateRequest::new(None, &prompt, 6),
            // No prompt: 4 tokens, 3 fed back.
            GenerateRequest::new(Some(&doc), &[], 4),
            GenerateRequest::new(Some(&doc), &prompt, 1),
        ];
        let got = model.generate(&requests, &[], 2).unwrap();
        assert!(got.iter().all(|g| g.finish == FinishReason::Length));
        assert_eq!(
            got.iter().map(|g| g.token_ids.len()).collect::<Vec<_>>(),
            [6, 4, 1]
        );
        assert_eq!(model.decode_tokens() - decode, 5 + 3);
        assert_eq!(model.fresh_tokens() - fresh, 5 + 5 + 3 + 5);
        // A stop: the tokens up to and with the stop id are produced, all but it fed.
        let stop = got[0].token_ids[2];
        let first = got[0].token_ids.iter().position(|&t| t == stop).unwrap();
        let (fresh, decode) = (model.fresh_tokens(), model.decode_tokens());
        let again = model.generate(&requests[..1], &[stop], 1).unwrap();
        assert_eq!(again[0].finish, FinishReason::Stop);
        assert_eq!(again[0].token_ids, got[0].token_ids[..first]);
        assert_eq!(model.decode_tokens() - decode, first as u64);
        assert_eq!(model.fresh_tokens() - fresh, 5 + first as u64);
        assert!(doc.segment_bytes() > 0 && !doc.is_released());
    }

    #[test]
    fn a_stopped_generation_ends_between_steps_and_keeps_the_callers_prefix() {
        let model = Qwen3::load_for_test(tiny_dir());
        let doc = model.prefill(None, &tokens(9, 1, 151_669)).unwrap();
        let requests = [
            GenerateRequest::new(Some(&doc), &[], 50),
            GenerateRequest::new(Some(&doc), &[], 50),
        ];
        let steps = std::cell::Cell::new(0);
        let decode = model.decode_tokens();
        let e = model
            .generate_until(&requests, &[], 2, &|| {
                steps.set(steps.get() + 1);
                steps.get() > 3
            })
            .unwrap_err();
        assert!(matches!(e, ModelError::Stopped), "{e}");
        // Three steps ran (the first reads the prefix's last hidden state).
        assert_eq!(model.decode_tokens() - decode, 2 * 2);
        assert!(doc.segment_bytes() > 0 && !doc.is_released());
        // The prefix serves the next generation whole.
        let again = model.generate(&requests, &[], 2).unwrap();
        assert_eq!(again[0].token_ids.len(), 50);
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        let model = Qwen3::load_for_test(tiny_dir());
        let doc = model.prefill(None, &[1, 2, 3]).unwrap();
        let invalid =
            |requests: &[GenerateRequest], stop: &[u32], batch: usize, says: &str| match model
                .generate(requests, stop, batch)
            {
                Err(ModelError::InvalidInput(m)) => assert!(m.contains(says), "{m}"),
                other => panic!("expected an InvalidInput error saying {says:?}, got {other:?}"),
            };
        let one = [GenerateRequest::new(None, &[1], 2)];
        invalid(&one, &[], 0, "max_batch");
        invalid(
            &[GenerateRequest::new(None, &[1], 0)],
            &[],
            1,
            "max_tokens must be at least 1",
        );
        invalid(
            &[GenerateRequest::new(None, &[], 3)],
            &[],
            1,
            "no prefix and no prompt",
        );
        invalid(
            &[GenerateRequest::new(Some(&doc), &[4], 40_957)],
            &[],
            1,
            "3 prefix + 1 prompt + 40957 new tokens exceed the model's 40960 positions",
        );
        invalid(
            &[GenerateRequest::new(None, &[4], usize::MAX)],
            &[],
            1,
            "max_position_embeddings",
        );
        invalid(
            &[GenerateRequest::new(Some(&doc.prefix(2).unwrap()), &[], 2)],
            &[],
            1,
            "prefix view",
        );
        assert!(matches!(
            model.generate(&[GenerateRequest::new(None, &[151_936], 2)], &[], 1),
            Err(ModelError::TokenOutOfVocab { id: 151_936, .. })
        ));
        assert!(matches!(
            model.generate(&one, &[200_000], 1),
            Err(ModelError::TokenOutOfVocab { id: 200_000, .. })
        ));
        let other = Qwen3::load_for_test(tiny_dir());
        let err = other
            .generate(&[GenerateRequest::new(Some(&doc), &[1], 2)], &[], 1)
            .unwrap_err();
        assert!(err.to_string().contains("another model"), "{err}");
        let gone = model.prefill(None, &[5]).unwrap();
        gone.release();
        assert!(matches!(
            model.generate(&[GenerateRequest::new(Some(&gone), &[1], 2)], &[], 1),
            Err(ModelError::ReleasedKv { .. })
        ));
        // Nothing asked, nothing done.
        assert!(model.generate(&[], &[], 1).unwrap().is_empty());
    }

    /// A test constraint: the `k`-th token must be `≡ k (mod 3)`; the text is
    /// complete after 2 tokens and closed after `closes_after`.
    struct Modular {
        vocab: usize,
        accepted: Vec<u32>,
        closes_after: usize,
    }

    impl TokenConstraint for Modular {
        fn mask(&mut self) -> std::result::Result<Vec<u32>, String> {
            let k = self.accepted.len() % 3;
            let mut mask = vec![0u32; self.vocab.div_ceil(32)];
            for id in (k..self.vocab).step_by(3) {
                mask[id / 32] |= 1 << (id % 32);
            }
            Ok(mask)
        }
        fn accept(&mut self, token: u32) -> std::result::Result<(), String> {
            if token as usize % 3 != self.accepted.len() % 3 {
                return Err(format!("token {token} breaks the rule"));
            }
            self.accepted.push(token);
            Ok(())
        }
        fn must_stop(&self) -> bool {
            self.accepted.len() >= self.closes_after
        }
        fn is_complete(&mut self) -> bool {
            self.accepted.len() >= 2
        }
    }

    /// Checks request `j`'s `tokens` after `seq`, decoded under [`Modular`]
    /// (ids below `below`): the `k`-th is `≡ k (mod 3)` and the reference's
    /// argmax among those ids, up to a near-tie. Returns the near-ties.
    fn check_modular_picks(
        reference: &Reference,
        mut seq: Vec<u32>,
        tokens: &[u32],
        below: usize,
        j: usize,
    ) -> usize {
        let mut near_ties = 0;
        for (k, &t) in tokens.iter().enumerate() {
            assert_eq!(t as usize % 3, k % 3, "request {j} token {k}");
            let logits = reference.next_logits(&seq);
            let want = (k % 3..below)
                .step_by(3)
                .fold(k % 3, |b, i| if logits[i] > logits[b] { i } else { b });
            let gap = logits[want] - logits[t as usize];
            assert!(
                gap <= NEAR_TIE,
                "request {j} token {k}: {t}, the reference picks {want}"
            );
            near_ties += usize::from(t as usize != want);
            seq.push(t);
        }
        near_ties
    }

    /// Constrained sequences pick the reference's argmax among the allowed
    /// tokens, end where their constraint closes, and leave the free
    /// sequences batched beside them as they were.
    #[test]
    fn constrained_generation_picks_the_best_allowed_token() {
        let vocab = 151_669;
        let model = Qwen3::load_for_test(tiny_dir());
        let reference = Reference::load(tiny_dir());
        let doc = tokens(21, 7, vocab as u32);
        let handle = model.prefill(None, &doc).unwrap();
        let prompts: Vec<Vec<u32>> = (0..6)
            .map(|j| tokens(1 + j, 40 + j as u64, vocab as u32))
            .collect();
        let requests: Vec<GenerateRequest> = prompts
            .iter()
            .map(|p| GenerateRequest::new(Some(&handle), p, 6))
            .collect();
        let mut constraints: Vec<Option<Box<dyn TokenConstraint>>> = (0..6)
            .map(|j| {
                (j % 3 != 2).then(|| {
                    Box::new(Modular {
                        vocab,
                        accepted: Vec::new(),
                        closes_after: if j == 0 { 4 } else { 100 },
                    }) as Box<dyn TokenConstraint>
                })
            })
            .collect();
        let got = model
            .generate_constrained_until(&requests, &mut constraints, &[], 4, &|| false)
            .unwrap();
        let free = model.generate(&requests, &[], 4).unwrap();
        let mut near_ties = 0;
        for (j, g) in got.iter().enumerate() {
            let seq: Vec<u32> = doc.iter().chain(&prompts[j]).copied().collect();
            if j % 3 == 2 {
                assert_eq!(g, &free[j], "free request {j}");
                continue;
            }
            let want_len = if j == 0 { 4 } else { 6 };
            assert_eq!(g.token_ids.len(), want_len, "request {j}");
            let want_finish = if j == 0 {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            assert_eq!(g.finish, want_finish, "request {j}");
            near_ties += check_modular_picks(&reference, seq, &g.token_ids, vocab, j);
        }
        assert!(near_ties <= 1, "{near_ties} near-ties");
        // A constraint's error fails the call, naming the request.
        let mut broken: Vec<Option<Box<dyn TokenConstraint>>> = (0..6).map(|_| None).collect();
        broken[3] = Some(Box::new(Modular {
            vocab: 0,
            accepted: Vec::new(),
            closes_after: 9,
        }));
        let e = model
            .generate_constrained_until(&requests, &mut broken, &[], 4, &|| false)
            .unwrap_err();
        assert!(e.to_string().contains("allows no token"), "{e}");
        let e = model
            .generate_constrained_until(&requests, &mut [], &[], 4, &|| false)
            .unwrap_err();
        assert!(
            e.to_string().contains("0 constraints for 6 requests"),
            "{e}"
        );
    }

    /// Every sequence masked to few tokens (ids below 3,000): the picks come
    /// from those head rows alone and are still the reference's argmax among
    /// the allowed tokens.
    #[test]
    fn constrained_generation_over_few_tokens_picks_the_best_allowed_token() {
        let (vocab, below) = (151_669u32, 3000usize);
        let model = Qwen3::load_for_test(tiny_dir());
        let reference = Reference::load(tiny_dir());
        let doc = tokens(17, 9, vocab);
        let handle = model.prefill(None, &doc).unwrap();
        let prompts: Vec<Vec<u32>> = (0..5)
            .map(|j| tokens(2 + j, 60 + j as u64, vocab))
            .collect();
        let requests: Vec<GenerateRequest> = prompts
            .iter()
            .map(|p| GenerateRequest::new(Some(&handle), p, 5))
            .collect();
        let mut constraints: Vec<Option<Box<dyn TokenConstraint>>> = (0..5)
            .map(|_| {
                Some(Box::new(Modular {
                    vocab: below,
                    accepted: Vec::new(),
                    closes_after: 100,
                }) as Box<dyn TokenConstraint>)
            })
            .collect();
        let got = model
            .generate_constrained_until(&requests, &mut constraints, &[], 3, &|| false)
            .unwrap();
        let mut near_ties = 0;
        for (j, g) in got.iter().enumerate() {
            assert_eq!(g.token_ids.len(), 5, "request {j}");
            let seq: Vec<u32> = doc.iter().chain(&prompts[j]).copied().collect();
            near_ties += check_modular_picks(&reference, seq, &g.token_ids, below, j);
        }
        assert!(near_ties <= 1, "{near_ties} near-ties");
    }

    /// A test constraint that may be left: the `k`-th token must not be
    /// `≡ k (mod 7)`.
    struct AllButASeventh {
        vocab: usize,
        accepted: usize,
    }

    impl AllButASeventh {
        fn allows(k: usize, id: usize) -> bool {
            id % 7 != k % 7
        }
    }

    impl TokenConstraint for AllButASeventh {
        fn mask(&mut self) -> std::result::Result<Vec<u32>, String> {
            let mut mask = vec![0u32; self.vocab.div_ceil(32)];
            for id in (0..self.vocab).filter(|&id| Self::allows(self.accepted, id)) {
                mask[id / 32] |= 1 << (id % 32);
            }
            Ok(mask)
        }
        fn accept(&mut self, token: u32) -> std::result::Result<(), String> {
            if !Self::allows(self.accepted, token as usize) {
                return Err(format!("token {token} is not allowed"));
            }
            self.accepted += 1;
            Ok(())
        }
        fn must_stop(&self) -> bool {
            false
        }
        fn is_complete(&mut self) -> bool {
            true
        }
        fn may_leave(&self) -> bool {
            true
        }
    }

    /// A sequence that may leave its constraint takes the best allowed token
    /// while no other is better, and ends (as at a stop) at the first step
    /// where one is; sequences beside it are unchanged.
    #[test]
    fn a_sequence_leaves_its_constraint_where_a_token_outside_it_is_best() {
        let vocab = 151_669;
        let stop = 151_645u32;
        let model = Qwen3::load_for_test(tiny_dir());
        let reference = Reference::load(tiny_dir());
        let doc = tokens(19, 11, vocab as u32);
        let handle = model.prefill(None, &doc).unwrap();
        let prompts: Vec<Vec<u32>> = (0..12)
            .map(|j| tokens(1 + j % 4, 80 + j as u64, vocab as u32))
            .collect();
        let requests: Vec<GenerateRequest> = prompts
            .iter()
            .map(|p| GenerateRequest::new(Some(&handle), p, 6))
            .collect();
        let mut constraints: Vec<Option<Box<dyn TokenConstraint>>> = (0..12)
            .map(|j| {
                (j != 5).then(|| {
                    Box::new(AllButASeventh { vocab, accepted: 0 }) as Box<dyn TokenConstraint>
                })
            })
            .collect();
        let got = model
            .generate_constrained_until(&requests, &mut constraints, &[stop], 4, &|| false)
            .unwrap();
        let free = model.generate(&requests, &[stop], 4).unwrap();
        assert_eq!(got[5], free[5], "the free request");
        let (mut left, mut stayed) = (0, 0);
        for (j, g) in got.iter().enumerate().filter(|&(j, _)| j != 5) {
            let mut seq: Vec<u32> = doc.iter().chain(&prompts[j]).copied().collect();
            for k in 0..=g.token_ids.len() {
                if k == 6 {
                    assert_eq!(g.finish, FinishReason::Length, "request {j}");
                    break;
                }
                let logits = reference.next_logits(&seq);
                let top = argmax(&logits) as usize;
                let best = (0..vocab)
                    .filter(|&id| AllButASeventh::allows(k, id))
                    .fold(None, |b: Option<usize>, i| match b {
                        Some(b) if logits[b] >= logits[i] => Some(b),
                        _ => Some(i),
                    })
                    .unwrap();
                let outside_by = logits[top] - logits[best];
                if k == g.token_ids.len() {
                    // It ended here: a token outside was better.
                    assert_eq!(g.finish, FinishReason::Stop, "request {j}");
                    assert!(outside_by > -NEAR_TIE, "request {j} step {k}: {outside_by}");
                    left += 1;
                    break;
                }
                let t = g.token_ids[k];
                assert!(
                    AllButASeventh::allows(k, t as usize),
                    "request {j} step {k}"
                );
                assert!(outside_by < NEAR_TIE, "request {j} step {k}: {outside_by}");
                assert!(
                    logits[best] - logits[t as usize] <= NEAR_TIE,
                    "request {j} step {k}"
                );
                stayed += 1;
                seq.push(t);
            }
        }
        // Both happen: steps that stayed inside and sequences that left.
        assert!(left > 0 && stayed > 0, "{left} left, {stayed} steps stayed");
        // Leaving ends at a stop id: a call with none is refused.
        let e = model
            .generate_constrained_until(&requests, &mut constraints, &[], 4, &|| false)
            .unwrap_err();
        assert!(e.to_string().contains("none was given"), "{e}");
    }

    /// Both argmax paths pick the lowest id among equal maxima (all -inf too) and refuse NaN.
    #[test]
    fn argmax_ties_go_to_the_lowest_id() {
        let rows = [
            [0.5f32, 2.0, -1.0, 2.0, 2.0],
            [3.0, 3.0, 3.0, 3.0, 3.0],
            [-4.0, -3.0, -2.0, -1.0, -0.5],
            [1.0, f32::NAN, 5.0, 0.0, 0.0],
            [f32::NEG_INFINITY, -1.0, f32::INFINITY, f32::INFINITY, 0.0],
            [f32::NEG_INFINITY; 5],
        ];
        let logits = Tensor::new(&rows, &candle_core::Device::Cpu)
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap();
        let want = [Some(1), Some(0), Some(4), None, Some(2), Some(0)];
        assert_eq!(argmax_columns_host(&logits).unwrap(), want);
        assert_eq!(argmax_columns_device(&logits).unwrap(), want);
        let rows = logits.t().unwrap().contiguous().unwrap();
        assert_eq!(argmax_rows_host(&rows).unwrap(), want);
    }

    /// Decode speed by block size (a measurement, not a check): run with
    /// `cargo test -p aisql-models --release decode_block_sizes -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn decode_block_sizes() {
        let model = Qwen3::load_for_test(tiny_dir());
        let doc = model.prefill(None, &tokens(128, 5, 151_669)).unwrap();
        let prompts: Vec<Vec<u32>> = (0..16).map(|i| tokens(1, 50 + i, 151_669)).collect();
        let requests: Vec<GenerateRequest> = prompts
            .iter()
            .map(|p| GenerateRequest::new(Some(&doc), p, 256))
            .collect();
        // Best of three runs: the machine may be busy with other work.
        for block in [1, 8, 64, 256] {
            let mut best = f64::INFINITY;
            let mut n = 0;
            for _ in 0..3 {
                let t0 = std::time::Instant::now();
                let got = model
                    .generate_in_blocks(&requests, &mut [], &[], 16, block, &|| false)
                    .unwrap();
                best = best.min(t0.elapsed().as_secs_f64());
                n = got.iter().map(|g| g.token_ids.len()).sum::<usize>();
            }
            eprintln!(
                "block {block:>3}: {n} tokens in {best:.2} s, {:.0} tokens/s",
                n as f64 / best
            );
        }
    }
}
