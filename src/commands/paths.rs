//! Where commands may write: never inside what they read. An output folder inside
//! the data root (or the `--tables` folder), or a comparison written into one of the
//! runs it compares, is refused before anything is written.

use std::path::{Component, Path, PathBuf};

use anyhow::bail;

/// `path` made absolute and free of `.`/`..` and symbolic links, as far as it exists
/// (an output folder usually does not exist yet).
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = existing.canonicalize().unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    // Lexically drop what `absolute` leaves of `.` and `..` in the missing part.
    let mut clean = PathBuf::new();
    for c in out.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                clean.pop();
            }
            other => clean.push(other),
        }
    }
    clean
}

/// Refuses an output (`flag` names it) that is, or is inside, the input `input`
/// (`what` names it).
pub fn ensure_outside(output: &Path, flag: &str, input: &Path, what: &str) -> anyhow::Result<()> {
    let (out, inp) = (resolved(output), resolved(input));
    if out.starts_with(&inp) {
        bail!(
            "{flag} {} is inside {what} {}: aisql does not write into its inputs; choose a folder outside it",
            output.display(),
            input.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_inside_inputs_are_refused_however_spelled() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("corpora")).unwrap();
        for inside in [
            root.clone(),
            root.join("run"),
            root.join("corpora/../run/new"),
            d.path().join("x/../root/run"),
        ] {
            assert!(
                ensure_outside(&inside, "--output-dir", &root, "the data root").is_err(),
                "{}",
                inside.display()
            );
        }
        for outside in [
            d.path().join("run"),
            d.path().join("root-2"),
            root.join("../run"),
        ] {
            ensure_outside(&outside, "--output-dir", &root, "the data root").unwrap();
        }
        let e = ensure_outside(&root.join("out"), "--output-dir", &root, "the data root")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--output-dir") && e.contains("the data root"),
            "{e}"
        );
    }
}
