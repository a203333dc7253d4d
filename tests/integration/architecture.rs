//! The layering of `src/`: each top-level module imports only the layers below it, so there
//! is no import cycle, and the runtime layer knows nothing of Balancers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo::repo;

/// The layers, lowest first, each with what it may import (all of it listed earlier).
const LAYERS: &[(&str, &[&str])] = &[
    ("util", &[]),
    ("deploy", &[]),
    ("runtime", &["util", "deploy"]),
    ("api", &["util", "deploy"]),
    ("spec", &["util", "deploy", "api"]),
    ("proxy", &["util", "deploy", "api", "spec"]),
    ("canary", &["util", "deploy", "api", "spec", "proxy"]),
    ("gateway", &["util", "deploy", "runtime", "api", "spec", "proxy"]),
    ("exporter", &["util", "deploy", "runtime", "api", "spec", "proxy"]),
    ("webhook", &["util", "deploy", "runtime", "api", "spec"]),
    ("controller", &["util", "deploy", "runtime", "api", "spec", "proxy", "canary", "gateway"]),
    ("manager", &["util", "deploy", "runtime", "api", "canary", "gateway", "spec", "proxy", "webhook", "controller"]),
    (
        "cli",
        &[
            "util",
            "deploy",
            "runtime",
            "api",
            "gateway",
            "spec",
            "proxy",
            "canary",
            "exporter",
            "webhook",
            "controller",
            "manager",
        ],
    ),
];

fn src() -> PathBuf {
    repo("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None` for the crate roots).
fn layer_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src()).expect("under src/");
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The code of a file without its comments and tests, which may reach anywhere: each item under
/// `#[cfg(test)]` (a test module, or a helper only tests call, anywhere in the file) is left
/// out, and only that item: the production code after it is read.
fn code(text: &str) -> String {
    let text: String =
        text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let mut code = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        code.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        rest = &item[item_end(item)..];
    }
    code.push_str(rest);
    code
}

/// Where the item at the start of `text` ends: after its `;`, or after the brace that closes
/// its first `{`; string and character literals are skipped, so a brace inside one does not
/// count.
fn item_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut i) = (0usize, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\''), not a lifetime ('a).
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => i += 3,
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    text.len()
}

/// The top-level modules a file's code names through `crate::`, braced groups included.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(top_level_items(group).into_iter().filter_map(first_ident));
        } else {
            found.extend(first_ident(rest));
        }
    }
    found
}

