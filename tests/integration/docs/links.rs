//! Every relative link in the README, the changelog and `docs/` points at a file that exists
//! and, with `#anchor`, at a heading it has.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo::repo;

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo("README.md"), repo("CHANGELOG.md")];
    for entry in std::fs::read_dir(repo("docs")).expect("docs/ reads") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// GitHub's anchors: the heading in lower case, spaces as `-`, punctuation dropped.
fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).unwrap_or_default();
    let mut in_code = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let Some(heading) = line.trim_start_matches('#').strip_prefix(' ').filter(|_| line.starts_with('#')) else {
            continue;
        };
        if in_code {
            continue;
        }
        let anchor: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        found.insert(anchor);
    }
    found
}

/// The `](target)` links of a page, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_string());
            }
        }
    }
    found
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page reads");
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.contains(' ') {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() { page.clone() } else { page.parent().expect("a folder").join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
            } else if !anchor.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&target).contains(anchor)
            {
                broken.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
