//! The on-disk KV store (`--kv-store DIR`): the KV of a document's prompt
//! start (`preamble + document`) kept after the query that computed it, so a
//! later query, in this process or after a restart, reads it back instead of
//! computing it again. The scheduler's third tier, below device and host
//! memory ([`crate::inference::scheduler`]).
//!
//! **Keyed by content.** A block is named by SHA-256 over the model's
//! [`KvIdentity`] (weights and tokenizer SHA-256, dtype, device kind) and the
//! prompt's token ids, which hold the prompt format and the document. Another
//! model, dtype, device kind or prompt never matches: it names another block,
//! and the block's own header repeats the identity and the token ids, which
//! are compared before use.
//!
//! **Checked before use.** Each block carries an HMAC-SHA256 over all its
//! bytes, under the key of aisql's cache folder that signs the answer cache
//! ([`RecordKey`], under its own domain). A block that is cut short, has a
//! flipped byte, was written for another identity or tokens, or was signed
//! with another key (copied from another machine) is not used: the lookup
//! says [`Lookup::Rejected`] and the scheduler computes the KV and counts it.
//! Only regular files inside the store are read (no link is followed, no
//! FIFO or device is opened), and a file larger than the store's bound is
//! not read at all.
//!
//! **Bounded.** The store never holds more than its size bound
//! (`--kv-store-size`): before a block is published, the least recently used
//! blocks (by modification time, which a read refreshes) leave until it fits;
//! a block larger than the bound is not kept. Why LRU: a document asked about
//! recently is the one the next question is likeliest to be about (the
//! analyst's many questions over one table), and a block's cost to
//! recompute is proportional to its size, as is the room it takes, so
//! recency alone decides.
//!
//! **Shared safely.** Blocks are written to a temporary name and renamed
//! into place, so a reader never sees half a block. Writers (and `clear`)
//! take an exclusive lock on `DIR/lock` while they publish and evict, and
//! the bytes held are kept in `DIR/usage` under that lock, so two processes
//! sharing one store keep one bound. A folder is made a store only when it
//! is new or empty (`DIR/kv-store.json` marks it): aisql never treats, or
//! clears, a folder of other files as its store.
//!
//! Layout: `DIR/kv-store.json`, `DIR/lock`, `DIR/usage`,
//! `DIR/<identity key>/identity.json`, `DIR/<identity key>/<2 hex>/<40
//! hex>.kv`. A block: `b"AISQLKV\0"`, u32 version, the identity's 32-byte
//! digest, u32 token count, the token ids (u32 each), u64 payload length, the
//! payload (the model's KV bytes, [`aisql_models::kv_bytes`]), then the
//! 32-byte MAC over everything before it; integers little endian.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::data::store_file::{StoreFileError, folder_in_store, open_in_folder};
use crate::error::{EngineError, Result};
use crate::inference::answer_cache::RecordKey;

const MAGIC: &[u8; 8] = b"AISQLKV\0";
const VERSION: u32 = 1;
/// The domain the blocks' MACs are computed under.
const MAC_DOMAIN: &[u8] = b"aisql-kv-block-v1\0";
const MAC_BYTES: usize = 32;
const MARKER_FILE: &str = "kv-store.json";
const MARKER: &str = "{\"format\": \"aisql-kv-store\", \"version\": 1}\n";
const LOCK_FILE: &str = "lock";
const USAGE_FILE: &str = "usage";
const IDENTITY_FILE: &str = "identity.json";
const BLOCK_EXT: &str = "kv";
/// What errors call the store, and what it keeps.
const STORE: (&str, &str) = ("KV store", "its blocks");
/// When the store is full, blocks leave until it holds this share of its
/// bound, so that a full store does not evict on every write.
const EVICT_TO: f64 = 0.9;

/// What a model's KV depends on besides the prompt's token ids.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KvIdentity {
    /// SHA-256 over the weight files' SHA-256s, in load order.
    pub weights_sha256: String,
    /// SHA-256 of the tokenizer (token ids mean what it says they mean).
    pub tokenizer_sha256: String,
    /// Weights dtype as the loaded model reports it (`f32`, `q8_0`, ...).
    pub dtype: String,
    /// `cpu` or `cuda`: KV computed by other kernels is not taken for this
    /// device's own.
    pub device: String,
}

