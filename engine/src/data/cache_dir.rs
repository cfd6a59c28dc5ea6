//! aisql's cache folder: the one rule for where generated and downloaded files live.
//!
//! Everything aisql caches hangs off [`cache_dir`]: the QUAIL-B data (`quailb/`,
//! `quailb-standin/`, in the bench crate) and the tiny model
//! (`models/tiny-qwen3-seed0`, [`crate::inference::scheduler::tiny_model_dir`]). One function, so
//! that `AISQL_CACHE_DIR` or `XDG_CACHE_HOME` moves all of them together. Also the one rule
//! for trusting a cache entry: its [`SEAL_FILE`] of SHA-256 sums, checked before use.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};

/// Used when neither `AISQL_CACHE_DIR`, `XDG_CACHE_HOME` nor `HOME` is set: a folder
/// in the working directory (rather than failing: the cache is only a convenience).
pub const FALLBACK_DIR: &str = ".aisql-cache";

/// aisql's cache folder from the process environment; see [`cache_dir_from`].
pub fn cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

/// aisql's cache folder from the environment `env` gives (a pure function, so the rule
/// can be tested without touching the process environment):
/// `$AISQL_CACHE_DIR`, else `$XDG_CACHE_HOME/aisql`, else `$HOME/.cache/aisql`, else
/// [`FALLBACK_DIR`]. Empty variables count as unset, and a relative `XDG_CACHE_HOME`
/// is ignored, as the XDG base-directory specification says.
pub fn cache_dir_from(env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("AISQL_CACHE_DIR") {
        return dir;
    }
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return xdg.join("aisql");
    }
    if let Some(home) = var("HOME") {
        return home.join(".cache").join("aisql");
    }
    PathBuf::from(FALLBACK_DIR)
}

/// Name of a cache entry's seal: `sha256sum` lines for every file of the entry,
/// relative to the entry's base folder. An entry whose files do not match its
/// seal (or that has none: a generation cut short) is rebuilt, never used.
pub const SEAL_FILE: &str = "aisql-cache.sha256";

/// The SHA-256 of a file, in hex, read a MiB at a time.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// Writes `seal` (atomically) listing the SHA-256 of each of `files`, given
/// relative to `base`.
pub fn seal(base: &Path, files: &[PathBuf], seal: &Path) -> Result<()> {
    let mut text = String::new();
    for rel in files {
        let path = base.join(rel);
        let hash = sha256_of(&path).map_err(|e| EngineError::io(&path, e))?;
        text.push_str(&format!("{hash}  {}\n", rel.display()));
    }
    crate::data::files::write_file_atomic(seal, text.as_bytes())
}

/// Every file under `dir` (but its seal and temporary files), relative to `dir`.
pub fn files_of(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| EngineError::io(&d, e))? {
            let path = entry.map_err(|e| EngineError::io(&d, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                stack.push(path);
            } else if name != SEAL_FILE && !crate::data::files::is_temp_name(name) {
                out.push(path.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Checks the files a seal lists against it: `Err` says which file is missing or
/// changed, or that there is no readable seal.
pub fn check_seal(base: &Path, seal: &Path) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(seal)
        .map_err(|e| format!("it has no readable seal {}: {e}", seal.display()))?;
    let mut listed = 0;
    for line in text.lines() {
        let (hash, rel) = line
            .split_once("  ")
            .ok_or_else(|| format!("its seal {} is malformed", seal.display()))?;
        let path = base.join(rel);
        match sha256_of(&path) {
            Ok(h) if h == hash => listed += 1,
            Ok(_) => {
                return Err(format!(
                    "{} does not match its recorded SHA-256",
                    path.display()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    if listed == 0 {
        return Err(format!("its seal {} lists no files", seal.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn dir(vars: &[(&str, &str)]) -> PathBuf {
        let env: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        cache_dir_from(|name| env.get(name).cloned())
    }

    #[test]
    fn aisql_cache_dir_then_xdg_then_home_then_fallback() {
        let all = [
            ("AISQL_CACHE_DIR", "/a"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(dir(&all), PathBuf::from("/a"));
        assert_eq!(dir(&all[1..]), PathBuf::from("/x/aisql"));
        assert_eq!(dir(&all[2..]), PathBuf::from("/h/.cache/aisql"));
        assert_eq!(dir(&[]), PathBuf::from(FALLBACK_DIR));
        // Empty means unset; a relative XDG_CACHE_HOME is invalid and ignored.
        assert_eq!(
            dir(&[
                ("AISQL_CACHE_DIR", ""),
                ("XDG_CACHE_HOME", ""),
                ("HOME", "/h")
            ]),
            PathBuf::from("/h/.cache/aisql")
        );
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "rel/cache"), ("HOME", "/h")]),
            PathBuf::from("/h/.cache/aisql")
        );
        // AISQL_CACHE_DIR is taken as given, relative or not.
        assert_eq!(dir(&[("AISQL_CACHE_DIR", "c")]), PathBuf::from("c"));
    }

    #[test]
    fn a_sealed_entry_detects_a_changed_missing_or_unsealed_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a.bin"), b"alpha").unwrap();
        std::fs::write(d.join("sub/b.bin"), b"beta").unwrap();
        let seal_path = d.join(SEAL_FILE);
        assert!(
            check_seal(d, &seal_path)
                .unwrap_err()
                .contains("no readable seal")
        );
        let files = files_of(d).unwrap();
        assert_eq!(files, [PathBuf::from("a.bin"), PathBuf::from("sub/b.bin")]);
        seal(d, &files, &seal_path).unwrap();
        check_seal(d, &seal_path).unwrap();
        std::fs::write(d.join("sub/b.bin"), b"bets").unwrap();
        let e = check_seal(d, &seal_path).unwrap_err();
        assert!(e.contains("b.bin") && e.contains("SHA-256"), "{e}");
        std::fs::remove_file(d.join("sub/b.bin")).unwrap();
        assert!(check_seal(d, &seal_path).unwrap_err().contains("b.bin"));
    }
}
