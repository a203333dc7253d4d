//! The layering of `src/`: each top-level module imports only the layers below it, so there
//! is no import cycle, and the runtime layer knows nothing of Balancers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first, each with what it may import (all of it listed earlier).
const LAYERS: &[(&str, &[&str])] = &[
    ("util", &[]),
    ("deploy", &[]),
    ("runtime", &["util", "deploy"]),
    ("api", &["util", "deploy"]),
    ("spec", &["util", "deploy", "api"]),
    ("proxy", &["util", "deploy", "api", "spec"]),
    ("exporter", &["util", "deploy", "runtime", "api", "spec", "proxy"]),
    ("webhook", &["util", "deploy", "runtime", "api", "spec"]),
    ("controller", &["util", "deploy", "runtime", "api", "spec", "proxy"]),
    ("manager", &["util", "deploy", "runtime", "api", "spec", "proxy", "webhook", "controller"]),
    ("cli", &["util", "deploy", "runtime", "api", "spec", "proxy", "exporter", "webhook", "controller", "manager"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
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

/// The code of a file without its comments and tests, which may reach anywhere.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
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
