//! Panics of dependencies turned into errors without a word on stderr.
//!
//! DataFusion's consumer and operators, the Parquet reader and the thread
//! pools panic on some inputs our checks let through; aisql catches those
//! panics at the consumption and execution boundaries and reports each once,
//! as an error naming the plan or statement. Rust's default hook would print
//! `thread '…' panicked at …` first, so [`install`] replaces it with one that
//! records the panic's place for the error to name ([`describe`]) and prints
//! only when `RUST_BACKTRACE` asks for the trace.

use std::any::Any;
use std::sync::Mutex;

/// Where the latest panic happened (`file:line:column`).
static LAST_PLACE: Mutex<Option<String>> = Mutex::new(None);

/// Replaces the process's panic hook: panics are recorded, not printed, unless
/// `RUST_BACKTRACE` is set (other than `0`), when the default hook prints them
/// with their backtrace as well.
pub fn install() {
    let default = std::panic::take_hook();
    let verbose = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    std::panic::set_hook(Box::new(move |info| {
        if let Some(place) = info.location() {
            let place = format!("{}:{}:{}", place.file(), place.line(), place.column());
            *LAST_PLACE.lock().unwrap_or_else(|e| e.into_inner()) = Some(place);
        }
        if verbose {
            default(info);
        }
    }));
}

/// The message of a caught panic, with the place it happened when the hook
/// recorded one: `index out of bounds: … (at …/dfschema.rs:1065:9)`.
pub fn describe(panic: &(dyn Any + Send)) -> String {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("no message");
    match LAST_PLACE.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(place) => format!("{message} (at {place})"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_described_with_its_message_and_place() {
        install();
        let caught = std::panic::catch_unwind(|| {
            let v: Vec<u8> = Vec::new();
            v[usize::from(v.is_empty())]
        })
        .unwrap_err();
        let text = describe(caught.as_ref());
        assert!(text.contains("index out of bounds"), "{text}");
        assert!(text.contains("panic_hook.rs:"), "{text}");
        let caught = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert!(describe(caught.as_ref()).starts_with("no message"));
    }
}
