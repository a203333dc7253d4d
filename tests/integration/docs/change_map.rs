//! `docs/development.md`'s map of where a change travels names real places: every file it links
//! exists and defines the function or type named beside it.

use crate::support::repo::{repo, repo_file};

/// The section of `text` under the heading `title`, up to the next heading of its level.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text.find(&format!("\n## {title}\n")).unwrap_or_else(|| panic!("a section `{title}`"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |at| at + 3);
    &rest[..end]
}

/// Each step's `(file, name)`: a link to a file under `src/`, then the name in backticks.
fn steps(map: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    for (at, _) in map.match_indices("[`src/") {
        let rest = &map[at + 2..];
        let Some((file, rest)) = rest.split_once("`](") else { continue };
        let Some((_, rest)) = rest.split_once(") `") else { continue };
        let Some((name, _)) = rest.split_once('`') else { continue };
        found.push((file, name));
    }
    found
}

/// Whether `code` defines `name` as a function, a type, a constant or a field.
fn defines(code: &str, name: &str) -> bool {
    ["fn", "struct", "enum", "type", "trait", "const"].iter().any(|kind| code.contains(&format!("{kind} {name}")))
        || code.contains(&format!("pub {name}:"))
}

#[test]
fn every_step_of_the_change_map_names_a_file_and_what_it_defines() {
    let page = repo_file("docs/development.md");
    let map = section(&page, "Where a change travels");
    let steps = steps(map);
    assert!(steps.len() >= 20, "the weight's, the pod's and the port's ways: {steps:?}");
    for (file, name) in steps {
        let code = std::fs::read_to_string(repo(file)).unwrap_or_else(|e| panic!("{file} is named by the map: {e}"));
        assert!(defines(&code, name), "{file} defines no `{name}`, which the map names");
    }
}

#[test]
fn a_step_that_names_a_gone_function_is_caught() {
    let map = "1. [`src/proxy/model.rs`](../src/proxy/model.rs) `pod_weights`: shared.\n\
               2. [`src/proxy/model.rs`](../src/proxy/model.rs) `no_such_function`: gone.\n";
    let code = repo_file("src/proxy/model.rs");
    let steps = steps(map);
    assert_eq!(steps, [("src/proxy/model.rs", "pod_weights"), ("src/proxy/model.rs", "no_such_function")]);
    assert!(defines(&code, "pod_weights"));
    assert!(!defines(&code, "no_such_function"));
}
