//! The persistent answer cache (`--answer-cache DIR`): every answer the model
//! gives is appended to a log as soon as its batch returns, keyed by what the
//! answer depends on — the model's identity and the rendered prompt — so a
//! query that dies (a lost worker, a crash, `kill -9`) reruns without asking
//! the model again for what it already answered. [`CachedBackend`] puts the
//! cache in front of any backend, in one process or on a coordinator.
//!
//! Layout: `DIR/<identity key>/identity.json` names what the answers belong to
//! ([`AnswerIdentity`]: model id, weights and tokenizer SHA-256, dtype, prompt
//! format); `DIR/<identity key>/answers.v4` holds records of a question hash,
//! the answer's length and bytes (a typed [`Answer`]: TRUE/FALSE, label,
//! score, label probabilities, text) and a keyed MAC. A record cut short (by a
//! kill, or by a damaged length that reaches past the end of the log) is
//! dropped when the log is opened again and counted; a record whose MAC fails
//! is skipped and counted, never used. One process holds a log at a time (an
//! exclusive file lock), so two runs never interleave their writes.
//!
//! The MAC is HMAC-SHA256 under a key kept in aisql's cache folder
//! ([`crate::data::cache_dir`], `answer-cache.key`, made on first use, readable by
//! its owner only), outside every answer folder: whoever can write an answer
//! folder but not that key cannot make aisql use an answer it did not give. A
//! folder copied to another machine (another key) is re-asked, not trusted.
//! The MAC covers the identity too (a SHA-256 of [`AnswerIdentity`]: weights,
//! tokenizer, dtype, prompt format), so a record copied from another model's
//! folder, or another dtype's, fails it and is counted, never used. The logs
//! of the layout before that binding (`answers.v3`) are not read.
//!
//! The cache's files are regular files inside their folder: the identity
//! folder, `identity.json` and the log are opened without following a link
//! (a log linked to a file elsewhere would be truncated and appended to), and
//! a FIFO or a device in their place is refused by name before it is read.
//!
//! The question hash is SHA-256 over the kind, the classification labels (an
//! answer is an index into them), a generating call's `max_tokens` (an
//! embedding's dimensions) and the
//! rendered prompt, exactly as the model reads it: two operators, queries or plans that ask the same prompt share
//! its answer, and a changed prompt, label list or model never does.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::data::store_file::{StoreFileError, not_in_folder, open_in_folder};
use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
    check_answers,
};
use crate::inference::work::{Sum, Work};

/// What errors call this store, and what it keeps in regular files.
const STORE: (&str, &str) = ("answer cache", "its answers");

/// Bytes of a question hash: 128 bits, so that a collision among billions of
/// questions has a probability far below that of a disk error.
const QUESTION_BYTES: usize = 16;
/// Bytes of a record's MAC: the first 128 bits of HMAC-SHA256.
const MAC_BYTES: usize = 16;
/// Bytes of a record's answer length (u32, little endian).
const LENGTH_BYTES: usize = 4;
/// One record: question hash, answer length, answer bytes, MAC over the rest.
/// The fixed part: a record holds this many bytes plus its answer's.
const RECORD_FIXED_BYTES: usize = QUESTION_BYTES + LENGTH_BYTES + MAC_BYTES;
/// The longest answer a record holds (a generated text of 131,072 tokens is
/// at most about 2 MB): a longer length is a damaged or cut record.
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// The log's file name; the version changes with the record, hash or MAC
/// layout (v4: the MAC binds the identity).
const LOG_FILE: &str = "answers.v4";
/// The MAC key's file name in aisql's cache folder.
pub const KEY_FILE: &str = "answer-cache.key";
/// Bytes of the MAC key.
const KEY_BYTES: usize = 32;
const IDENTITY_FILE: &str = "identity.json";

/// A question as the cache names it.
pub type QuestionHash = [u8; QUESTION_BYTES];

/// What a model's answers depend on, besides the prompt.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnswerIdentity {
    /// Model as the user named it (`tiny`, a directory, a Hugging Face id).
    pub model: String,
    /// SHA-256 over the weight files' SHA-256s, in load order.
    pub weights_sha256: String,
    /// SHA-256 of the tokenizer the model reads prompts with.
    pub tokenizer_sha256: String,
    /// Weights dtype (`f32`, `bf16`, `f16`).
    pub dtype: String,
    /// Prompt layout ([`crate::inference::prompt::PromptFormat`]'s name).
    pub prompt_format: String,
}

impl AnswerIdentity {
    /// The folder name of this identity's answers: 16 hex digits of SHA-256 over
    /// its JSON.
    pub fn key(&self) -> String {
        hex::encode(&self.digest()[..8])
    }

    /// SHA-256 over its JSON: what each record's MAC binds.
    fn digest(&self) -> [u8; 32] {
        let json = serde_json::to_vec(self).expect("identity serialises");
        Sha256::digest(&json).into()
    }
}

/// The hash of `request` asked by `call`: see the module header.
pub fn question_hash(call: &AiCall, request: &AiRequest<'_>) -> QuestionHash {
    finish(anchor_state(call, request.anchor), call, request.partner)
}

