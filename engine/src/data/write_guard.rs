//! The one rule for every file aisql writes: never over, or inside, what the
//! command reads. A command lists its inputs (table files, the SQL file, the
//! plan file, the data root, the `--tables` folder, the model folder) in a
//! [`WriteGuard`], and every output it is told to write (`--output`,
//! `--output-dir`, `--to-substrait`, `--answer-cache`, `bench compare --json`,
//! a run folder, a SQL `COPY ... TO` target) is checked against them before
//! anything is written. Paths are compared resolved: absolute, symbolic links
//! followed as far as the path exists, `.` and `..` removed, so no spelling of
//! an input gets past the rule.

use std::path::{Component, Path, PathBuf};

use crate::error::{EngineError, Result};

/// What a command reads, and the check of what it writes against it.
#[derive(Debug, Clone, Default)]
pub struct WriteGuard {
    /// Each input: its resolved path, its path as given, and what it is
    /// (`the --table file reviews`), for the error.
    inputs: Vec<(PathBuf, PathBuf, String)>,
}

/// How an output is written: a file, or a folder that files are written into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// One file (`--output`, `--to-substrait`, `--json`).
    File,
    /// A folder whose files aisql names (`--output-dir`, a run folder, the answer
    /// cache, a `COPY` target): an input inside it could be overwritten too.
    Folder,
}

impl WriteGuard {
    /// A guard with no inputs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an input, `what` naming it in errors.
    pub fn add(&mut self, path: &Path, what: impl Into<String>) -> &mut Self {
        self.inputs
            .push((resolved(path), path.to_path_buf(), what.into()));
        self
    }

    /// The inputs, as given, with what they are.
    pub fn inputs(&self) -> impl Iterator<Item = (&Path, &str)> {
        self.inputs
            .iter()
            .map(|(_, p, w)| (p.as_path(), w.as_str()))
    }

    /// Refuses `output` (`flag` names it) when it is, or is inside, an input; a
    /// [`OutputKind::Folder`] is refused also when an input is inside it.
    pub fn check(&self, output: &Path, flag: &str, kind: OutputKind) -> Result<()> {
        let out = resolved(output);
        for (input, given, what) in &self.inputs {
            let refused = if out.starts_with(input) {
                Some(if &out == input { "is" } else { "is inside" })
            } else if kind == OutputKind::Folder && input.starts_with(&out) {
                Some("holds")
            } else {
                None
            };
            if let Some(relation) = refused {
                return Err(EngineError::WriteRefused(format!(
                    "{flag} {} {relation} {what} {}: aisql never writes over or into what it reads; choose a path outside it",
                    output.display(),
                    given.display()
                )));
            }
        }
        Ok(())
    }
}

/// `path` made absolute and free of `.`, `..` and symbolic links, as far as it
/// exists (an output usually does not exist yet; its missing part is cleaned
/// lexically).
pub fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.clone();
    let mut rest = Vec::new();
    while existing.symlink_metadata().is_err() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    // A dangling link resolves to nothing: follow it by hand to its target.
    let mut out = existing
        .canonicalize()
        .unwrap_or_else(|_| match std::fs::read_link(&existing) {
            Ok(target) => match existing.parent() {
                Some(parent) if target.is_relative() => resolved(&parent.join(target)),
                _ => resolved(&target),
            },
            Err(_) => existing.clone(),
        });
    for name in rest.into_iter().rev() {
        out.push(name);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(inputs: &[(&Path, &str)]) -> WriteGuard {
        let mut g = WriteGuard::new();
        for (p, w) in inputs {
            g.add(p, *w);
        }
        g
    }

    #[test]
    fn outputs_over_or_inside_inputs_are_refused_however_spelled() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("corpora")).unwrap();
        let table = d.path().join("t.csv");
        std::fs::write(&table, "a\n1\n").unwrap();
        let g = guard(&[(&root, "the data root"), (&table, "the --table file t")]);
        for inside in [
            root.clone(),
            root.join("run"),
            root.join("corpora/../run/new"),
            d.path().join("x/../root/run"),
            table.clone(),
            d.path().join("./t.csv"),
        ] {
            for kind in [OutputKind::File, OutputKind::Folder] {
                let e = g.check(&inside, "--output", kind).unwrap_err().to_string();
                assert!(e.contains("--output") && e.contains("never writes"), "{e}");
            }
        }
        for outside in [
            d.path().join("run"),
            d.path().join("root-2"),
            root.join("../run"),
            d.path().join("t.csv.out"),
        ] {
            g.check(&outside, "--output-dir", OutputKind::Folder)
                .unwrap();
        }
        // A folder that holds an input is refused as a folder, not as a file name.
        let e = g
            .check(d.path(), "--output-dir", OutputKind::Folder)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn links_to_inputs_are_followed_even_dangling_ones() {
        let d = tempfile::tempdir().unwrap();
        let table = d.path().join("t.parquet");
        std::fs::write(&table, b"x").unwrap();
        let link = d.path().join("out.parquet");
        std::os::unix::fs::symlink(&table, &link).unwrap();
        let g = guard(&[(&table, "the --table file t")]);
        let e = g.check(&link, "--output", OutputKind::File).unwrap_err();
        assert!(e.to_string().contains("is the --table file t"), "{e}");
        // A link to a not-yet-existing file inside an input folder.
        let folder = d.path().join("in");
        std::fs::create_dir(&folder).unwrap();
        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink(folder.join("new.csv"), &dangling).unwrap();
        let g = guard(&[(&folder, "the --tables folder")]);
        assert!(g.check(&dangling, "--output", OutputKind::File).is_err());
        assert_eq!(std::fs::read(&table).unwrap(), b"x");
    }
}
