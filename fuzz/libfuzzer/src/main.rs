//! libFuzzer entry point: one binary for every target, chosen by
//! `AISQL_FUZZ_TARGET` (`substrait`, `parquet`, ...). The fixture is built once
//! per process; each input goes to [`aisql_fuzz::Fixture::run`], and a broken
//! promise panics, which aborts, so that libFuzzer saves the input.

#![no_main]

use std::sync::OnceLock;

use aisql_fuzz::{Fixture, Target};
use libfuzzer_sys::fuzz_target;

struct Fuzzing {
    fixture: Fixture,
    target: Target,
}

// The fixture holds a current-thread Tokio runtime and temporary folders; libFuzzer
// calls the target from one thread only.
unsafe impl Sync for Fuzzing {}
unsafe impl Send for Fuzzing {}

fn fuzzing() -> &'static Fuzzing {
    static FUZZING: OnceLock<Fuzzing> = OnceLock::new();
    FUZZING.get_or_init(|| {
        let name = std::env::var("AISQL_FUZZ_TARGET").unwrap_or_default();
        let target = Target::from_name(&name)
            .unwrap_or_else(|| panic!("AISQL_FUZZ_TARGET={name:?} names no fuzz target"));
        let fixture = Fixture::new().unwrap_or_else(|e| panic!("fixture: {e}"));
        // libfuzzer-sys aborts in its panic hook, before unwinding: that would turn
        // panics aisql catches on purpose (the parquet crate's, inside its guarded
        // reads) into crashes. A panic that reaches the target still aborts: the
        // fuzz_target! wrapper catches it and calls abort itself.
        std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
        Fuzzing { fixture, target }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fuzzing();
    if let Err(broken) = f.fixture.run(f.target, data) {
        panic!("broken promise: {broken}");
    }
});
