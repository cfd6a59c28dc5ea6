//! aisql's cache folder: the one rule for where generated and downloaded files live.
//!
//! Everything aisql caches hangs off [`cache_dir`]: the QUAIL-B data (`quailb/`,
//! `quailb-standin/`, in the bench crate) and the tiny model
//! (`models/tiny-qwen3-seed0`, [`crate::scheduler::tiny_model_dir`]). One function, so
//! that `AISQL_CACHE_DIR` or `XDG_CACHE_HOME` moves all of them together.

use std::ffi::OsString;
use std::path::PathBuf;

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
}
