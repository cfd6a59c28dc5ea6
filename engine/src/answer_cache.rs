//! The persistent answer cache (`--answer-cache DIR`): every answer the model
//! gives is appended to a log as soon as its batch returns, keyed by what the
//! answer depends on — the model's identity and the rendered prompt — so a
//! query that dies (a lost worker, a crash, `kill -9`) reruns without asking
//! the model again for what it already answered. [`CachedBackend`] puts the
//! cache in front of any backend, in one process or on a coordinator.
//!
//! Layout: `DIR/<identity key>/identity.json` names what the answers belong to
//! ([`AnswerIdentity`]: model id, weights and tokenizer SHA-256, dtype, prompt
//! format); `DIR/<identity key>/answers.v2` holds fixed-size records of a
//! question hash, the answer and a keyed MAC. A record cut short by a kill is
//! dropped when the log is opened again; a record whose MAC fails is skipped
//! and counted, never used. One process holds a log at a time (an exclusive
//! file lock), so two runs never interleave their writes.
//!
//! The MAC is HMAC-SHA256 under a key kept in aisql's cache folder
//! ([`crate::cache_dir`], `answer-cache.key`, made on first use, readable by
//! its owner only), outside every answer folder: whoever can write an answer
//! folder but not that key cannot make aisql use an answer it did not give. A
//! folder copied to another machine (another key) is re-asked, not trusted.
//!
//! The question hash is SHA-256 over the kind, the classification labels (an
//! answer is an index into them) and the rendered prompt, exactly as the model
//! reads it: two operators, queries or plans that ask the same prompt share
//! its answer, and a changed prompt, label list or model never does.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::backend::{AiCall, AiKind, AiRequest, Doc, InferenceBackend, check_answer_count};
use crate::error::{EngineError, Result};

/// Bytes of a question hash: 128 bits, so that a collision among billions of
/// questions has a probability far below that of a disk error.
const QUESTION_BYTES: usize = 16;
/// Bytes of a record's MAC: the first 128 bits of HMAC-SHA256.
const MAC_BYTES: usize = 16;
/// One record: question hash, answer (u16, little endian), MAC over the rest.
const RECORD_BYTES: usize = QUESTION_BYTES + 2 + MAC_BYTES;
/// The log's file name; the version changes with the record or hash layout.
const LOG_FILE: &str = "answers.v2";
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
    /// Prompt layout ([`crate::prompt::PromptFormat`]'s name).
    pub prompt_format: String,
}

impl AnswerIdentity {
    /// The folder name of this identity's answers: 16 hex digits of SHA-256 over
    /// its JSON.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("identity serialises");
        hex::encode(&Sha256::digest(&json)[..8])
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
    h.update([match call.kind {
        AiKind::Filter => b'f',
        AiKind::Join => b'j',
        AiKind::Classify => b'c',
    }]);
    if call.kind == AiKind::Classify {
        h.update((call.labels.len() as u64).to_le_bytes());
        for label in &call.labels {
            h.update((label.len() as u64).to_le_bytes());
            h.update(label.as_bytes());
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
        match std::fs::read(path) {
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
                let bytes = std::fs::read(path).map_err(|e| EngineError::io(path, e))?;
                Self::from_file_bytes(path, &bytes)
            }
            Err(e) => Err(EngineError::io(path, e)),
        }
    }

    fn from_file_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| {
            EngineError::Data(format!(
                "answer cache key {}: {} bytes, not {KEY_BYTES}; remove it to make a new one (the answers signed with it will be asked again)",
                path.display(),
                bytes.len()
            ))
        })?;
        Ok(Self(key))
    }

    /// HMAC-SHA256 under this key, fed `body`.
    fn hmac(&self, body: &[u8]) -> hmac::Hmac<Sha256> {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(body);
        mac
    }

    /// The MAC of a record's body.
    fn mac(&self, body: &[u8]) -> [u8; MAC_BYTES] {
        use hmac::Mac as _;
        self.hmac(body).finalize().into_bytes()[..MAC_BYTES]
            .try_into()
            .expect("16 bytes")
    }

    /// Whether `tag` is the MAC of `body` (compared in constant time).
    fn verify(&self, body: &[u8], tag: &[u8]) -> bool {
        use hmac::Mac as _;
        self.hmac(body).verify_truncated_left(tag).is_ok()
    }
}

