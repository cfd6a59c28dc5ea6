//! The KV cache, owned outside the model: a [`KvHandle`] holds one segment of
//! per-layer keys/values on top of an optional parent handle, so a document's KV is
//! computed once and shared (never copied) by every question and label continuation
//! prefilled on top of it. Handles are `Arc`s: cloning is free, memory is freed when
//! the last clone drops or on [`KvHandle::release`]. A segment may move to host
//! memory ([`KvHandle::offload`]) and back ([`KvHandle::restore`]) in place, so
//! every clone and child of the handle sees it wherever it is; using it while it
//! is on the host is an error, never a silent copy.

use std::sync::{Arc, RwLock};

use candle_core::{Device, Tensor};

use crate::{ModelError, Result};

/// High bit set on the ids of prefix views, so errors tell them apart.
const PREFIX_VIEW_ID: u64 = 1 << 63;

/// One layer's cached keys and values, each `(num_kv_heads, segment_len, head_dim)`.
pub type LayerKv = (Tensor, Tensor);

/// A shareable KV prefix: one segment of positions plus (optionally) the prefix it
/// continues. Produced by [`crate::Qwen3::prefill`].
#[derive(Clone)]
pub struct KvHandle(Arc<KvNode>);

struct KvNode {
    id: u64,
    model_uid: u64,
    parent: Option<KvHandle>,
    start: usize,
    len: usize,
    bytes: usize,
    state: RwLock<State>,
}

/// Where a segment's tensors are.
enum State {
    /// On the model's device, usable.
    Live(Segment),
    /// Copied to host memory; the device they came from.
    Offloaded(Segment, Device),
    /// Freed.
    Released,
}

/// What a live segment holds; dropped on release.
#[derive(Clone)]
pub(crate) struct Segment {
    pub(crate) layers: Arc<Vec<LayerKv>>,
    /// Final-normed hidden state at the segment's last position, `(hidden,)`: the
    /// next-token logits of the prompt ending here are `head · last_hidden`, so a
    /// label's first token can be scored without recomputing that position. `None`
    /// for a prefix view ([`KvHandle::prefix`]), whose last position was never an output.
    pub(crate) last_hidden: Option<Tensor>,
}

/// The device a segment's tensors are on.
fn segment_device(segment: &Segment) -> Device {
    segment
        .layers
        .first()
        .map_or(Device::Cpu, |(k, _)| k.device().clone())
}

impl Segment {
    /// The same tensors on `device` (a copy unless they are there already).
    fn to_device(&self, device: &Device) -> Result<Segment> {
        let layers = self
            .layers
            .iter()
            .map(|(k, v)| Ok((k.to_device(device)?, v.to_device(device)?)))
            .collect::<Result<Vec<LayerKv>>>()?;
        let last_hidden = match &self.last_hidden {
            Some(h) => Some(h.to_device(device)?),
            None => None,
        };
        Ok(Segment {
            layers: Arc::new(layers),
            last_hidden,
        })
    }
}

impl std::fmt::Debug for KvHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvHandle")
            .field("id", &self.0.id)
            .field("start", &self.0.start)
            .field("len", &self.0.len)
            .field("released", &self.is_released())
            .finish()
    }
}

impl KvHandle {
    pub(crate) fn new(model_uid: u64, id: u64, parent: Option<KvHandle>, segment: Segment) -> Self {
        let start = parent.as_ref().map_or(0, KvHandle::len);
        let len = segment
            .layers
            .first()
            .map_or(0, |(k, _)| k.dims().get(1).copied().unwrap_or(0));
        let bytes = segment
            .layers
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum::<usize>()
            + segment
                .last_hidden
                .as_ref()
                .map_or(0, |h| h.elem_count() * h.dtype().size_in_bytes());
        Self(Arc::new(KvNode {
            id,
            model_uid,
            parent,
            start,
            len,
            bytes,
            state: RwLock::new(State::Live(segment)),
        }))
    }

    /// Unique id of this handle within its model (appears in errors).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Total positions covered, ancestors included: the RoPE position of the next token.
    pub fn len(&self) -> usize {
        self.0.start + self.0.len
    }

    /// Whether the handle covers no positions (never true for a prefilled handle).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions held by this segment alone.
    pub fn segment_len(&self) -> usize {
        self.0.len
    }

    /// The prefix this segment continues, if any.
    pub fn parent(&self) -> Option<&KvHandle> {
        self.0.parent.as_ref()
    }

    /// Bytes of tensor data this segment alone holds on the model's device (0
    /// once released or offloaded).
    pub fn segment_bytes(&self) -> usize {
        match *self.read_state() {
            State::Live(_) => self.0.bytes,
            _ => 0,
        }
    }

