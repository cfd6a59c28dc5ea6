//! A few seconds of every fuzz target, and every saved regression input replayed:
//! part of `cargo test`, so a front-end change that panics on a known input, or on
//! what a short run finds, fails the suite. Long runs: `scripts/fuzz.sh`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aisql_fuzz::alloc::{FUZZ_ALLOC, MeteredAlloc, REFUSE_OVER};
use aisql_fuzz::driver::replay;
use aisql_fuzz::{Fixture, Target, fuzz};

#[global_allocator]
static ALLOC: MeteredAlloc = FUZZ_ALLOC;

fn regressions(target: Target) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target.name());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn every_target_survives_its_seeds_its_regressions_and_a_short_run() {
    let fixture = Fixture::new().unwrap();
    let artifacts = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    for target in Target::ALL {
        replay(&fixture, target, &regressions(target)).unwrap();
        let report = fuzz(
            &fixture,
            target,
            Duration::from_secs(2),
            42,
            artifacts.path(),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(report.executions > report.corpus.min(1) as u64, "{report}");
        assert!(
            report.findings.is_empty(),
            "{report}\n{:#?}",
            report.findings
        );
        assert!(report.largest_allocation <= REFUSE_OVER, "{report}");
        lines.push(report.to_string());
    }
    eprintln!("{}", lines.join("\n"));
}