impl KvIdentity {
    fn digest(&self) -> [u8; 32] {
        let json = serde_json::to_vec(self).expect("identity serialises");
        let mut h = Sha256::new();
        h.update(b"aisql-kv-identity-v1\0");
        h.update(&json);
        h.finalize().into()
    }

    /// The identity's folder in the store: 16 hex digits of its digest.
    pub fn key(&self) -> String {
        hex::encode(&self.digest()[..8])
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// No block for these tokens.
    Miss,
    /// The block's payload, checked.
    Hit(Payload<'a>),
    /// A block was there but failed a check (why): not used.
    Rejected(String),
}

/// A checked block's payload, read in place: the block is not copied to
/// take its header and MAC off (blocks run to tens of megabytes).
/// Its buffer goes back to the store when it is dropped.
#[derive(Debug)]
pub struct Payload<'a> {
    block: Vec<u8>,
    range: std::ops::Range<usize>,
    home: &'a Mutex<Vec<u8>>,
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.block[self.range.clone()]
    }
}

impl Drop for Payload<'_> {
    fn drop(&mut self) {
        give_back(self.home, std::mem::take(&mut self.block));
    }
}

/// The largest read buffer a store keeps between reads: the block of a
/// document of about 280 positions of Qwen3-0.6B in f32. A longer document's
/// buffer is freed, so the process does not hold its largest block for good.
const KEPT_READ_BUFFER_BYTES: usize = 64 << 20;

/// Keeps `buffer` as the store's read buffer, unless a larger one is kept
/// or it is over [`KEPT_READ_BUFFER_BYTES`].
fn give_back(home: &Mutex<Vec<u8>>, buffer: Vec<u8>) {
    let mut kept = home.lock().unwrap_or_else(|e| e.into_inner());
    if buffer.capacity() > kept.capacity() && buffer.capacity() <= KEPT_READ_BUFFER_BYTES {
        *kept = buffer;
    }
}

/// One identity's blocks in a store folder, within the store's bound.
pub struct KvStore {
    root: PathBuf,
    dir: PathBuf,
    key: RecordKey,
    identity: [u8; 32],
    limit: u64,
    /// Serialises this process's writers; `DIR/lock` serialises processes.
    writing: Mutex<()>,
    /// The buffer blocks are read into, handed back when their payload is
    /// dropped: a block (tens of megabytes) is above the allocator's mmap
    /// threshold, so a fresh buffer per read would fault in and zero every
    /// page again (a quarter of a stored read's CPU time).
    read_buffer: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("dir", &self.dir)
            .field("limit", &self.limit)
            .finish()
    }
}

