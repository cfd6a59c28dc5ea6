//! The secrets that guard `aisql serve` and `aisql worker` on loopback when
//! none is given: one random secret per kind and user, made once in aisql's
//! cache folder in a file only its owner may read (as notebook servers keep
//! their token), so that the owner's clients and scripts find it and the
//! machine's other users cannot.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Where the secret `name` lives: `serve.password`, `worker.token`.
pub fn path(name: &str) -> PathBuf {
    aisql_engine::data::cache_dir::cache_dir().join(name)
}

/// The secret `name`, made now if there is none yet, with its file.
pub fn get_or_make(name: &str) -> anyhow::Result<(String, PathBuf)> {
    let file = path(name);
    if let Some(secret) = read(&file)? {
        return Ok((secret, file));
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for {name}: {e}"))?;
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // Written whole under a name of its own, then linked into place: a
    // process starting beside this one reads all of it or none.
    let draft = dir.join(format!(".{name}.{}", std::process::id()));
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options
            .open(&draft)
            .with_context(|| format!("creating {}", draft.display()))?;
        out.write_all(secret.as_bytes())?;
        out.write_all(b"\n")?;
    }
    let linked = std::fs::hard_link(&draft, &file);
    let _ = std::fs::remove_file(&draft);
    match linked {
        Ok(()) => Ok((secret, file)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read(&file)? {
            Some(secret) => Ok((secret, file)),
            None => bail!("{}: empty", file.display()),
        },
        Err(e) => Err(e).with_context(|| format!("creating {}", file.display())),
    }
}

/// The secret in `file`, if there is one; a file others may read or write
/// is refused (its secret may be known), as is one that is not a regular
/// file.
pub fn read(file: &Path) -> anyhow::Result<Option<String>> {
    let meta = match std::fs::symlink_metadata(file) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    if !meta.is_file() {
        bail!("{}: not a regular file; remove it", file.display());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: getuid has no preconditions and cannot fail.
        let me = unsafe { libc::getuid() };
        if meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
            bail!(
                "{}: readable or writable by others than its owner; remove it (a new one is \
                 made at the next start)",
                file.display()
            );
        }
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let secret = text.trim();
    Ok((!secret.is_empty()).then(|| secret.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.password");
        assert_eq!(read(&file).unwrap(), None);
        std::fs::write(&file, "abc\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&file).unwrap().as_deref(), Some("abc"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read(&file).unwrap_err().to_string();
        assert!(err.contains("others"), "{err}");
    }
}