/// The comma-separated items of a braced use group (`text` starts after its `{`), nested
/// groups kept inside their item.
fn top_level_items(text: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&text[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

fn first_ident(text: &str) -> Option<String> {
    let ident: String = text.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    (!ident.is_empty()).then_some(ident)
}

#[test]
fn every_layer_imports_only_the_layers_below_it() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let Some(layer) = layer_of(file) else { continue };
        let Some((_, allowed)) = LAYERS.iter().find(|(name, _)| *name == layer) else {
            violations.push(format!("{}: module {layer} is in no layer of LAYERS", file.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file reads");
        if code(&text).contains("super::super") {
            violations.push(format!("{}: reaches up two modules; name it from the crate root", file.display()));
        }
        for import in imports(&code(&text)) {
            if import != layer && !allowed.contains(&import.as_str()) {
                violations.push(format!("{}: {layer} imports {import}", file.display()));
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layering:\n{}", violations.join("\n"));
}

#[test]
fn the_layers_are_ordered_so_no_cycle_is_possible() {
    for (i, (layer, allowed)) in LAYERS.iter().enumerate() {
        for import in *allowed {
            let lower = LAYERS[..i].iter().any(|(name, _)| name == import);
            assert!(lower, "{layer} may import {import}, which is not a lower layer");
        }
    }
}

#[test]
fn the_import_reader_sees_plain_braced_and_nested_paths() {
    let code = "use crate::api::Balancer;\nuse crate::{spec::{a, b}, util::echo};\nlet x = crate::proxy::labels();";
    let found: Vec<String> = imports(code).into_iter().collect();
    assert_eq!(found, ["api", "proxy", "spec", "util"]);
}

/// A file's module path: `src/controller/status.rs` is `controller::status`, a `mod.rs` is its
/// folder's module, and the crate roots are the crate.
fn module_of(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src()).expect("under src/").with_extension("");
    let mut path: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        path.pop();
    }
    path
}

/// The statements of `code`, split at `;` outside braces.
fn statements(code: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in code.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ';' if depth <= 0 => {
                out.push(code[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(code[start..].trim());
    out
}

/// Whether a statement only re-exports (`pub use …`), which makes no dependency of its own.
fn is_reexport(statement: &str) -> bool {
    let rest = statement.strip_prefix("pub").map(str::trim_start);
    let rest = rest.map(|r| r.strip_prefix("(crate)").or(r.strip_prefix("(super)")).unwrap_or(r).trim_start());
    rest.is_some_and(|r| r.starts_with("use "))
}

/// Every path `text` (after a `use` or a path prefix) names, braced groups expanded.
fn expand(prefix: &[String], text: &str, out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            for item in top_level_items(group) {
                expand(&path, item, out);
            }
            return;
        }
        let Some(ident) = first_ident(rest) else { break };
        rest = &rest[ident.len()..];
        if ident != "self" {
            path.push(ident);
        }
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    out.push(path);
}

/// Whether a statement re-exports from one of the file's own child modules, which makes no
/// dependency: the children are the module's contents.
fn reexports_a_child(statement: &str, children: &[String]) -> bool {
    let Some(path) = statement.split_once("use ").map(|(_, path)| path.trim_start()) else { return false };
    let path = path.strip_prefix("self::").unwrap_or(path);
    is_reexport(statement) && first_ident(path).is_some_and(|first| children.contains(&first))
}

/// The absolute paths a file's code names through `crate::`, `super::`, `self::` and its own
/// child modules, re-exports of its children left out.
fn named_paths(code: &str, module: &[String], children: &[String]) -> Vec<Vec<String>> {
    let parent = &module[..module.len().saturating_sub(1)];
    let mut out = Vec::new();
    for statement in statements(code).into_iter().filter(|s| !reexports_a_child(s, children)) {
        let mut at = 0;
        while at < statement.len() {
            let rest = &statement[at..];
            let boundary =
                statement[..at].chars().last().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            let ident = first_ident(rest).filter(|_| boundary && !rest.starts_with(char::is_whitespace));
            let base: Option<Vec<String>> = match ident.as_deref() {
                Some(word) if rest[word.len()..].starts_with("::") => match word {
                    "crate" => Some(Vec::new()),
                    "super" => Some(parent.to_vec()),
                    "self" => Some(module.to_vec()),
                    child if children.iter().any(|c| c == child) => Some(module.to_vec()),
                    _ => None,
                },
                _ => None,
            };
            match (base, ident) {
                (Some(base), Some(word)) => {
                    let skip = if matches!(word.as_str(), "crate" | "super" | "self") { word.len() + 2 } else { 0 };
                    expand(&base, &rest[skip..], &mut out);
                    at += word.len();
                }
                (None, Some(word)) if boundary => at += word.len(),
                _ => at += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
    }
    out
}

/// The child modules a file declares (`mod x;`, `pub mod x;`).
fn declared_children(code: &str) -> Vec<String> {
    statements(code)
        .into_iter()
        .filter_map(|s| s.split_whitespace().skip_while(|w| *w != "mod").nth(1).map(str::to_string))
        .filter(|name| !name.contains('{'))
        .collect()
}

/// Which child each item a module re-exports comes from: `pub use values::Protocol` in
/// `api/mod.rs` makes `crate::api::Protocol` a name for `api::values`.
fn reexports(code: &str, module: &[String], children: &[String]) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for statement in statements(code).into_iter().filter(|s| is_reexport(s)) {
        let Some(text) = statement.split_once("use ").map(|(_, t)| t) else { continue };
        let mut paths = Vec::new();
        expand(module, text, &mut paths);
        for path in paths {
            let child = path.get(module.len()).filter(|c| children.contains(c));
            if let (Some(child), Some(item)) = (child, path.last()) {
                let mut source = module.to_vec();
                source.push(child.clone());
                let mut name = module.to_vec();
                name.push(item.clone());
                out.push((name, source));
            }
        }
    }
    out
}

/// The items a file declares `pub` (at any visibility scope), by name.
fn public_items(code: &str) -> Vec<String> {
    let kinds = ["const", "static", "fn", "struct", "enum", "type", "trait", "mod"];
    statements(code)
        .into_iter()
        .flat_map(|s| s.lines())
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("pub")?;
            let rest = rest.strip_prefix("(crate)").or(rest.strip_prefix("(super)")).unwrap_or(rest);
            let mut words = rest.split_whitespace();
            let mut kind = words.next()?;
            if matches!(kind, "async" | "unsafe") {
                kind = words.next()?;
            }
            kinds.contains(&kind).then(|| words.next().and_then(first_ident)).flatten()
        })
        .collect()
}

/// `pub use child::*` in a module: each of the child's public items is a name for the child.
fn glob_reexports(sources: &[(Vec<String>, String, Vec<String>)]) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for (module, code, children) in sources {
        for statement in statements(code).into_iter().filter(|s| is_reexport(s) && s.ends_with("::*")) {
            let Some(child) = children.iter().find(|c| statement.ends_with(&format!(" {c}::*"))) else { continue };
            let source: Vec<String> = module.iter().chain([child]).cloned().collect();
            let Some((_, child_code, _)) = sources.iter().find(|(m, ..)| *m == source) else { continue };
            for item in public_items(child_code) {
                out.push((module.iter().cloned().chain([item]).collect(), source.clone()));
            }
        }
    }
    out
}

/// The files that use items of each other, directly or around a loop, as module paths.
fn file_cycles() -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let sources: Vec<(Vec<String>, String, Vec<String>)> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| {
            let code = code(&std::fs::read_to_string(f).expect("a source file reads"));
            let children = declared_children(&code);
            (module_of(f), code, children)
        })
        .collect();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(m, ..)| m.clone()).collect();
    let mut renamed: Vec<(Vec<String>, Vec<String>)> =
        sources.iter().flat_map(|(m, code, children)| reexports(code, m, children)).collect();
    renamed.extend(glob_reexports(&sources));
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (0..=path.len()).rev().map(|n| &path[..n]).find_map(|prefix| {
            let via = renamed.iter().find(|(name, _)| name.as_slice() == prefix).map(|(_, source)| source.clone());
            via.or_else(|| modules.contains(prefix).then(|| prefix.to_vec()))
        })
    };
    let edges: Vec<(Vec<String>, BTreeSet<Vec<String>>)> = sources
        .iter()
        .map(|(module, code, children)| {
            let targets = named_paths(code, module, children).into_iter().filter_map(|p| resolve(&p));
            (module.clone(), targets.filter(|t| t != module).collect())
        })
        .collect();
    cycles(&edges)
}