/// Makes `root` a store (marked) when it is new or empty; otherwise checks
/// that it is one.
fn open_root(root: &Path) -> Result<()> {
    let flag = "--kv-store";
    match std::fs::symlink_metadata(root) {
        Ok(meta) if !meta.is_dir() => {
            return Err(EngineError::Data(format!(
                "{flag} {}: not a folder",
                root.display()
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(EngineError::io(root, e)),
    }
    folder_in_store(root).map_err(|e| e.into_engine(root, STORE))?;
    let marker = root.join(MARKER_FILE);
    // A store is made only in a new or empty folder. Another process making
    // the same store may have put its marker and more there since the
    // marker was looked for: then it is that store.
    let exists = |path: &Path| std::fs::symlink_metadata(path).is_ok();
    if !exists(&marker) {
        let others = std::fs::read_dir(root)
            .map_err(|e| EngineError::io(root, e))?
            .filter_map(|entry| entry.ok())
            .any(|entry| entry.file_name() != MARKER_FILE);
        if others && !exists(&marker) {
            return Err(EngineError::Data(format!(
                "{flag} {}: the folder holds other files and is not a KV store; \
                 aisql makes a store only in a new or empty folder",
                root.display()
            )));
        }
    }
    match make_once(&marker, MARKER)? {
        None => Ok(()),
        Some(_) => Err(EngineError::Data(format!(
            "{flag} {}: {} is not an aisql KV store's marker",
            root.display(),
            marker.display()
        ))),
    }
}

/// How often, and how long each time, a store's marker or identity file
/// another process is writing is waited for.
const MAKING_WAITS: u32 = 100;
const MAKING_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Makes `path` hold `content` unless it does already: made with O_EXCL, so
/// that two processes opening one new store write it once, and waited for
/// while another process is still writing it. `Ok(Some(found))` for a file
/// that holds something else.
fn make_once(path: &Path, content: &str) -> Result<Option<String>> {
    for _ in 0..MAKING_WAITS {
        match open_in_folder(path, OpenOptions::new().read(true)) {
            Ok(file) => {
                let mut have = String::new();
                file.take(1 << 16)
                    .read_to_string(&mut have)
                    .map_err(|e| EngineError::io(path, e))?;
                if have == content {
                    return Ok(None);
                }
                if !content.starts_with(&have) {
                    return Ok(Some(have));
                }
            }
            Err(StoreFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                match open_in_folder(path, OpenOptions::new().write(true).create_new(true)) {
                    Ok(mut file) => {
                        file.write_all(content.as_bytes())
                            .and_then(|()| file.sync_all())
                            .map_err(|e| EngineError::io(path, e))?;
                        return Ok(None);
                    }
                    Err(StoreFileError::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    }
                    Err(e) => return Err(e.into_engine(path, STORE)),
                }
            }
            Err(e) => return Err(e.into_engine(path, STORE)),
        }
        std::thread::sleep(MAKING_WAIT);
    }
    Err(EngineError::Data(format!(
        "{} stayed incomplete for {} ms (a process that was writing it stopped part way?)",
        path.display(),
        MAKING_WAITS as u128 * MAKING_WAIT.as_millis()
    )))
}

/// The store's lock, held exclusively while it lives.
struct Locked(File);

impl Locked {
    fn take(root: &Path) -> Result<Self> {
        let path = root.join(LOCK_FILE);
        let file = open_in_folder(
            &path,
            OpenOptions::new().read(true).write(true).create(true),
        )
        .map_err(|e| e.into_engine(&path, STORE))?;
        file.lock().map_err(|e| EngineError::io(&path, e))?;
        Ok(Self(file))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Every block file under `root` (all identities): path, bytes, last use.
fn blocks_of(root: &Path) -> Result<Vec<(PathBuf, u64, SystemTime)>> {
    let mut out = Vec::new();
    for id in std::fs::read_dir(root).map_err(|e| EngineError::io(root, e))? {
        let id = id.map_err(|e| EngineError::io(root, e))?;
        if !id.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for shard in std::fs::read_dir(id.path()).map_err(|e| EngineError::io(id.path(), e))? {
            let shard = shard.map_err(|e| EngineError::io(id.path(), e))?;
            if !shard.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = shard.path();
            for f in std::fs::read_dir(&dir).map_err(|e| EngineError::io(&dir, e))? {
                let f = f.map_err(|e| EngineError::io(&dir, e))?;
                let path = f.path();
                if path.extension().is_none_or(|e| e != BLOCK_EXT) {
                    continue;
                }
                let Ok(meta) = f.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                out.push((path, meta.len(), used));
            }
        }
    }
    Ok(out)
}

/// Bytes of blocks under `root`, as `DIR/usage` last recorded them (counted
/// again when the file is missing or damaged).
fn read_usage(root: &Path) -> Result<u64> {
    let path = root.join(USAGE_FILE);
    let recorded = open_in_folder(&path, OpenOptions::new().read(true))
        .ok()
        .and_then(|f| {
            let mut text = String::new();
            f.take(64).read_to_string(&mut text).ok()?;
            text.trim().parse::<u64>().ok()
        });
    match recorded {
        Some(n) => Ok(n),
        None => Ok(blocks_of(root)?.iter().map(|b| b.1).sum()),
    }
}

fn write_usage(root: &Path, bytes: u64) -> Result<()> {
    crate::data::files::write_file_atomic(&root.join(USAGE_FILE), format!("{bytes}\n").as_bytes())
}

impl KvStore {
    /// Opens (making it when new or empty) the store at `root` for the KV of
    /// `identity`, within `limit` bytes, blocks signed with `key`.
    pub fn open(root: &Path, identity: &KvIdentity, key: RecordKey, limit: u64) -> Result<Self> {
        open_root(root)?;
        let dir = root.join(identity.key());
        folder_in_store(&dir).map_err(|e| e.into_engine(&dir, STORE))?;
        let identity_path = dir.join(IDENTITY_FILE);
        let want = serde_json::to_string_pretty(identity).expect("identity serialises");
        if let Some(have) = make_once(&identity_path, &want)? {
            let have: KvIdentity = serde_json::from_str(&have)
                .map_err(|e| EngineError::Data(format!("{}: {e}", identity_path.display())))?;
            if &have != identity {
                return Err(EngineError::Data(format!(
                    "{}: the KV there belongs to another model identity ({have:?}, not {identity:?})",
                    identity_path.display()
                )));
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            dir,
            key,
            identity: identity.digest(),
            limit,
            writing: Mutex::new(()),
            read_buffer: Mutex::new(Vec::new()),
        })
    }

    /// The store's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Its size bound in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn path_of(&self, tokens: &[u32]) -> PathBuf {
        let mut h = Sha256::new();
        h.update(b"aisql-kv-name-v1\0");
        h.update(self.identity);
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        let name = hex::encode(&h.finalize()[..20]);
        self.dir
            .join(&name[..2])
            .join(format!("{name}.{BLOCK_EXT}"))
    }

    /// Whether a block for `tokens` is there (not checked: what an estimate
    /// asks, which reads nothing).
    pub fn contains(&self, tokens: &[u32]) -> bool {
        std::fs::symlink_metadata(self.path_of(tokens)).is_ok_and(|m| m.is_file())
    }

    /// The checked payload stored for `tokens`, if any; a read marks the
    /// block used (least recently used blocks leave first).
    pub fn get(&self, tokens: &[u32]) -> Lookup<'_> {
        let path = self.path_of(tokens);
        let file = match open_in_folder(&path, OpenOptions::new().read(true)) {
            Ok(f) => f,
            Err(StoreFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Lookup::Miss;
            }
            Err(e) => return Lookup::Rejected(e.into_engine(&path, STORE).to_string()),
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len > self.limit {
            return Lookup::Rejected(format!(
                "{}: {len} bytes, over the store's bound",
                path.display()
            ));
        }
        let mut bytes =
            std::mem::take(&mut *self.read_buffer.lock().unwrap_or_else(|e| e.into_inner()));
        bytes.clear();
        bytes.reserve(len as usize);
        if let Err(e) = (&file).take(self.limit + 1).read_to_end(&mut bytes) {
            give_back(&self.read_buffer, bytes);
            return Lookup::Rejected(format!("{}: {e}", path.display()));
        }
        match self.check(&bytes, tokens) {
            Ok(range) => {
                let _ = file.set_modified(SystemTime::now());
                Lookup::Hit(Payload {
                    block: bytes,
                    range,
                    home: &self.read_buffer,
                })
            }
            Err(why) => {
                give_back(&self.read_buffer, bytes);
                Lookup::Rejected(format!("{}: {why}", path.display()))
            }
        }
    }

    /// Where the payload lies in a block's `bytes` when the block is whole,
    /// signed with this store's key, and written for this identity and
    /// `tokens`; why not otherwise.
    fn check(
        &self,
        bytes: &[u8],
        tokens: &[u32],
    ) -> std::result::Result<std::ops::Range<usize>, String> {
        let head = MAGIC.len() + 4 + 32 + 4;
        if bytes.len() < head + 8 + MAC_BYTES {
            return Err(format!("{} bytes, shorter than a block", bytes.len()));
        }
        let (body, tag) = bytes.split_at(bytes.len() - MAC_BYTES);
        if !self.key.verify_signature(MAC_DOMAIN, &[body], tag) {
            return Err(
                "its MAC does not match (damaged, cut short, or signed with another key)".into(),
            );
        }
        if &body[..MAGIC.len()] != MAGIC {
            return Err("not a KV block".into());
        }
        let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(format!(
                "block version {version}, this aisql reads {VERSION}"
            ));
        }
        if body[12..44] != self.identity {
            return Err("written for another model identity".into());
        }
        let n = u32::from_le_bytes(body[44..48].try_into().expect("4 bytes")) as usize;
        let tokens_end = head + n * 4;
        if n != tokens.len()
            || body.len() < tokens_end + 8
            || body[head..tokens_end]
                .chunks_exact(4)
                .zip(tokens)
                .any(|(b, &t)| u32::from_le_bytes(b.try_into().expect("4 bytes")) != t)
        {
            return Err("written for other tokens".into());
        }
        let payload_len = u64::from_le_bytes(
            body[tokens_end..tokens_end + 8]
                .try_into()
                .expect("8 bytes"),
        );
        let start = tokens_end + 8;
        if payload_len != (body.len() - start) as u64 {
            return Err(format!(
                "payload of {payload_len} bytes in {} left",
                body.len() - start
            ));
        }
        Ok(start..body.len())
    }

    /// Keeps `payload` as the KV of `tokens`, making room within the bound;
    /// returns the bytes written (0 when the block alone is over the bound).
    pub fn put(&self, tokens: &[u32], payload: &[u8]) -> Result<u64> {
        // The block is its head, the payload and the MAC of both, written
        // in turn: the payload is not copied into a block first.
        let mut head = Vec::with_capacity(MAGIC.len() + 48 + tokens.len() * 4);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&self.identity);
        head.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        head.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let tag = self.key.sign(MAC_DOMAIN, &[&head, payload]);
        let block: [&[u8]; 3] = [&head, payload, &tag];
        let size = block.iter().map(|p| p.len() as u64).sum::<u64>();
        if size > self.limit {
            return Ok(0);
        }
        let path = self.path_of(tokens);
        let _one_writer = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let _lock = Locked::take(&self.root)?;
        let mut usage = read_usage(&self.root)?;
        let replaced = std::fs::symlink_metadata(&path)
            .ok()
            .filter(|m| m.is_file())
            .map_or(0, |m| m.len());
        usage = usage.saturating_sub(replaced);
        if usage + size > self.limit {
            usage = evict(
                &self.root,
                ((self.limit as f64 * EVICT_TO) as u64).min(self.limit - size),
            )?;
        }
        let parent = path.parent().expect("a block has a folder");
        folder_in_store(parent).map_err(|e| e.into_engine(parent, STORE))?;
        write_block(&path, &block)?;
        write_usage(&self.root, usage + size)?;
        Ok(size)
    }
}

/// Writes the `parts` of a block at `path`, one after the other, whole or
/// not at all, through a file of its own (no link followed).
fn write_block(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let tmp = crate::data::files::temp_path(path);
    let mut file = open_in_folder(&tmp, OpenOptions::new().write(true).create_new(true))
        .map_err(|e| e.into_engine(&tmp, STORE))?;
    if let Err(e) = parts.iter().try_for_each(|p| file.write_all(p)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(EngineError::io(&tmp, e));
    }
    drop(file);
    crate::data::files::publish(&tmp, path)
}

/// Removes the least recently used blocks under `root` until at most
/// `target` bytes are left (the caller holds the lock); returns the bytes
/// left.
fn evict(root: &Path, target: u64) -> Result<u64> {
    let mut blocks = blocks_of(root)?;
    let mut held: u64 = blocks.iter().map(|b| b.1).sum();
    blocks.sort_by_key(|b| b.2);
    for (path, size, _) in blocks {
        if held <= target {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => held -= size,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => held -= size,
            Err(e) => return Err(EngineError::io(&path, e)),
        }
    }
    Ok(held)
}

/// What a store holds, per identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Per identity folder: its identity (when readable), blocks and bytes.
    pub identities: Vec<IdentityStats>,
    /// Bytes of all blocks.
    pub bytes: u64,
    /// Bytes `DIR/usage` records (what the bound is kept against).
    pub recorded_bytes: u64,
}

/// One identity's share of a store.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdentityStats {
    /// The folder's name.
    pub key: String,
    /// Its `identity.json`, when it reads as one.
    pub identity: Option<KvIdentity>,
    /// Blocks held.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Blocks found damaged (by [`verify`] only).
    pub damaged: u64,
}

/// Checks that `root` is a store, without making one.
fn existing_root(root: &Path) -> Result<()> {
    match std::fs::symlink_metadata(root) {
        Ok(m) if !m.is_dir() => {
            return Err(EngineError::Data(format!(
                "{}: not an aisql KV store (not a folder)",
                root.display()
            )));
        }
        Ok(_) => {}
        Err(e) => return Err(EngineError::io(root, e)),
    }
    let marker = root.join(MARKER_FILE);
    match open_in_folder(&marker, OpenOptions::new().read(true)) {
        Ok(file) => {
            let mut text = String::new();
            file.take(4096)
                .read_to_string(&mut text)
                .map_err(|e| EngineError::io(&marker, e))?;
            if text == MARKER {
                return Ok(());
            }
        }
        Err(StoreFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into_engine(&marker, STORE)),
    }
    Err(EngineError::Data(format!(
        "{}: not an aisql KV store (no {MARKER_FILE} of one)",
        root.display()
    )))
}

fn identity_of(dir: &Path) -> Option<KvIdentity> {
    let path = dir.join(IDENTITY_FILE);
    let file = open_in_folder(&path, OpenOptions::new().read(true)).ok()?;
    let mut text = String::new();
    file.take(1 << 16).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// What the store at `root` holds; with `key`, every block is also checked
/// (its MAC, its header) and the damaged ones counted.
pub fn stats(root: &Path, key: Option<&RecordKey>) -> Result<StoreStats> {
    existing_root(root)?;
    let mut out = StoreStats {
        recorded_bytes: read_usage(root)?,
        ..StoreStats::default()
    };
    let mut by_key: std::collections::BTreeMap<String, IdentityStats> = Default::default();
    for (path, size, _) in blocks_of(root)? {
        let id_dir = path
            .parent()
            .and_then(Path::parent)
            .expect("a block lies two folders down");
        let name = id_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = by_key.entry(name.clone()).or_insert_with(|| IdentityStats {
            key: name,
            identity: identity_of(id_dir),
            ..IdentityStats::default()
        });
        entry.blocks += 1;
        entry.bytes += size;
        out.bytes += size;
        if let Some(key) = key
            && !block_is_sound(&path, key, entry.identity.as_ref())
        {
            entry.damaged += 1;
        }
    }
    out.identities = by_key.into_values().collect();
    Ok(out)
}

/// Whether the block at `path` is whole, signed with `key` and written for
/// `identity` (its tokens are not known here: a lookup compares them).
fn block_is_sound(path: &Path, key: &RecordKey, identity: Option<&KvIdentity>) -> bool {
    let Some(identity) = identity else {
        return false;
    };
    let Ok(file) = open_in_folder(path, OpenOptions::new().read(true)) else {
        return false;
    };
    let mut bytes = Vec::new();
    if (&file).read_to_end(&mut bytes).is_err() || bytes.len() < MAGIC.len() + 48 + MAC_BYTES {
        return false;
    }
    let (body, tag) = bytes.split_at(bytes.len() - MAC_BYTES);
    key.verify_signature(MAC_DOMAIN, &[body], tag)
        && &body[..MAGIC.len()] == MAGIC
        && body[12..44] == identity.digest()
}

/// Removes every block of the store at `root` (under its lock), keeping the
/// store itself; returns the blocks and bytes removed.
pub fn clear(root: &Path) -> Result<(u64, u64)> {
    existing_root(root)?;
    let _lock = Locked::take(root)?;
    let blocks = blocks_of(root)?;
    let (mut n, mut bytes) = (0, 0);
    for (path, size, _) in blocks {
        match std::fs::remove_file(&path) {
            Ok(()) => {
                n += 1;
                bytes += size;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EngineError::io(&path, e)),
        }
    }
    write_usage(root, 0)?;
    Ok((n, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(dtype: &str) -> KvIdentity {
        KvIdentity {
            weights_sha256: "ab".repeat(32),
            tokenizer_sha256: "cd".repeat(32),
            dtype: dtype.into(),
            device: "cpu".into(),
        }
    }

    fn key(dir: &Path) -> RecordKey {
        RecordKey::load_or_create(&dir.join("test.key")).unwrap()
    }

    fn store(root: &Path, dtype: &str, limit: u64) -> KvStore {
        let k = key(root.parent().unwrap());
        KvStore::open(root, &identity(dtype), k, limit).unwrap()
    }

    #[test]
    fn processes_opening_one_new_store_at_once_all_open_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kv");
        let k = key(tmp.path());
        let openers: Vec<_> = (0..8)
            .map(|_| {
                let (root, k) = (root.clone(), k.clone());
                std::thread::spawn(move || KvStore::open(&root, &identity("f32"), k, 1 << 20))
            })
            .collect();
        for opener in openers {
            opener.join().unwrap().unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(root.join(MARKER_FILE)).unwrap(),
            MARKER
        );
        // A marker another process is still writing is waited for...
        let second = tmp.path().join("kv2");
        std::fs::create_dir(&second).unwrap();
        std::fs::write(second.join(MARKER_FILE), &MARKER[..10]).unwrap();
        let finishing = second.join(MARKER_FILE);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::write(finishing, MARKER).unwrap();
        });
        KvStore::open(&second, &identity("f32"), k.clone(), 1 << 20).unwrap();
        writer.join().unwrap();
        // ...and one that is not a marker is refused.
        let third = tmp.path().join("kv3");
        std::fs::create_dir(&third).unwrap();
        std::fs::write(third.join(MARKER_FILE), "{\"something\": 1}").unwrap();
        let e = KvStore::open(&third, &identity("f32"), k, 1 << 20)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an aisql KV store's marker"), "{e}");
    }

    fn hit(l: Lookup) -> Vec<u8> {
        match l {
            Lookup::Hit(b) => b.to_vec(),
            other => panic!("not a hit: {other:?}"),
        }
    }

    fn rejected(l: Lookup) -> String {
        match l {
            Lookup::Rejected(why) => why,
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[test]
    fn a_block_comes_back_for_its_tokens_only() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kv");
        let s = store(&root, "f32", 1 << 20);
        assert!(matches!(s.get(&[1, 2, 3]), Lookup::Miss));
        let written = s.put(&[1, 2, 3], b"payload").unwrap();
        assert!(written > 7);
        assert!(s.contains(&[1, 2, 3]));
        assert_eq!(hit(s.get(&[1, 2, 3])), b"payload");
        assert!(matches!(s.get(&[1, 2]), Lookup::Miss));
        // Another dtype of the same weights is another identity: no match.
        let other = store(&root, "q8_0", 1 << 20);
        assert!(matches!(other.get(&[1, 2, 3]), Lookup::Miss));
        let st = stats(&root, Some(&key(tmp.path()))).unwrap();
        assert_eq!(st.bytes, written);
        assert_eq!(st.recorded_bytes, written);
        assert_eq!(st.identities.len(), 1);
        assert_eq!(st.identities[0].damaged, 0);
    }

    #[test]
    fn a_flipped_byte_a_cut_block_a_foreign_block_and_a_link_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kv");
        let s = store(&root, "f32", 1 << 20);
        s.put(&[5, 6], b"some kv bytes").unwrap();
        let path = s.path_of(&[5, 6]);
        let good = std::fs::read(&path).unwrap();
        for at in [0, 20, 50, good.len() - 3, good.len() - 40] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert!(rejected(s.get(&[5, 6])).contains("MAC"), "byte {at}");
        }
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(rejected(s.get(&[5, 6])).contains("MAC"));
        std::fs::write(&path, &good[..10]).unwrap();
        assert!(rejected(s.get(&[5, 6])).contains("shorter"));
        let st = stats(&root, Some(&key(tmp.path()))).unwrap();
        assert_eq!(st.identities[0].damaged, 1);
        // A block of another model, signed with this key, put in this
        // model's place: its header names the other identity.
        let other = store(&root, "bf16", 1 << 20);
        other.put(&[5, 6], b"other model").unwrap();
        std::fs::copy(other.path_of(&[5, 6]), &path).unwrap();
        assert!(rejected(s.get(&[5, 6])).contains("another model"));
        // A block of other tokens in this one's place.
        s.put(&[7], b"seven").unwrap();
        std::fs::copy(s.path_of(&[7]), &path).unwrap();
        assert!(rejected(s.get(&[5, 6])).contains("other tokens"));
        // Signed with another key (copied from another machine).
        let foreign = KvStore::open(
            &root,
            &identity("f32"),
            RecordKey::load_or_create(&tmp.path().join("other.key")).unwrap(),
            1 << 20,
        )
        .unwrap();
        foreign.put(&[5, 6], b"some kv bytes").unwrap();
        assert!(rejected(s.get(&[5, 6])).contains("MAC"));
        #[cfg(unix)]
        {
            let outside = tmp.path().join("outside");
            std::fs::write(&outside, &good).unwrap();
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink(&outside, &path).unwrap();
            assert!(rejected(s.get(&[5, 6])).contains("symbolic link"));
            // Writing the block again replaces the link, never the file it names.
            s.put(&[5, 6], b"some kv bytes").unwrap();
            assert_eq!(std::fs::read(&outside).unwrap(), good);
            assert_eq!(hit(s.get(&[5, 6])), b"some kv bytes");
        }
    }

    #[test]
    fn the_store_stays_within_its_bound_least_recently_used_leaving_first() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kv");
        let payload = vec![7u8; 1000];
        let probe = store(&root, "f32", u64::MAX).put(&[0], &payload).unwrap();
        clear(&root).unwrap();
        let limit = probe * 5 + probe / 2;
        // Two stores on one folder (two processes) keep one bound.
        let (a, b) = (store(&root, "f32", limit), store(&root, "f32", limit));
        for i in 0..20u32 {
            let s = if i % 2 == 0 { &a } else { &b };
            s.put(&[i], &payload).unwrap();
            if i >= 1 {
                // Block 0 is read after every write: it stays.
                hit(a.get(&[0]));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            let st = stats(&root, None).unwrap();
            assert!(
                st.bytes <= limit,
                "{} over {limit} after block {i}",
                st.bytes
            );
            assert_eq!(st.bytes, st.recorded_bytes);
        }
        assert!(a.contains(&[0]));
        assert!(a.contains(&[19]));
        assert!(!a.contains(&[1]));
        // A block over the bound alone is not kept.
        assert_eq!(a.put(&[99], &vec![0u8; limit as usize]).unwrap(), 0);
        assert!(!a.contains(&[99]));
        let (n, _) = clear(&root).unwrap();
        assert!(n >= 4);
        assert_eq!(stats(&root, None).unwrap().bytes, 0);
    }

    #[test]
    fn a_folder_of_other_files_is_not_made_a_store() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("notes.txt"), "mine").unwrap();
        let k = RecordKey::load_or_create(&tmp.path().join("k")).unwrap();
        let e = KvStore::open(tmp.path(), &identity("f32"), k, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a KV store"), "{e}");
        assert!(
            clear(tmp.path())
                .unwrap_err()
                .to_string()
                .contains("not an aisql KV store")
        );
        assert!(tmp.path().join("notes.txt").exists());
        let file = tmp.path().join("notes.txt");
        let k = RecordKey::load_or_create(&tmp.path().join("k")).unwrap();
        let e = KvStore::open(&file, &identity("f32"), k, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
    }
}
