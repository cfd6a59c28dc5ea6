//! `aisql-fuzz TARGET SECONDS [--seed N] [--artifacts DIR]`: fuzzes one target
//! (or `all`, splitting the time); `aisql-fuzz TARGET replay FILE...` runs saved
//! inputs; `aisql-fuzz TARGET seeds DIR` writes the target's seeds as files. Exit 0: no finding; 1: findings (inputs
//! saved); 2: bad usage; 3: an input hung (saved by the watchdog).

use std::path::PathBuf;
use std::time::Duration;

use aisql_fuzz::alloc::{FUZZ_ALLOC, MeteredAlloc};
use aisql_fuzz::{Fixture, Target, fuzz};

#[global_allocator]
static ALLOC: MeteredAlloc = FUZZ_ALLOC;

/// Longest an input may run before it counts as a hang.
const HANG_LIMIT: Duration = Duration::from_secs(10);

fn usage(problem: &str) -> ! {
    let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
    eprintln!(
        "aisql-fuzz: {problem}\nusage: aisql-fuzz TARGET SECONDS [--seed N] [--artifacts DIR]\n       aisql-fuzz TARGET replay FILE...\n       aisql-fuzz TARGET seeds DIR\n\
         targets: {} or all",
        names.join(", ")
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, seconds, rest @ ..] = args.as_slice() else {
        usage("TARGET and SECONDS are required")
    };
    if seconds == "seeds" {
        // The seeds as files, for libFuzzer's corpus folder.
        let t =
            Target::from_name(target).unwrap_or_else(|| usage(&format!("no target {target:?}")));
        let [dir] = rest else {
            usage("seeds takes one folder")
        };
        let fixture = Fixture::new().unwrap_or_else(|e| {
            eprintln!("aisql-fuzz: cannot build the fixture: {e}");
            std::process::exit(1)
        });
        let written = fixture.seeds(t).and_then(|seeds| {
            std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
            for (i, seed) in seeds.iter().enumerate() {
                let path = PathBuf::from(dir).join(format!("seed-{i:04}"));
                std::fs::write(&path, seed).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Ok(seeds.len())
        });
        match written {
            Ok(n) => println!("{n} seeds written to {dir}"),
            Err(e) => {
                eprintln!("aisql-fuzz: {e}");
                std::process::exit(1)
            }
        }
        return;
    }
    if seconds == "replay" {
        let t =
            Target::from_name(target).unwrap_or_else(|| usage(&format!("no target {target:?}")));
        let fixture = Fixture::new().unwrap_or_else(|e| {
            eprintln!("aisql-fuzz: cannot build the fixture: {e}");
            std::process::exit(1)
        });
        let files: Vec<PathBuf> = rest.iter().map(PathBuf::from).collect();
        match aisql_fuzz::driver::replay(&fixture, t, &files) {
            Ok(n) => println!("{n} inputs replayed, no finding"),
            Err(e) => {
                eprintln!("aisql-fuzz: {e}");
                std::process::exit(1)
            }
        }
        return;
    }
    let targets: Vec<Target> = match target.as_str() {
        "all" => Target::ALL.to_vec(),
        name => {
            vec![Target::from_name(name).unwrap_or_else(|| usage(&format!("no target {name:?}")))]
        }
    };
    let seconds: f64 = match seconds.parse() {
        Ok(s) if s >= 0.0 && f64::is_finite(s) => s,
        _ => usage(&format!("SECONDS must be a number ≥ 0, got {seconds:?}")),
    };
    let mut seed = 1u64;
    let mut artifacts = PathBuf::from("fuzz/artifacts");
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--seed" => {
                seed = value
                    .parse()
                    .unwrap_or_else(|_| usage("--seed takes a number"))
            }
            "--artifacts" => artifacts = PathBuf::from(value),
            other => usage(&format!("unknown option {other}")),
        }
    }
    let fixture = Fixture::new().unwrap_or_else(|e| {
        eprintln!("aisql-fuzz: cannot build the fixture: {e}");
        std::process::exit(1)
    });
    let each = Duration::from_secs_f64(seconds / targets.len() as f64);
    let mut found = 0;
    for t in targets {
        match fuzz(&fixture, t, each, seed, &artifacts, HANG_LIMIT) {
            Ok(report) => {
                println!("{report}");
                found += report.findings.len();
            }
            Err(e) => {
                eprintln!("aisql-fuzz: {}: {e}", t.name());
                std::process::exit(1)
            }
        }
    }
    std::process::exit(if found == 0 { 0 } else { 1 })
}