/// The hasher after everything that does not depend on the partner, so a run of
/// requests with one anchor hashes the anchor once.
fn anchor_state(call: &AiCall, anchor: Doc<'_>) -> Sha256 {
    let mut h = Sha256::new();
    h.update(b"aisql-question-v1\0");
    let kind = call.kind.describe();
    h.update([kind.cache_code()]);
    if kind.keys_max_tokens() {
        h.update(call.max_tokens.to_le_bytes());
    }
    if kind.has_labels() || kind.asks_per_field() {
        h.update((call.labels.len() as u64).to_le_bytes());
        for label in &call.labels {
            h.update((label.len() as u64).to_le_bytes());
            h.update(label.as_bytes());
        }
        if kind.asks_per_field() {
            // The fields' questions are part of the prompts.
            for question in &call.descriptions {
                h.update((question.len() as u64).to_le_bytes());
                h.update(question.as_bytes());
            }
        }
    }
    let p = &call.pieces;
    h.update(p.preamble.as_bytes());
    h.update(anchor.text.as_bytes());
    h.update(p.frame.as_bytes());
    h
}

fn finish(mut h: Sha256, call: &AiCall, partner: Option<Doc<'_>>) -> QuestionHash {
    // As `PromptPieces::render`: the label piece and partner only in pairs.
    if let Some(partner) = partner {
        h.update(call.pieces.label.as_bytes());
        h.update(partner.text.as_bytes());
    }
    h.update(call.pieces.tail.as_bytes());
    h.finalize()[..QUESTION_BYTES].try_into().expect("16 bytes")
}

/// An answer's bytes in a record: a tag, then its value (little endian);
/// `None` for a failed or unreached question, which is never kept.
fn encode_answer(answer: &Answer) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match answer {
        Answer::Failed(_) | Answer::Unreached => return None,
        Answer::Bool(b) => out.extend([b'b', u8::from(*b)]),
        Answer::Label(i) => {
            out.push(b'l');
            out.extend(i.to_le_bytes());
        }
        Answer::Score(p) => {
            out.push(b's');
            out.extend(p.to_le_bytes());
        }
        Answer::LabelScores(ps) => {
            out.push(b'p');
            for p in ps.iter() {
                out.extend(p.to_le_bytes());
            }
        }
        Answer::Text(t) => {
            out.push(b't');
            out.extend(t.as_bytes());
        }
        Answer::Fields(fields) => {
            out.push(b'x');
            for f in fields.iter() {
                out.extend((f.len() as u32).to_le_bytes());
                out.extend(f.as_bytes());
            }
        }
        Answer::Vector(v) => {
            out.push(b'v');
            for x in v.iter() {
                out.extend(x.to_le_bytes());
            }
        }
    }
    Some(out)
}

/// Reads [`encode_answer`]'s bytes back; `None` for bytes it never writes.
fn decode_answer(bytes: &[u8]) -> Option<Answer> {
    let (&tag, value) = bytes.split_first()?;
    let f64s = |v: &[u8]| -> Option<Vec<f64>> {
        v.len().is_multiple_of(8).then(|| {
            v.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        })
    };
    Some(match (tag, value) {
        (b'b', [0]) => Answer::Bool(false),
        (b'b', [1]) => Answer::Bool(true),
        (b'l', v) if v.len() == 4 => Answer::Label(u32::from_le_bytes(v.try_into().ok()?)),
        (b's', v) if v.len() == 8 => Answer::Score(f64::from_le_bytes(v.try_into().ok()?)),
        (b'p', v) => Answer::LabelScores(f64s(v)?.into()),
        (b'v', v) if v.len().is_multiple_of(4) => Answer::Vector(
            v.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        ),
        (b't', v) => Answer::Text(std::str::from_utf8(v).ok()?.into()),
        (b'x', mut v) => {
            let mut fields = Vec::new();
            while !v.is_empty() {
                let (len, rest) = v.split_at_checked(4)?;
                let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
                let (text, rest) = rest.split_at_checked(len)?;
                fields.push(std::str::from_utf8(text).ok()?.into());
                v = rest;
            }
            Answer::Fields(fields.into())
        }
        _ => return None,
    })
}

/// The key records are signed with.
#[derive(Clone)]
pub struct RecordKey([u8; KEY_BYTES]);

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(..)")
    }
}

