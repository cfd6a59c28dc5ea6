//! Text for stdout and stderr written without panicking: each piece is
//! formatted first and written whole, in one `write_all` on the locked stream
//! (a line of progress JSON is one write, not one per byte), and a write that
//! fails is an error to return, never a panic as `println!`'s is.
//!
//! A reader that went away (a closed pipe, `aisql ... | head`) is remembered
//! ([`pipe_closed`]): the command line then ends quietly with the exit code of
//! a process that SIGPIPE ended (141), whichever write found it, including the
//! notes libraries write and drop the errors of.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout or stderr found its reader gone.
static PIPE_CLOSED: AtomicBool = AtomicBool::new(false);

/// The exit code of a command whose output's reader went away: 128 + SIGPIPE,
/// as a shell reports a process that signal ended.
pub const CLOSED_PIPE_EXIT: u8 = 141;

/// Whether a write to stdout or stderr has found its reader gone.
pub fn pipe_closed() -> bool {
    PIPE_CLOSED.load(Ordering::SeqCst)
}

/// Whether `err` (or an error it wraps) is a write to a reader that went away.
pub fn is_closed_pipe(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// `result`, its error noted when the write's reader went away.
fn noted<T>(result: std::io::Result<T>) -> std::io::Result<T> {
    if let Err(e) = &result
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        PIPE_CLOSED.store(true, Ordering::SeqCst);
    }
    result
}

/// `bytes` on stdout, whole, flushed.
pub fn out(bytes: &[u8]) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    noted(stdout.write_all(bytes).and_then(|()| stdout.flush()))
}

/// `bytes` on stderr, whole.
pub fn err(bytes: &[u8]) -> std::io::Result<()> {
    noted(std::io::stderr().lock().write_all(bytes))
}

/// `args` and a newline on stdout in one write (see [`outln!`](crate::outln)).
pub fn out_line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    out(line(args).as_bytes())
}

/// `args` and a newline on stderr in one write (see [`errln!`](crate::errln)).
pub fn err_line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    err(line(args).as_bytes())
}

/// stdout as a [`Write`] for writers that stream rows to it (through a
/// `BufWriter`), its reader going away noted as [`out`]'s is.
#[derive(Debug, Default)]
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        noted(std::io::stdout().write(bytes))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        noted(std::io::stdout().flush())
    }
}

fn line(args: std::fmt::Arguments<'_>) -> String {
    let mut text = std::fmt::format(args);
    text.push('\n');
    text
}

/// `println!` that returns the write's error instead of panicking on it.
#[macro_export]
macro_rules! outln {
    () => { $crate::console::out(b"\n") };
    ($($arg:tt)*) => { $crate::console::out_line(format_args!($($arg)*)) };
}

/// `eprintln!` that returns the write's error instead of panicking on it.
#[macro_export]
macro_rules! errln {
    () => { $crate::console::err(b"\n") };
    ($($arg:tt)*) => { $crate::console::err_line(format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_found_through_the_errors_that_wrap_it() {
        let closed = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let wrapped = anyhow_like(closed);
        assert!(is_closed_pipe(&*wrapped));
        let other = anyhow_like(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(!is_closed_pipe(&*other));
        assert!(!pipe_closed());
        assert!(noted::<()>(Err(std::io::ErrorKind::BrokenPipe.into())).is_err());
        assert!(pipe_closed());
    }

    /// An error whose source is `inner`, as a caller's context wraps one.
    fn anyhow_like(inner: std::io::Error) -> Box<dyn std::error::Error + 'static> {
        #[derive(Debug)]
        struct Context(std::io::Error);
        impl std::fmt::Display for Context {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("writing the rows")
            }
        }
        impl std::error::Error for Context {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        Box::new(Context(inner))
    }
}
