//! Model files are read only when they are regular files. A FIFO blocks an
//! open until someone writes to it (forever, in a batch job), a device such as
//! `/dev/zero` reads as an endless stream (or maps as an empty file), a socket
//! not at all. Each is refused by name before it is opened, whether named
//! directly or through a symbolic link. The engine's input files
//! (`aisql_engine::data::input_file`) go through the same check.

use std::io;
use std::path::Path;

/// The metadata of `path` when it is, or links to, a regular file; otherwise an
/// error saying what it is instead (the path itself is left to the caller to
/// name, as with any I/O error).
pub fn check(path: &Path) -> io::Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        return Ok(meta);
    }
    Err(not_regular(path, &meta))
}

/// Whether a regular file is at `path`: `false` when nothing is there (or a
/// link to nothing), an error ([`check`]'s) when something other than a
/// regular file is.
pub fn present(path: &Path) -> io::Result<bool> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(true),
        Ok(meta) => Err(not_regular(path, &meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `path` opened for reading, a regular file ([`check`]), checked again on the
/// open handle so that a file swapped between the check and the open is
/// refused too.
pub fn open(path: &Path) -> io::Result<std::fs::File> {
    check(path)?;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    Ok(file)
}

/// The error for `path`, whose (followed) metadata is `meta`, not a regular file.
fn not_regular(path: &Path, meta: &std::fs::Metadata) -> io::Error {
    let what = kind(&meta.file_type());
    let link = std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.file_type().is_symlink())
        .then(|| std::fs::read_link(path).ok())
        .flatten();
    let message = match link {
        Some(target) => format!(
            "a symbolic link to {what} ({}), not a regular file; aisql reads only regular files",
            target.display()
        ),
        None => format!("{what}, not a regular file; aisql reads only regular files"),
    };
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// What a file that is not a regular file is, in words.
fn kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a folder"
    } else {
        "a special file"
    }
}
