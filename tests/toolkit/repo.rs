//! Where the repository's files are, for every suite: the toolkit's (e2e, node) and the
//! support's (integration, nginx, hostile) include this one file.

use std::path::{Path, PathBuf};

/// `path` in the repository (its root for `""`).
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The text of the repository's file `path`.
pub fn repo_file(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}
