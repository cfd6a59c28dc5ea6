//! Long-running `aisql` processes a test talks to (`aisql worker`, `aisql serve`):
//! started on a port the system picks, found by the `listening on ADDRESS` line
//! they print first, and stopped with the test.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Spawns `command` with its stdout piped and waits for its first line, which
/// must be `listening on ADDRESS ...`: (the process, that line, ADDRESS).
pub fn spawn_listening(command: &mut Command) -> (Child, String, String) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("did not start: no listening line, got {line:?}"))
        .to_string();
    (child, line, addr)
}

/// Kills `child` and reaps it, whether or not it is still running.
pub fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