    /// Bytes of this segment held in host memory (0 unless offloaded).
    pub fn host_bytes(&self) -> usize {
        match *self.read_state() {
            State::Offloaded(..) => self.0.bytes,
            _ => 0,
        }
    }

    /// Bytes held by this segment and all its ancestors: the memory this prefix pins.
    pub fn total_bytes(&self) -> usize {
        self.segment_bytes() + self.parent().map_or(0, KvHandle::total_bytes)
    }

    /// Frees this segment's tensors now, even while clones of the handle exist. Any
    /// later use of this handle, or of a child built on it, is a
    /// [`ModelError::ReleasedKv`] error. Releasing twice is a no-op.
    pub fn release(&self) {
        *self.0.state.write().unwrap_or_else(|e| e.into_inner()) = State::Released;
    }

    /// Whether this segment or any ancestor was released.
    pub fn is_released(&self) -> bool {
        self.is_released_self() || self.parent().is_some_and(KvHandle::is_released)
    }

    /// Whether this segment is on the model's device (not offloaded, not released).
    pub fn is_resident(&self) -> bool {
        matches!(*self.read_state(), State::Live(_))
    }

    /// Copies this segment to host memory and frees its device copy; a no-op
    /// when it is already on the host (or released). Ancestors stay where they are.
    pub fn offload(&self) -> Result<()> {
        let mut state = self.0.state.write().unwrap_or_else(|e| e.into_inner());
        if let State::Live(segment) = &*state {
            let device = segment_device(segment);
            let host = segment.to_device(&Device::Cpu)?;
            *state = State::Offloaded(host, device);
        }
        Ok(())
    }

    /// Copies an offloaded segment back to the device it came from; a no-op when
    /// it is there already. A released segment stays released.
    pub fn restore(&self) -> Result<()> {
        let mut state = self.0.state.write().unwrap_or_else(|e| e.into_inner());
        if let State::Offloaded(segment, device) = &*state {
            let live = segment.to_device(device)?;
            *state = State::Live(live);
        }
        Ok(())
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.0.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn is_released_self(&self) -> bool {
        matches!(*self.read_state(), State::Released)
    }

    pub(crate) fn model_uid(&self) -> u64 {
        self.0.model_uid
    }

    /// This segment's live contents.
    pub(crate) fn segment(&self) -> Result<Segment> {
        match &*self.read_state() {
            State::Live(segment) => Ok(segment.clone()),
            State::Offloaded(..) => Err(ModelError::OffloadedKv { id: self.0.id }),
            State::Released => Err(ModelError::ReleasedKv { id: self.0.id }),
        }
    }

    /// The first `len` positions of this prefix as a handle of their own, sharing
    /// the tensors (a view, no copy): lets a cache reuse the common start of two
    /// sequences whose KV was computed as one segment. The view has no final
    /// hidden state, so it can only be continued (prefilled on), not scored.
    pub fn prefix(&self, len: usize) -> Result<KvHandle> {
        if len > self.len() || len == 0 {
            return Err(ModelError::InvalidInput(format!(
                "cannot take a {len}-position prefix of KV #{} ({} positions)",
                self.id(),
                self.len()
            )));
        }
        if len == self.len() {
            return Ok(self.clone());
        }
        if let Some(parent) = self.parent()
            && len <= parent.len()
        {
            return parent.prefix(len);
        }
        let keep = len - self.0.start;
        let (segment, offloaded_from) = match &*self.read_state() {
            State::Live(segment) => (segment.clone(), None),
            State::Offloaded(segment, device) => (segment.clone(), Some(device.clone())),
            State::Released => return Err(ModelError::ReleasedKv { id: self.0.id }),
        };
        let layers = segment
            .layers
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.narrow(1, 0, keep)?.contiguous()?,
                    v.narrow(1, 0, keep)?.contiguous()?,
                ))
            })
            .collect::<Result<Vec<LayerKv>>>()?;
        let view = KvHandle::new(
            self.0.model_uid,
            self.0.id | PREFIX_VIEW_ID,
            self.0.parent.clone(),
            Segment {
                layers: Arc::new(layers),
                last_hidden: None,
            },
        );
        // A view of an offloaded segment is made on the host and stays there.
        if let Some(device) = offloaded_from {
            let mut state = view.0.state.write().unwrap_or_else(|e| e.into_inner());
            if let State::Live(segment) = std::mem::replace(&mut *state, State::Released) {
                *state = State::Offloaded(segment, device);
            }
        }
        Ok(view)
    }

    /// Every segment from the root to this one, oldest first.
    pub(crate) fn chain(&self) -> Result<Vec<Segment>> {
        let mut out = match self.parent() {
            Some(p) => p.chain()?,
            None => Vec::new(),
        };
        out.push(self.segment()?);
        Ok(out)
    }
}