impl RecordKey {
    /// The key in `path`, made there from the operating system's randomness
    /// first (created exclusively, owner-only): two processes that start at once
    /// agree on the one that was written first.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        match Self::read(path) {
            Ok(bytes) => return Self::from_file_bytes(path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EngineError::io(path, e)),
        }
        let mut key = [0u8; KEY_BYTES];
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut key)
            .and_then(|_| getrandom::fill(&mut nonce))
            .map_err(|e| {
                EngineError::Setting(format!("no randomness for the answer cache key: {e}"))
            })?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        }
        let tmp = path.with_extension(format!("tmp.{}", hex::encode(nonce)));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
        file.write_all(&key)
            .and_then(|_| file.sync_all())
            .map_err(|e| EngineError::io(&tmp, e))?;
        drop(file);
        // A hard link publishes the whole key or nothing, and fails if another
        // process published one first: then that one is the key.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(Self(key)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let bytes = Self::read(path).map_err(|e| EngineError::io(path, e))?;
                Self::from_file_bytes(path, &bytes)
            }
            Err(e) => Err(EngineError::io(path, e)),
        }
    }

    /// The key file's bytes: a regular file (not a FIFO or a device, which
    /// would block or never end), read only up to one byte past a key's length.
    fn read(path: &Path) -> std::io::Result<Vec<u8>> {
        let file = crate::data::input_file::open(path)?;
        let mut bytes = Vec::with_capacity(KEY_BYTES + 1);
        file.take(KEY_BYTES as u64 + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn from_file_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| {
            EngineError::Data(format!(
                "answer cache key {}: {}{} bytes, not {KEY_BYTES}; remove it to make a new one (the answers signed with it will be asked again)",
                path.display(),
                if bytes.len() > KEY_BYTES { "over " } else { "" },
                bytes.len().min(KEY_BYTES)
            ))
        })?;
        Ok(Self(key))
    }

    /// HMAC-SHA256 under this key of `parts` after `domain` (each store
    /// signs under its own, so a record of one is never valid in another):
    /// what the KV store signs its blocks with.
    pub fn sign(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        use hmac::Mac as _;
        self.keyed(domain, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is [`Self::sign`]'s signature of `parts` (compared in
    /// constant time).
    pub fn verify_signature(&self, domain: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        use hmac::Mac as _;
        self.keyed(domain, parts).verify_slice(tag).is_ok()
    }

    fn keyed(&self, domain: &[u8], parts: &[&[u8]]) -> hmac::Hmac<Sha256> {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(domain);
        for p in parts {
            mac.update(p);
        }
        mac
    }

    /// HMAC-SHA256 under this key, fed the identity's digest (`bound`) and
    /// then `body`: a record is valid for one identity only.
    fn hmac(&self, bound: &[u8; 32], body: &[u8]) -> hmac::Hmac<Sha256> {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(b"aisql-answer-v4\0");
        mac.update(bound);
        mac.update(body);
        mac
    }

    /// The MAC of a record's body for the identity of digest `bound`.
    fn mac(&self, bound: &[u8; 32], body: &[u8]) -> [u8; MAC_BYTES] {
        use hmac::Mac as _;
        self.hmac(bound, body).finalize().into_bytes()[..MAC_BYTES]
            .try_into()
            .expect("16 bytes")
    }

    /// Whether `tag` is the MAC of `body` for the identity of digest `bound`
    /// (compared in constant time).
    fn verify(&self, bound: &[u8; 32], body: &[u8], tag: &[u8]) -> bool {
        use hmac::Mac as _;
        self.hmac(bound, body).verify_truncated_left(tag).is_ok()
    }
}

/// The answers of one identity, in memory and in their log.
pub struct AnswerCache {
    log_path: PathBuf,
    /// Signs the records written and checks those read.
    key: RecordKey,
    /// The identity's digest, bound into every record's MAC.
    bound: [u8; 32],
    log: Mutex<File>,
    answers: Mutex<HashMap<QuestionHash, Answer>>,
    /// Records found damaged, cut short, not signed with this key or signed
    /// for another identity when the log was opened (skipped).
    damaged: usize,
}

impl std::fmt::Debug for AnswerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerCache")
            .field("log", &self.log_path)
            .field("damaged", &self.damaged)
            .finish()
    }
}

