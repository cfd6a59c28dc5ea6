//! Constrained decoding's side of the model: what a constraint on a
//! sequence's tokens answers ([`TokenConstraint`]) and the greedy pick among
//! the tokens it allows. The grammars themselves (SQL types, key sets) live in
//! the engine; the model only reads a mask per step and reports each pick.

use crate::{ModelError, Result};

/// A rule over the tokens one sequence may decode: asked for a mask before
/// every step and told every token picked.
pub trait TokenConstraint: Send {
    /// The tokens allowed next, as a bitset over the vocabulary (bit `id % 32`
    /// of word `id / 32`); a stop id is allowed when the text so far is
    /// complete. An error fails the whole generating call.
    fn mask(&mut self) -> std::result::Result<Vec<u32>, String>;

    /// Records the token picked (never a stop id).
    fn accept(&mut self, token: u32) -> std::result::Result<(), String>;

    /// Whether the text so far is complete and nothing may follow it: the
    /// sequence ends here as if it had picked a stop id, without another
    /// step.
    fn must_stop(&self) -> bool;

    /// Whether the text so far is complete (a stop may end it).
    fn is_complete(&mut self) -> bool;

    /// Whether the sequence may leave the constraint: when the model's best
    /// token over the whole vocabulary is strictly better than every token
    /// the mask allows, the sequence ends there, as at a stop id, instead of
    /// taking the best allowed token (an answer that must be one of a set of
    /// keys, or none). Such a step reads the whole head.
    fn may_leave(&self) -> bool {
        false
    }
}

/// The ids set in `mask` (bit `id % 32` of word `id / 32`), rising; a
/// word's clear bits cost nothing.
pub fn allowed_ids(mask: &[u32]) -> impl Iterator<Item = usize> + '_ {
    mask.iter().enumerate().flat_map(|(w, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let id = w * 32 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                id
            })
        })
    })
}

/// The largest of `logit(id)` over the ids set in `mask` (below `vocab`),
/// ties to the lowest id; `Ok(None)` when one of them is NaN, an error when
/// the mask allows none.
pub(crate) fn masked_argmax(
    mask: &[u32],
    vocab: usize,
    logit: impl Fn(usize) -> f32,
) -> Result<Option<u32>> {
    let mut best: Option<(u32, f32)> = None;
    for id in allowed_ids(mask).take_while(|&id| id < vocab) {
        let x = logit(id);
        if x.is_nan() {
            return Ok(None);
        }
        // Strictly greater: an equal value later in the vocabulary loses.
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((id as u32, x));
        }
    }
    match best {
        Some((id, _)) => Ok(Some(id)),
        None => Err(ModelError::InvalidInput(
            "a decoding constraint allows no token of the vocabulary".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_ids_are_the_set_bits_rising() {
        let ids: Vec<usize> = allowed_ids(&[0b1001, 0, 1 << 31, u32::MAX >> 30]).collect();
        assert_eq!(ids, [0, 3, 95, 96, 97]);
        assert_eq!(allowed_ids(&[]).count(), 0);
    }

    #[test]
    fn the_pick_is_the_largest_allowed_logit_ties_to_the_lowest_id() {
        let logits = [5.0f32, 1.0, 3.0, 3.0, 9.0, -1.0];
        let at = |i: usize| logits[i];
        // Ids 1, 2, 3, 5 allowed: 9.0 (id 4) and 5.0 (id 0) are masked out.
        assert_eq!(masked_argmax(&[0b101110], 6, at).unwrap(), Some(2));
        assert_eq!(masked_argmax(&[0b100000], 6, at).unwrap(), Some(5));
        // Bits past the vocabulary are ignored.
        assert_eq!(masked_argmax(&[0b1100_0010], 6, at).unwrap(), Some(1));
        let e = masked_argmax(&[0b1100_0000, 0], 6, at).unwrap_err();
        assert!(e.to_string().contains("allows no token"), "{e}");
        let nan = [1.0f32, f32::NAN];
        assert_eq!(masked_argmax(&[0b11], 2, |i| nan[i]).unwrap(), None);
        // Ids in the second word.
        let wide: Vec<f32> = (0..70).map(|i| (i % 7) as f32).collect();
        assert_eq!(
            masked_argmax(&[0, 1 << 1 | 1 << 5, 1 << 3], 70, |i| wide[i]).unwrap(),
            Some(33)
        );
    }
}
