//! Embeds the QUAIL-B plan folder (`quailb/plans/`, see `quailb/NOTICE.md`) in the
//! crate: writes `$OUT_DIR/embedded_plans.rs`, a table of every file's path relative
//! to that folder and its bytes (`include_bytes!`), which `src/plans.rs` includes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("quailb").join("plans");
    // A directory here makes cargo rerun this script when any file under it changes.
    println!("cargo:rerun-if-changed={}", root.display());
    let mut paths = Vec::new();
    files(&root, &mut paths);
    let mut table = String::from(
        "/// Every file of `bench/quailb/plans/`: path relative to it (`/`-separated), bytes.\n\
         pub(crate) const EMBEDDED: &[(&str, &[u8])] = &[\n",
    );
    for path in &paths {
        let rel = path.strip_prefix(&root).expect("under the root");
        let name: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        writeln!(
            table,
            "    ({:?}, include_bytes!({:?})),",
            name.join("/"),
            path.display().to_string()
        )
        .expect("writing to a String");
    }
    table.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("embedded_plans.rs"), table).expect("writing embedded_plans.rs");
}