impl AnswerCache {
    /// Opens (creating it if needed) the answers of `identity` under `root`. Fails
    /// naming the path when `root` is not a folder one can write, when another
    /// process holds the log, or when the folder's identity file names another
    /// identity.
    pub fn open(root: &Path, identity: &AnswerIdentity, key: RecordKey) -> Result<Self> {
        if root.exists() && !root.is_dir() {
            return Err(EngineError::Data(format!(
                "--answer-cache {}: not a folder",
                root.display()
            )));
        }
        let dir = root.join(identity.key());
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
        // The identity folder itself, not a link to a folder elsewhere.
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| EngineError::io(&dir, e))?;
        if !meta.is_dir() {
            return Err(not_in_folder(&dir, &meta, "a folder").into_engine(&dir, STORE));
        }
        let identity_path = dir.join(IDENTITY_FILE);
        let want = serde_json::to_string_pretty(identity).expect("identity serialises");
        match open_in_folder(&identity_path, OpenOptions::new().read(true)) {
            Ok(file) => {
                let mut have = String::new();
                // An identity is a few hundred bytes: a longer file is not one.
                file.take(1 << 16)
                    .read_to_string(&mut have)
                    .map_err(|e| EngineError::io(&identity_path, e))?;
                let have: AnswerIdentity = serde_json::from_str(&have)
                    .map_err(|e| EngineError::Data(format!("{}: {e}", identity_path.display())))?;
                if &have != identity {
                    return Err(EngineError::Data(format!(
                        "{}: the answers there belong to another model identity ({have:?}, not {identity:?})",
                        identity_path.display()
                    )));
                }
            }
            Err(StoreFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::data::files::write_file_atomic(&identity_path, want.as_bytes())?;
            }
            Err(e) => return Err(e.into_engine(&identity_path, STORE)),
        }
        let log_path = dir.join(LOG_FILE);
        let mut log = open_in_folder(
            &log_path,
            OpenOptions::new().read(true).append(true).create(true),
        )
        .map_err(|e| e.into_engine(&log_path, STORE))?;
        log.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => EngineError::Data(format!(
                "answer cache {}: another aisql process is using it",
                log_path.display()
            )),
            std::fs::TryLockError::Error(e) => EngineError::io(&log_path, e),
        })?;
        let mut bytes = Vec::new();
        log.seek(SeekFrom::Start(0))
            .and_then(|_| log.read_to_end(&mut bytes))
            .map_err(|e| EngineError::io(&log_path, e))?;
        let bound = identity.digest();
        let mut answers = HashMap::new();
        let mut damaged = 0;
        let mut at = 0;
        while bytes.len() - at >= RECORD_FIXED_BYTES {
            let length_at = at + QUESTION_BYTES;
            let length = u32::from_le_bytes(
                bytes[length_at..length_at + LENGTH_BYTES]
                    .try_into()
                    .expect("4 bytes"),
            ) as usize;
            let end = length_at + LENGTH_BYTES + length + MAC_BYTES;
            if length > MAX_ANSWER_BYTES || end > bytes.len() {
                // A length no record has, or one past the end of the log (a
                // write cut short by a kill, or a damaged length): nothing
                // after it can be told apart from noise. Counted below.
                break;
            }
            let (body, tag) = bytes[at..end].split_at(end - at - MAC_BYTES);
            at = end;
            let answer = key
                .verify(&bound, body, tag)
                .then(|| decode_answer(&body[QUESTION_BYTES + LENGTH_BYTES..]))
                .flatten();
            let Some(answer) = answer else {
                damaged += 1;
                continue;
            };
            let question: QuestionHash = body[..QUESTION_BYTES].try_into().expect("16 bytes");
            answers.insert(question, answer);
        }
        if at != bytes.len() {
            // A record cut short, or everything after a damaged length: one
            // record lost at least. Its bytes are dropped so that records
            // appended from now on follow whole ones.
            damaged += 1;
            log.set_len(at as u64)
                .map_err(|e| EngineError::io(&log_path, e))?;
        }
        Ok(Self {
            log_path,
            key,
            bound,
            log: Mutex::new(log),
            answers: Mutex::new(answers),
            damaged,
        })
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Answers held.
    pub fn len(&self) -> usize {
        self.answers.lock().expect("answer cache lock").len()
    }

    /// Whether no answer is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records skipped as damaged when the log was opened.
    pub fn damaged(&self) -> usize {
        self.damaged
    }

    /// The answer to `question`, if given before.
    pub fn get(&self, question: &QuestionHash) -> Option<Answer> {
        self.answers
            .lock()
            .expect("answer cache lock")
            .get(question)
            .cloned()
    }

    /// Records answers: appended to the log in one write, then held.
    pub fn insert(&self, answered: &[(QuestionHash, Answer)]) -> Result<()> {
        // A failed row or an unreached one is asked again next time.
        let answered: Vec<&(QuestionHash, Answer)> =
            answered.iter().filter(|(_, a)| a.is_answer()).collect();
        if answered.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(answered.len() * (RECORD_FIXED_BYTES + 9));
        for (question, answer) in &answered {
            let Some(bytes) = encode_answer(answer) else {
                continue;
            };
            if bytes.len() > MAX_ANSWER_BYTES {
                return Err(EngineError::Data(format!(
                    "answer cache {}: an answer of {} bytes is over the {MAX_ANSWER_BYTES} a record holds",
                    self.log_path.display(),
                    bytes.len()
                )));
            }
            let start = buf.len();
            buf.extend_from_slice(question);
            buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            buf.extend_from_slice(&bytes);
            let tag = self.key.mac(&self.bound, &buf[start..]);
            buf.extend_from_slice(&tag);
        }
        self.log
            .lock()
            .expect("answer cache lock")
            .write_all(&buf)
            .map_err(|e| EngineError::io(&self.log_path, e))?;
        self.answers
            .lock()
            .expect("answer cache lock")
            .extend(answered.into_iter().cloned());
        Ok(())
    }
}

/// A backend behind an answer cache: questions answered before are answered from
/// it, the rest are asked of `inner` (in their order, so a run of one anchor's
/// requests stays together) and recorded as soon as `inner` returns.
pub struct CachedBackend {
    inner: std::sync::Arc<dyn InferenceBackend>,
    cache: std::sync::Arc<AnswerCache>,
}

impl CachedBackend {
    /// `inner` behind `cache`.
    pub fn new(inner: std::sync::Arc<dyn InferenceBackend>, cache: AnswerCache) -> Self {
        Self {
            inner,
            cache: std::sync::Arc::new(cache),
        }
    }

    /// The cache.
    pub fn cache(&self) -> &AnswerCache {
        &self.cache
    }
}

impl InferenceBackend for CachedBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn begin(
        self: std::sync::Arc<Self>,
        start: QueryStart,
    ) -> Result<std::sync::Arc<dyn QueryBackend>> {
        Ok(std::sync::Arc::new(CachedQuery {
            inner: self.inner.clone().begin(start)?,
            cache: self.cache.clone(),
            reused: AtomicU64::new(0),
            asked: AtomicU64::new(0),
        }))
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.inner.kv_capacity_tokens()
    }

    fn context_positions(&self) -> Option<usize> {
        self.inner.context_positions()
    }

    fn embedding_dims(&self) -> Option<u32> {
        self.inner.embedding_dims()
    }

    fn host_memory_allowance(&self) -> usize {
        self.inner.host_memory_allowance()
    }

    fn reuses_work(&self) -> bool {
        self.inner.reuses_work()
    }

    fn turn_order(&self) -> Option<String> {
        self.inner.turn_order()
    }

    fn kv_store(&self) -> Option<std::sync::Arc<crate::inference::kv_store::KvStore>> {
        self.inner.kv_store()
    }
}

