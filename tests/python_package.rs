//! The Python package (`python/`): its wheel built with maturin, installed
//! apart from the test environment, and its pytest suite (`python/tests/`) run
//! against this build's `aisql` binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The target folder this test binary was built in (`<target>/debug/deps/…`):
/// the wheel is built there too, so it reuses this build's artifacts.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary lies in <target>/<profile>/deps")
        .to_path_buf()
}

/// Runs `cmd`, failing the test with its output unless it succeeds.
fn check(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_python_package_passes_its_tests() {
    let python = common::test_python(
        "maturin, pytest, pandas, pyarrow",
        "maturin, pytest, pandas and pyarrow",
    );
    let bin = python.parent().expect("the venv's bin folder");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let wheels = tmp.path().join("wheels");

    let started = Instant::now();
    let mut maturin = Command::new(bin.join("maturin"));
    // The nested cargo gets none of the variables cargo set for this test
    // (CARGO_PKG_*, CARGO_MANIFEST_*, ...), only its home and target folder.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CARGO_") && key != "CARGO_HOME" {
            maturin.env_remove(key);
        }
    }
    check(
        maturin
            .args(["build", "--profile", "dev", "--manifest-path"])
            .arg(repo.join("python/Cargo.toml"))
            .arg("--interpreter")
            .arg(&python)
            .arg("--out")
            .arg(&wheels)
            .env("CARGO_TARGET_DIR", target_dir()),
        "maturin build",
    );
    eprintln!("wheel built in {:.1}s", started.elapsed().as_secs_f64());
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("maturin wrote no wheel");

    // Installed into a folder of its own: the shared environment stays as it was.
    let site = tmp.path().join("site");
    check(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&site)
            .arg(&wheel),
        "pip install",
    );
    check(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(repo.join("python/tests"))
            .env("PYTHONPATH", &site)
            .env("AISQL_BIN", env!("CARGO_BIN_EXE_aisql"))
            .env("AISQL_CACHE_DIR", tmp.path().join("cache"))
            .current_dir(tmp.path()),
        "pytest python/tests",
    );
}
