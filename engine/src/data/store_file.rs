//! Files of aisql's own stores (the answer cache, the KV store): opened only
//! when they are regular files inside their folder. Never through a symbolic
//! link (a log linked to a file elsewhere would be truncated and appended
//! to), never a FIFO or a device (which would block or never end); whatever
//! stands in a file's place is named in the error.

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::error::EngineError;

/// Why a store's file could not be opened.
#[derive(Debug)]
pub enum StoreFileError {
    /// Something other than a regular file is there (a link, a FIFO, a
    /// device): what it is, in words.
    NotRegular(String),
    /// The open itself failed.
    Io(std::io::Error),
}

impl StoreFileError {
    /// The error for `path`, a file of `store`: `(its name in errors, what
    /// it keeps)`, such as `("answer cache", "its answers")`.
    pub fn into_engine(self, path: &Path, store: (&str, &str)) -> EngineError {
        let (name, keeps) = store;
        match self {
            Self::NotRegular(what) => EngineError::Data(format!(
                "{name} {}: {what}; the {name} keeps {keeps} only in regular \
                 files inside its folder (remove it, and aisql makes a new one)",
                path.display()
            )),
            Self::Io(e) => EngineError::io(path, e),
        }
    }
}

/// The error for a store's `path`, whose own (unfollowed) metadata is
/// `meta`, when it is not `wanted`.
pub fn not_in_folder(path: &Path, meta: &std::fs::Metadata, wanted: &str) -> StoreFileError {
    StoreFileError::NotRegular(format!("{}, not {wanted}", file_kind(path, meta)))
}

/// What `path` (unfollowed metadata `meta`) is, in words.
fn file_kind(path: &Path, meta: &std::fs::Metadata) -> String {
    let t = meta.file_type();
    if t.is_symlink() {
        let target = std::fs::read_link(path)
            .map(|t| format!(" ({})", t.display()))
            .unwrap_or_default();
        return format!("a symbolic link{target}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)".into();
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device".into();
        }
        if t.is_socket() {
            return "a socket".into();
        }
    }
    if t.is_dir() {
        "a folder".into()
    } else if t.is_file() {
        "a regular file".into()
    } else {
        "a special file".into()
    }
}

/// `path`, a file of a store, opened with `options` only when it is a
/// regular file itself: never through a symbolic link (refused before the
/// open, and by `O_NOFOLLOW` in the open should one appear in between), and
/// never a FIFO or a device (the open does not block on a FIFO, and the open
/// file is checked again).
pub fn open_in_folder(
    path: &Path,
    options: &mut OpenOptions,
) -> std::result::Result<File, StoreFileError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(StoreFileError::NotRegular(format!(
                "{}, not a regular file",
                file_kind(path, &meta)
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreFileError::Io(e)),
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(options, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let file = options.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ELOOP) {
            return StoreFileError::NotRegular("a symbolic link, not a regular file".into());
        }
        StoreFileError::Io(e)
    })?;
    let meta = file.metadata().map_err(StoreFileError::Io)?;
    if !meta.is_file() {
        return Err(StoreFileError::NotRegular(format!(
            "{}, not a regular file",
            file_kind(path, &meta)
        )));
    }
    Ok(file)
}

/// `dir`, a folder of a store, made when missing; a link or anything else in
/// its place is refused.
pub fn folder_in_store(dir: &Path) -> std::result::Result<(), StoreFileError> {
    std::fs::create_dir_all(dir).map_err(StoreFileError::Io)?;
    let meta = std::fs::symlink_metadata(dir).map_err(StoreFileError::Io)?;
    if !meta.is_dir() {
        return Err(not_in_folder(dir, &meta, "a folder"));
    }
    Ok(())
}