/// One query behind the answer cache: the inner backend's query and the
/// counts of this query's questions answered from the cache and asked.
struct CachedQuery {
    inner: std::sync::Arc<dyn QueryBackend>,
    cache: std::sync::Arc<AnswerCache>,
    /// This query's questions answered from the cache.
    reused: AtomicU64,
    /// This query's questions asked of `inner`.
    asked: AtomicU64,
}

impl QueryBackend for CachedQuery {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let mut questions = Vec::with_capacity(requests.len());
        // A run of requests with one anchor text hashes it once.
        let mut anchor: Option<(&str, Sha256)> = None;
        for r in requests {
            let state = match &anchor {
                Some((text, state)) if *text == r.anchor.text => state.clone(),
                _ => {
                    let state = anchor_state(call, r.anchor);
                    anchor = Some((r.anchor.text, state.clone()));
                    state
                }
            };
            questions.push(finish(state, call, r.partner));
        }
        let mut answers: Vec<Option<Answer>> =
            questions.iter().map(|q| self.cache.get(q)).collect();
        // An answer of another type than the question's (a record of an older
        // layout, a hash collision) is asked again, never used.
        for a in &mut answers {
            if a.as_ref().is_some_and(|a| !a.fits(call)) {
                *a = None;
            }
        }
        let missing: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let reused = (requests.len() - missing.len()) as u64;
        self.reused.fetch_add(reused, Ordering::Relaxed);
        let mut work = Work::default();
        if !missing.is_empty() {
            let asked: Vec<AiRequest<'_>> = missing.iter().map(|&i| requests[i]).collect();
            let got = self.inner.answer(call, &asked)?;
            work = got.work;
            let got = got.answers;
            check_answers(call, "the backend", &got, asked.len())?;
            let answered = got.iter().filter(|a| a.is_answer()).count() as u64;
            self.asked.fetch_add(answered, Ordering::Relaxed);
            work.answer_cache_asked = Some(Sum(answered));
            let recorded: Vec<(QuestionHash, Answer)> = missing
                .iter()
                .zip(&got)
                .map(|(&i, a)| (questions[i], a.clone()))
                .collect();
            self.cache.insert(&recorded)?;
            for (&i, a) in missing.iter().zip(got) {
                answers[i] = Some(a);
            }
        }
        work.answer_cache_reused = Some(Sum(reused));
        Ok(Answered {
            answers: answers
                .into_iter()
                .map(|a| a.expect("every question answered"))
                .collect(),
            work,
        })
    }

    fn work(&self) -> Work {
        let mut m = self.inner.work();
        m.answer_cache_reused = Some(Sum(self.reused.load(Ordering::Relaxed)));
        m.answer_cache_asked = Some(Sum(self.asked.load(Ordering::Relaxed)));
        m
    }

    fn cancel(&self) {
        self.inner.cancel()
    }

    fn wait_stopped(&self) {
        self.inner.wait_stopped()
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        self.inner.partners_collected(call, partners)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{
        AiKind, Answerer, ContentHashBackend, begun, test_call as call,
    };
    use std::sync::Arc;

    fn identity(dtype: &str) -> AnswerIdentity {
        AnswerIdentity {
            model: "tiny".into(),
            weights_sha256: "w".into(),
            tokenizer_sha256: "t".into(),
            dtype: dtype.into(),
            prompt_format: "raw-v1".into(),
        }
    }

    fn doc<'a>(id: &'a str, text: &'a str) -> Doc<'a> {
        Doc { id, text }
    }

    #[test]
    fn the_hash_is_that_of_the_rendered_prompt_labels_and_kind() {
        let join = call(AiKind::Join, "Does {0} cite {1}?", &[]);
        let r = |a: &'static str, b: &'static str| AiRequest {
            anchor: doc("x", a),
            partner: Some(doc("y", b)),
        };
        // Ids do not matter, texts do; a split between anchor and partner that
        // renders another prompt is another question.
        let same_text_other_ids = AiRequest {
            anchor: doc("other", "alpha"),
            partner: Some(doc("ids", "beta")),
        };
        assert_eq!(
            question_hash(&join, &r("alpha", "beta")),
            question_hash(&join, &same_text_other_ids)
        );
        assert_ne!(
            question_hash(&join, &r("alpha", "beta")),
            question_hash(&join, &r("alph", "beta"))
        );
        let other_prompt = call(AiKind::Join, "Does {0} refute {1}?", &[]);
        assert_ne!(
            question_hash(&join, &r("alpha", "beta")),
            question_hash(&other_prompt, &r("alpha", "beta"))
        );
        let one = AiRequest {
            anchor: doc("x", "alpha"),
            partner: None,
        };
        let ab = call(AiKind::Classify, "Tone of {0}?", &["a", "b"]);
        let ba = call(AiKind::Classify, "Tone of {0}?", &["b", "a"]);
        let mut ab_pieces_ba_labels = ab.clone();
        ab_pieces_ba_labels.labels = ba.labels.clone();
        assert_ne!(
            question_hash(&ab, &one),
            question_hash(&ab_pieces_ba_labels, &one)
        );
        let mut as_filter = ab.clone();
        as_filter.kind = AiKind::Filter;
        assert_ne!(question_hash(&ab, &one), question_hash(&as_filter, &one));
        // Label probabilities of the same prompt are another question.
        let mut as_scores = ab.clone();
        as_scores.kind = AiKind::ClassifyScores;
        assert_ne!(question_hash(&ab, &one), question_hash(&as_scores, &one));
    }

    /// Counts what it is asked and fails once `fail_after` questions were asked.
    struct Flaky {
        inner: ContentHashBackend,
        fail_after: usize,
        asked: AtomicU64,
    }

    impl Answerer for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
            let before = self
                .asked
                .fetch_add(requests.len() as u64, Ordering::Relaxed);
            if before as usize + requests.len() > self.fail_after {
                return Err(EngineError::Inference("worker lost".into()));
            }
            self.inner.answer(call, requests)
        }
    }

    fn flaky(fail_after: usize) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: ContentHashBackend::default(),
            fail_after,
            asked: AtomicU64::new(0),
        })
    }

    #[test]
    fn a_rerun_after_a_failure_asks_only_what_was_missing_and_answers_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let filter = call(AiKind::Filter, "Is {0} kind?", &[]);
        let texts: Vec<String> = (0..40).map(|i| format!("review {i}")).collect();
        let ids: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let requests: Vec<AiRequest<'_>> = (0..40)
            .map(|i| AiRequest {
                anchor: doc(&ids[i], &texts[i]),
                partner: None,
            })
            .collect();
        let truth = ContentHashBackend::default()
            .answer(&filter, &requests)
            .unwrap();

        // First run: two batches of 10 answered, the third fails.
        let first = flaky(25);
        let cached = begun(CachedBackend::new(
            first.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        ));
        for chunk in requests.chunks(10).take(2) {
            cached.answer(&filter, chunk).unwrap();
        }
        let e = cached.answer(&filter, &requests[20..30]).unwrap_err();
        assert!(e.to_string().contains("worker lost"), "{e}");
        drop(cached);

        // Rerun: the 20 recorded answers are reused, the other 20 asked.
        let second = flaky(usize::MAX);
        let cached = begun(CachedBackend::new(
            second.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        ));
        assert_eq!(cached.cache().len(), 20);
        assert_eq!(cached.answer(&filter, &requests).unwrap(), truth);
        assert_eq!(second.asked.load(Ordering::Relaxed), 20);
        let m = cached.work();
        assert_eq!(m.answer_cache_reused, Some(Sum(20)));
        assert_eq!(m.answer_cache_asked, Some(Sum(20)));
        drop(cached);

        // Another dtype is another identity: nothing reused.
        let third = flaky(usize::MAX);
        let cached = begun(CachedBackend::new(
            third.clone(),
            AnswerCache::open(dir.path(), &identity("bf16"), key()).unwrap(),
        ));
        assert_eq!(cached.answer(&filter, &requests).unwrap(), truth);
        assert_eq!(third.asked.load(Ordering::Relaxed), 40);
    }

    #[test]
    fn joins_and_classifications_round_trip_in_request_order() {
        let dir = tempfile::tempdir().unwrap();
        let join = call(AiKind::Join, "Does {0} cite {1}?", &[]);
        let classify = call(AiKind::Classify, "Tone of {0}?", &["pos", "neg", "mixed"]);
        let scores = call(
            AiKind::ClassifyScores,
            "Tone of {0}?",
            &["pos", "neg", "mixed"],
        );
        let score = call(AiKind::Score, "Is {0} kind?", &[]);
        let complete = call(AiKind::Complete, "Summarise {0}.", &[]);
        let mut extract = call(AiKind::Extract, "", &["dish", "price"]);
        extract.descriptions = vec!["Which dish?\nANSWER:".into(), "Price?\nANSWER:".into()];
        let embed = call(AiKind::Embed, "Find dishes", &[]);
        let a = ["a0", "a1", "a2"];
        let b = ["b0", "b1", "b2", "b3"];
        let pairs: Vec<AiRequest<'_>> = a
            .iter()
            .flat_map(|x| {
                b.iter().map(move |y| AiRequest {
                    anchor: doc(x, x),
                    partner: Some(doc(y, y)),
                })
            })
            .collect();
        let singles: Vec<AiRequest<'_>> = b
            .iter()
            .map(|y| AiRequest {
                anchor: doc(y, y),
                partner: None,
            })
            .collect();
        let reference = ContentHashBackend::default();
        let want_pairs = reference.answer(&join, &pairs).unwrap();
        let want_labels = reference.answer(&classify, &singles).unwrap();
        let typed = [&scores, &score, &complete, &extract, &embed];
        let want_typed: Vec<Vec<Answer>> = typed
            .iter()
            .map(|c| reference.answer(c, &singles).unwrap())
            .collect();
        let inner = flaky(usize::MAX);
        let cached = begun(CachedBackend::new(
            inner.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        ));
        // Half the pairs first, then all of them: the known half is not asked again.
        cached.answer(&join, &pairs[..6]).unwrap();
        assert_eq!(cached.answer(&join, &pairs).unwrap(), want_pairs);
        assert_eq!(cached.answer(&classify, &singles).unwrap(), want_labels);
        for (c, want) in typed.iter().zip(&want_typed) {
            assert_eq!(&cached.answer(c, &singles).unwrap(), want, "{:?}", c.kind);
        }
        assert_eq!(inner.asked.load(Ordering::Relaxed), 12 + 4 + 5 * 4);
        drop(cached);
        let reopened = begun(CachedBackend::new(
            flaky(0),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        ));
        assert_eq!(reopened.answer(&join, &pairs).unwrap(), want_pairs);
        assert_eq!(reopened.answer(&classify, &singles).unwrap(), want_labels);
        for (c, want) in typed.iter().zip(&want_typed) {
            assert_eq!(&reopened.answer(c, &singles).unwrap(), want, "{:?}", c.kind);
        }
        // A generating call with another max_tokens is another question.
        let mut longer = complete.clone();
        longer.max_tokens += 1;
        assert!(reopened.answer(&longer, &singles).is_err());
        // An embedding of other dims, or under another instruction, is another
        // question.
        let mut shorter = embed.clone();
        shorter.max_tokens = 4;
        assert!(reopened.answer(&shorter, &singles).is_err());
        let other = call(AiKind::Embed, "Find prices", &[]);
        assert!(reopened.answer(&other, &singles).is_err());
    }

    /// Bytes of a record holding a TRUE/FALSE.
    const BOOL_RECORD: usize = RECORD_FIXED_BYTES + 2;

    #[test]
    fn a_torn_or_damaged_log_loses_only_its_bad_records() {
        let dir = tempfile::tempdir().unwrap();
        let id = identity("f32");
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        let q = |i: u8| [i; QUESTION_BYTES];
        cache
            .insert(&[
                (q(1), Answer::Bool(true)),
                (q(2), Answer::Bool(false)),
                (q(3), Answer::Label(7)),
            ])
            .unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        // A kill in the middle of a write leaves part of a record; a disk error
        // flips a byte of the second.
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[BOOL_RECORD + 3] ^= 0x40;
        bytes.extend_from_slice(&[9; 7]);
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        // The flipped record and the torn one.
        assert_eq!(cache.damaged(), 2);
        assert_eq!(cache.get(&q(1)), Some(Answer::Bool(true)));
        assert_eq!(cache.get(&q(2)), None);
        assert_eq!(cache.get(&q(3)), Some(Answer::Label(7)));
        // The torn tail is gone, so new records follow whole ones.
        cache.insert(&[(q(4), Answer::Text("ok".into()))]).unwrap();
        drop(cache);
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.get(&q(4)), Some(Answer::Text("ok".into())));
        assert_eq!(
            std::fs::metadata(&log).unwrap().len() as usize,
            2 * BOOL_RECORD + (RECORD_FIXED_BYTES + 5) + (RECORD_FIXED_BYTES + 3)
        );
        // A length no record has (a damaged length field) ends the readable
        // log there: nothing after it is trusted.
        drop(cache);
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[QUESTION_BYTES + 3] = 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert!(cache.is_empty());
        assert_eq!(cache.damaged(), 1);
    }

    #[test]
    fn a_length_past_the_end_is_counted_and_the_records_before_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let id = identity("f32");
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        let q = |i: u8| [i; QUESTION_BYTES];
        cache
            .insert(&[
                (q(1), Answer::Bool(true)),
                (q(2), Answer::Bool(false)),
                (q(3), Answer::Bool(true)),
            ])
            .unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        // The second record's length now reaches past the end of the log.
        let mut bytes = std::fs::read(&log).unwrap();
        let length_at = BOOL_RECORD + QUESTION_BYTES;
        bytes[length_at..length_at + LENGTH_BYTES].copy_from_slice(&1000u32.to_le_bytes());
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.damaged(), 1);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(&q(1)), Some(Answer::Bool(true)));
        assert_eq!(std::fs::metadata(&log).unwrap().len() as usize, BOOL_RECORD);
    }

    #[test]
    fn a_record_moved_from_another_identity_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let q = |i: u8| [i; QUESTION_BYTES];
        let mut other_model = identity("f32");
        other_model.weights_sha256 = "another seed".into();
        let mut logs = Vec::new();
        for (id, answered) in [
            (identity("f32"), (q(2), Answer::Bool(true))),
            (identity("bf16"), (q(1), Answer::Bool(false))),
            (other_model.clone(), (q(1), Answer::Bool(false))),
        ] {
            let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
            cache.insert(&[answered]).unwrap();
            logs.push(cache.log_path().to_path_buf());
        }
        // The other dtype's and the other model's records, signed with the
        // same key, copied into this model's log before its own.
        let mut bytes = std::fs::read(&logs[1]).unwrap();
        bytes.extend(std::fs::read(&logs[2]).unwrap());
        bytes.extend(std::fs::read(&logs[0]).unwrap());
        std::fs::write(&logs[0], &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap();
        assert_eq!(cache.damaged(), 2);
        assert_eq!(cache.get(&q(1)), None);
        assert_eq!(cache.get(&q(2)), Some(Answer::Bool(true)));
        // The other identities still read their own.
        drop(cache);
        let cache = AnswerCache::open(dir.path(), &other_model, key()).unwrap();
        assert_eq!(
            (cache.damaged(), cache.get(&q(1))),
            (0, Some(Answer::Bool(false)))
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_log_that_is_a_link_a_fifo_or_a_device_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let id = identity("f32");
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        std::fs::remove_file(&log).unwrap();
        // A link out of the folder, to a file someone else owns.
        let outside = dir.path().join("precious.txt");
        std::fs::write(&outside, b"keep me as I am\n").unwrap();
        std::os::unix::fs::symlink(&outside, &log).unwrap();
        let e = AnswerCache::open(dir.path(), &id, key())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a symbolic link") && e.contains("precious.txt") && e.contains("answers.v4"),
            "{e}"
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep me as I am\n");
        // A dangling link is not created through either.
        std::fs::remove_file(&outside).unwrap();
        assert!(AnswerCache::open(dir.path(), &id, key()).is_err());
        assert!(!outside.exists());
        // A link to /dev/zero (read until memory ran out), and a FIFO.
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &log).unwrap();
        let e = AnswerCache::open(dir.path(), &id, key())
            .unwrap_err()
            .to_string();
        assert!(e.contains("a symbolic link (/dev/zero)"), "{e}");
        std::fs::remove_file(&log).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&log)
            .status()
            .unwrap();
        assert!(made.success());
        let e = AnswerCache::open(dir.path(), &id, key())
            .unwrap_err()
            .to_string();
        assert!(e.contains("a FIFO (named pipe), not a regular file"), "{e}");
        std::fs::remove_file(&log).unwrap();
        // identity.json as a link, and the identity folder as a link elsewhere.
        let identity_file = dir.path().join(id.key()).join(IDENTITY_FILE);
        std::fs::remove_file(&identity_file).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &identity_file).unwrap();
        let e = AnswerCache::open(dir.path(), &id, key())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("identity.json") && e.contains("symbolic link"),
            "{e}"
        );
        let elsewhere = tempfile::tempdir().unwrap();
        let other_root = dir.path().join("other-root");
        std::fs::create_dir(&other_root).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), other_root.join(id.key())).unwrap();
        let e = AnswerCache::open(&other_root, &id, key())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a symbolic link") && e.contains("not a folder"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    /// The key of the tests' caches.
    fn key() -> RecordKey {
        RecordKey([7; KEY_BYTES])
    }

    #[test]
    fn records_forged_without_the_key_are_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let id = identity("f32");
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        let q = |i: u8| [i; QUESTION_BYTES];
        cache
            .insert(&[(q(1), Answer::Bool(true)), (q(2), Answer::Bool(false))])
            .unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        let mut bytes = std::fs::read(&log).unwrap();
        // Flip the first answer and give the record a valid unkeyed checksum,
        // as a tamperer without the key would.
        let answer_at = QUESTION_BYTES + LENGTH_BYTES;
        bytes[answer_at + 1] = 0;
        let forged = Sha256::digest(&bytes[..answer_at + 2]);
        bytes[answer_at + 2..BOOL_RECORD].copy_from_slice(&forged[..MAC_BYTES]);
        // And add a record signed with another key.
        let mut other = q(3).to_vec();
        other.extend_from_slice(&2u32.to_le_bytes());
        other.extend_from_slice(&encode_answer(&Answer::Bool(true)).expect("an answer"));
        other.extend_from_slice(&RecordKey([8; KEY_BYTES]).mac(&id.digest(), &other));
        bytes.extend_from_slice(&other);
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.damaged(), 2);
        assert_eq!(cache.get(&q(1)), None);
        assert_eq!(cache.get(&q(2)), Some(Answer::Bool(false)));
        assert_eq!(cache.get(&q(3)), None);
        // Under the other key only its own record is believed.
        drop(cache);
        let cache = AnswerCache::open(dir.path(), &id, RecordKey([8; KEY_BYTES])).unwrap();
        assert_eq!(
            (cache.len(), cache.get(&q(3))),
            (1, Some(Answer::Bool(true)))
        );
    }

    #[test]
    fn the_key_is_made_once_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache").join(KEY_FILE);
        let a = RecordKey::load_or_create(&path).unwrap();
        let b = RecordKey::load_or_create(&path).unwrap();
        assert_eq!(a.0, b.0);
        assert_ne!(a.0, [0; KEY_BYTES]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        // Two processes making it at once agree on one key.
        let other = dir.path().join("other").join(KEY_FILE);
        let keys: Vec<[u8; KEY_BYTES]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| RecordKey::load_or_create(&other).unwrap().0))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
        std::fs::write(&path, b"short").unwrap();
        let e = RecordKey::load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("5 bytes, not 32") && e.contains(KEY_FILE), "{e}");
    }

    #[test]
    fn bad_places_and_a_second_user_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let e = AnswerCache::open(&file, &identity("f32"), key()).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
        let held = AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap();
        let e = AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap_err();
        assert!(e.to_string().contains("another aisql process"), "{e}");
        drop(held);
        AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap();
        // An identity file that names another identity.
        let id = identity("f32");
        std::fs::write(
            dir.path().join(id.key()).join(IDENTITY_FILE),
            serde_json::to_string(&identity("f16")).unwrap(),
        )
        .unwrap();
        let e = AnswerCache::open(dir.path(), &id, key()).unwrap_err();
        assert!(e.to_string().contains("another model identity"), "{e}");
    }
}