/// The answers of one identity, in memory and in their log.
pub struct AnswerCache {
    log_path: PathBuf,
    /// Signs the records written and checks those read.
    key: RecordKey,
    log: Mutex<File>,
    answers: Mutex<HashMap<QuestionHash, u16>>,
    /// Records found damaged or not signed with this key when the log was
    /// opened (skipped).
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
        let identity_path = dir.join(IDENTITY_FILE);
        let want = serde_json::to_string_pretty(identity).expect("identity serialises");
        match std::fs::read_to_string(&identity_path) {
            Ok(have) => {
                let have: AnswerIdentity = serde_json::from_str(&have)
                    .map_err(|e| EngineError::Data(format!("{}: {e}", identity_path.display())))?;
                if &have != identity {
                    return Err(EngineError::Data(format!(
                        "{}: the answers there belong to another model identity ({have:?}, not {identity:?})",
                        identity_path.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::output::write_file_atomic(&identity_path, want.as_bytes())?;
            }
            Err(e) => return Err(EngineError::io(&identity_path, e)),
        }
        let log_path = dir.join(LOG_FILE);
        let mut log = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(|e| EngineError::io(&log_path, e))?;
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
        let whole = bytes.len() / RECORD_BYTES * RECORD_BYTES;
        if whole != bytes.len() {
            // A write cut short by a kill: drop its bytes so that records
            // appended from now on stay aligned.
            log.set_len(whole as u64)
                .map_err(|e| EngineError::io(&log_path, e))?;
        }
        let mut answers = HashMap::with_capacity(whole / RECORD_BYTES);
        let mut damaged = 0;
        for record in bytes[..whole].chunks_exact(RECORD_BYTES) {
            let (body, tag) = record.split_at(QUESTION_BYTES + 2);
            if !key.verify(body, tag) {
                damaged += 1;
                continue;
            }
            let question: QuestionHash = body[..QUESTION_BYTES].try_into().expect("16 bytes");
            let answer = u16::from_le_bytes([body[QUESTION_BYTES], body[QUESTION_BYTES + 1]]);
            answers.insert(question, answer);
        }
        Ok(Self {
            log_path,
            key,
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
    pub fn get(&self, question: &QuestionHash) -> Option<u16> {
        self.answers
            .lock()
            .expect("answer cache lock")
            .get(question)
            .copied()
    }

    /// Records answers: appended to the log in one write, then held.
    pub fn insert(&self, answered: &[(QuestionHash, u16)]) -> Result<()> {
        if answered.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(answered.len() * RECORD_BYTES);
        for (question, answer) in answered {
            let start = buf.len();
            buf.extend_from_slice(question);
            buf.extend_from_slice(&answer.to_le_bytes());
            let tag = self.key.mac(&buf[start..]);
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
            .extend(answered.iter().copied());
        Ok(())
    }
}

/// A backend behind an answer cache: questions answered before are answered from
/// it, the rest are asked of `inner` (in their order, so a run of one anchor's
/// requests stays together) and recorded as soon as `inner` returns.
pub struct CachedBackend {
    inner: std::sync::Arc<dyn InferenceBackend>,
    cache: AnswerCache,
    /// This query's questions answered from the cache.
    reused: AtomicU64,
    /// This query's questions asked of `inner`.
    asked: AtomicU64,
}

impl CachedBackend {
    /// `inner` behind `cache`.
    pub fn new(inner: std::sync::Arc<dyn InferenceBackend>, cache: AnswerCache) -> Self {
        Self {
            inner,
            cache,
            reused: AtomicU64::new(0),
            asked: AtomicU64::new(0),
        }
    }

    /// The cache.
    pub fn cache(&self) -> &AnswerCache {
        &self.cache
    }

    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        ask: impl FnOnce(&[AiRequest<'_>]) -> Result<Vec<u16>>,
    ) -> Result<Vec<u16>> {
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
        let mut answers: Vec<Option<u16>> = questions.iter().map(|q| self.cache.get(q)).collect();
        let missing: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        self.reused
            .fetch_add((requests.len() - missing.len()) as u64, Ordering::Relaxed);
        if !missing.is_empty() {
            let asked: Vec<AiRequest<'_>> = missing.iter().map(|&i| requests[i]).collect();
            let got = ask(&asked)?;
            check_answer_count(call, "the backend", got.len(), asked.len())?;
            self.asked.fetch_add(asked.len() as u64, Ordering::Relaxed);
            let recorded: Vec<(QuestionHash, u16)> = missing
                .iter()
                .zip(&got)
                .map(|(&i, &a)| (questions[i], a))
                .collect();
            self.cache.insert(&recorded)?;
            for (&i, a) in missing.iter().zip(got) {
                answers[i] = Some(a);
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every question answered"))
            .collect())
    }
}

impl InferenceBackend for CachedBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        let answers = self.answer(call, requests, |asked| {
            Ok(self
                .inner
                .decide(call, asked)?
                .into_iter()
                .map(u16::from)
                .collect())
        })?;
        answers
            .into_iter()
            .map(|a| match a {
                0 => Ok(false),
                1 => Ok(true),
                other => Err(EngineError::Data(format!(
                    "answer cache {}: {}: a TRUE/FALSE question has answer {other}",
                    self.cache.log_path.display(),
                    call.op_id
                ))),
            })
            .collect()
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        let answers = self.answer(call, requests, |asked| {
            self.inner
                .classify(call, asked)?
                .into_iter()
                .map(|i| {
                    u16::try_from(i).map_err(|_| {
                        EngineError::Inference(format!("{}: label index {i}", call.op_id))
                    })
                })
                .collect()
        })?;
        answers
            .into_iter()
            .map(|a| {
                let i = usize::from(a);
                if i < call.labels.len() {
                    Ok(i)
                } else {
                    Err(EngineError::Data(format!(
                        "answer cache {}: {}: label index {i} of {} labels",
                        self.cache.log_path.display(),
                        call.op_id,
                        call.labels.len()
                    )))
                }
            })
            .collect()
    }

    fn measurements(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = self.inner.measurements();
        m.insert(
            "answer_cache_reused".into(),
            self.reused.load(Ordering::Relaxed).into(),
        );
        m.insert(
            "answer_cache_asked".into(),
            self.asked.load(Ordering::Relaxed).into(),
        );
        m
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.inner.kv_capacity_tokens()
    }

    fn host_memory_allowance(&self) -> usize {
        self.inner.host_memory_allowance()
    }

    fn reuses_work(&self) -> bool {
        self.inner.reuses_work()
    }

    fn cancel(&self) {
        self.inner.cancel()
    }

    fn wait_stopped(&self) {
        self.inner.wait_stopped()
    }

    fn start_query(&self, operators: &[AiCall]) {
        self.reused.store(0, Ordering::Relaxed);
        self.asked.store(0, Ordering::Relaxed);
        self.inner.start_query(operators)
    }

    fn end_query(&self) {
        self.inner.end_query()
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        self.inner.partners_collected(call, partners)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ContentHashBackend, test_call as call};
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
    }

    /// Counts what it is asked and fails once `fail_after` questions were asked.
    struct Flaky {
        inner: ContentHashBackend,
        fail_after: usize,
        asked: AtomicU64,
    }

    impl InferenceBackend for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
            let before = self
                .asked
                .fetch_add(requests.len() as u64, Ordering::Relaxed);
            if before as usize + requests.len() > self.fail_after {
                return Err(EngineError::Inference("worker lost".into()));
            }
            self.inner.decide(call, requests)
        }
        fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
            self.asked
                .fetch_add(requests.len() as u64, Ordering::Relaxed);
            self.inner.classify(call, requests)
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
            .decide(&filter, &requests)
            .unwrap();

        // First run: two batches of 10 answered, the third fails.
        let first = flaky(25);
        let cached = CachedBackend::new(
            first.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        );
        for chunk in requests.chunks(10).take(2) {
            cached.decide(&filter, chunk).unwrap();
        }
        let e = cached.decide(&filter, &requests[20..30]).unwrap_err();
        assert!(e.to_string().contains("worker lost"), "{e}");
        drop(cached);

        // Rerun: the 20 recorded answers are reused, the other 20 asked.
        let second = flaky(usize::MAX);
        let cached = CachedBackend::new(
            second.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        );
        assert_eq!(cached.cache().len(), 20);
        cached.start_query(&[]);
        assert_eq!(cached.decide(&filter, &requests).unwrap(), truth);
        assert_eq!(second.asked.load(Ordering::Relaxed), 20);
        let m = cached.measurements();
        assert_eq!(m["answer_cache_reused"], 20);
        assert_eq!(m["answer_cache_asked"], 20);
        drop(cached);

        // Another dtype is another identity: nothing reused.
        let third = flaky(usize::MAX);
        let cached = CachedBackend::new(
            third.clone(),
            AnswerCache::open(dir.path(), &identity("bf16"), key()).unwrap(),
        );
        assert_eq!(cached.decide(&filter, &requests).unwrap(), truth);
        assert_eq!(third.asked.load(Ordering::Relaxed), 40);
    }

    #[test]
    fn joins_and_classifications_round_trip_in_request_order() {
        let dir = tempfile::tempdir().unwrap();
        let join = call(AiKind::Join, "Does {0} cite {1}?", &[]);
        let classify = call(AiKind::Classify, "Tone of {0}?", &["pos", "neg", "mixed"]);
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
        let want_pairs = reference.decide(&join, &pairs).unwrap();
        let want_labels = reference.classify(&classify, &singles).unwrap();
        let inner = flaky(usize::MAX);
        let cached = CachedBackend::new(
            inner.clone(),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        );
        // Half the pairs first, then all of them: the known half is not asked again.
        cached.decide(&join, &pairs[..6]).unwrap();
        assert_eq!(cached.decide(&join, &pairs).unwrap(), want_pairs);
        assert_eq!(cached.classify(&classify, &singles).unwrap(), want_labels);
        assert_eq!(inner.asked.load(Ordering::Relaxed), 12 + 4);
        drop(cached);
        let reopened = CachedBackend::new(
            flaky(0),
            AnswerCache::open(dir.path(), &identity("f32"), key()).unwrap(),
        );
        assert_eq!(reopened.decide(&join, &pairs).unwrap(), want_pairs);
        assert_eq!(reopened.classify(&classify, &singles).unwrap(), want_labels);
    }

    #[test]
    fn a_torn_or_damaged_log_loses_only_its_bad_records() {
        let dir = tempfile::tempdir().unwrap();
        let id = identity("f32");
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        let q = |i: u8| [i; QUESTION_BYTES];
        cache.insert(&[(q(1), 1), (q(2), 0), (q(3), 7)]).unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        // A kill in the middle of a write leaves part of a record; a disk error
        // flips a byte of the second.
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[RECORD_BYTES + 3] ^= 0x40;
        bytes.extend_from_slice(&[9; 7]);
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.damaged(), 1);
        assert_eq!(cache.get(&q(1)), Some(1));
        assert_eq!(cache.get(&q(2)), None);
        assert_eq!(cache.get(&q(3)), Some(7));
        // The torn tail is gone, so new records stay aligned.
        cache.insert(&[(q(4), 1)]).unwrap();
        drop(cache);
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.get(&q(4)), Some(1));
        assert_eq!(
            std::fs::metadata(&log).unwrap().len() as usize,
            4 * RECORD_BYTES
        );
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
        cache.insert(&[(q(1), 1), (q(2), 0)]).unwrap();
        let log = cache.log_path().to_path_buf();
        drop(cache);
        let mut bytes = std::fs::read(&log).unwrap();
        // Flip the first answer and give the record a valid unkeyed checksum,
        // as a tamperer without the key would.
        bytes[QUESTION_BYTES] = 0;
        let forged = Sha256::digest(&bytes[..QUESTION_BYTES + 2]);
        bytes[QUESTION_BYTES + 2..RECORD_BYTES].copy_from_slice(&forged[..MAC_BYTES]);
        // And add a record signed with another key.
        let mut other = q(3).to_vec();
        other.extend_from_slice(&1u16.to_le_bytes());
        other.extend_from_slice(&RecordKey([8; KEY_BYTES]).mac(&other));
        bytes.extend_from_slice(&other);
        std::fs::write(&log, &bytes).unwrap();
        let cache = AnswerCache::open(dir.path(), &id, key()).unwrap();
        assert_eq!(cache.damaged(), 2);
        assert_eq!(cache.get(&q(1)), None);
        assert_eq!(cache.get(&q(2)), Some(0));
        assert_eq!(cache.get(&q(3)), None);
        // Under the other key only its own record is believed.
        drop(cache);
        let cache = AnswerCache::open(dir.path(), &id, RecordKey([8; KEY_BYTES])).unwrap();
        assert_eq!((cache.len(), cache.get(&q(3))), (1, Some(1)));
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
