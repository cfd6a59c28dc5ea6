//! Input files are read only when they are regular files. A FIFO blocks a read
//! until someone writes to it (forever, in a batch job), a device such as
//! `/dev/zero` or `/dev/urandom` reads as an endless stream (or, to a reader
//! that asks its size first, as an empty file), a socket not at all. Each is
//! refused by name before it is opened, whether named directly or through a
//! symbolic link.

use std::io;
use std::path::Path;

/// The metadata of `path` when it is, or links to, a regular file; otherwise an
/// error saying what it is instead (the path itself is left to the caller to
/// name, as with any I/O error). The models crate's check, shared so that model
/// files and tables are refused in the same words.
pub fn regular_file(path: &Path) -> io::Result<std::fs::Metadata> {
    aisql_models::regular_file::check(path)
}

/// The bytes of `path`, a regular file ([`regular_file`]).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    regular_file(path)?;
    std::fs::read(path)
}

/// The text of `path`, a regular file ([`regular_file`]).
pub fn read_to_string(path: &Path) -> io::Result<String> {
    regular_file(path)?;
    std::fs::read_to_string(path)
}

/// `path` opened for reading, a regular file ([`regular_file`]), checked again
/// on the open handle.
pub fn open(path: &Path) -> io::Result<std::fs::File> {
    aisql_models::regular_file::open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_and_a_link_to_one_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.txt");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "x");
        #[cfg(unix)]
        {
            let link = dir.path().join("link.txt");
            std::os::unix::fs::symlink(&file, &link).unwrap();
            assert_eq!(read(&link).unwrap(), b"x");
        }
    }

    #[test]
    fn a_folder_is_refused_saying_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.starts_with("a folder, not a regular file"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn devices_fifos_and_links_to_them_are_refused_before_opening() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.csv");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening the FIFO would block this test forever: the check comes first.
        let e = open(&fifo).unwrap_err().to_string();
        assert!(
            e.starts_with("a FIFO (named pipe), not a regular file"),
            "{e}"
        );

        let e = read(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(e.starts_with("a character device"), "{e}");

        let link = dir.path().join("zero.csv");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_to_string(&link).unwrap_err().to_string();
        assert!(
            e.starts_with("a symbolic link to a character device (/dev/zero)"),
            "{e}"
        );
    }
}