/// Every loop among `edges` (each module with the modules it uses), as module paths.
fn cycles(edges: &[(Vec<String>, BTreeSet<Vec<String>>)]) -> Vec<Vec<String>> {
    let uses = |from: &Vec<String>| edges.iter().find(|(m, _)| m == from).map(|(_, t)| t.clone()).unwrap_or_default();
    let mut cycles = Vec::new();
    for (start, _) in edges {
        // A path back to `start` through modules after it in order: each cycle is found once.
        let mut stack = vec![vec![start.clone()]];
        while let Some(path) = stack.pop() {
            for next in uses(path.last().expect("never empty")) {
                if next == *start {
                    cycles.push(path.iter().map(|m| m.join("::")).collect());
                } else if next > *start && !path.contains(&next) && path.len() < 16 {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    cycles
}

#[test]
fn no_two_files_use_each_other() {
    let cycles = file_cycles();
    assert!(cycles.is_empty(), "files that use items of each other, around these loops:\n{cycles:#?}");
}

#[test]
fn the_file_reader_resolves_groups_parents_children_and_reexports() {
    let module = vec!["proxy".to_string(), "nginx".to_string()];
    let code = "use super::{access_log, meta::{labels, Owner}};\nuse crate::api::Protocol;\nfn f() { self::g(); }";
    let named: Vec<String> = named_paths(code, &module, &[]).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        ["proxy::access_log", "proxy::meta::labels", "proxy::meta::Owner", "api::Protocol", "proxy::nginx::g"]
    );
    let root = vec!["api".to_string()];
    let children = declared_children("pub mod formats;\nmod values;\npub use values::{Protocol, Algorithm};");
    assert_eq!(children, ["formats", "values"]);
    let renamed = reexports("pub use values::{Protocol, Algorithm};", &root, &children);
    assert_eq!(
        renamed[0],
        (vec!["api".to_string(), "Protocol".to_string()], vec!["api".to_string(), "values".to_string()])
    );
    assert!(named_paths("pub use values::Protocol;", &root, &children).is_empty(), "a re-export is no use");
    assert_eq!(named_paths("let x = formats::MAX;", &root, &children), [vec!["api", "formats", "MAX"]]);
    let limits = |code: &str| (vec!["api".to_string(), "limits".to_string()], code.to_string(), Vec::new());
    let sources = vec![
        (root.clone(), "pub mod limits;\npub use limits::*;".to_string(), vec!["limits".to_string()]),
        limits("pub const MAX_PORTS: usize = 32;\npub(crate) async fn read() {}"),
    ];
    let names: Vec<String> = glob_reexports(&sources).iter().map(|(name, _)| name.join("::")).collect();
    assert_eq!(names, ["api::MAX_PORTS", "api::read"], "a glob re-export names the child's public items");
}

#[test]
fn the_cycle_search_finds_a_loop_of_three_once_and_nothing_else() {
    let module = |name: &str| vec![name.to_string()];
    let uses = |from: &str, to: &[&str]| (module(from), to.iter().map(|t| module(t)).collect::<BTreeSet<_>>());
    let edges = [uses("a", &["b"]), uses("b", &["c", "d"]), uses("c", &["a"]), uses("d", &[])];
    assert_eq!(cycles(&edges), [vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
    assert!(cycles(&[uses("a", &["b"]), uses("b", &[])]).is_empty());
}

/// The guard reads the production code after a test-only item, not only what comes before the
/// first `#[cfg(test)]` (webhook/budget.rs has two test-only helpers before its production code
/// ends).
#[test]
fn the_guard_reads_production_code_after_a_test_only_item() {
    let text = "use crate::api;\n#[cfg(test)]\nfn free() -> usize { let c = '{'; \"}\".len() }\n\
                use crate::proxy::{self, x};\n#[cfg(test)]\nuse crate::manager;\n#[cfg(test)]\nmod tests {\n    use crate::cli;\n}\n";
    let read = code(text);
    assert_eq!(imports(&read), BTreeSet::from(["api".to_string(), "proxy".to_string()]), "{read}");
}
