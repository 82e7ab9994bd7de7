//! No file-level circle inside any crate of the workspace (docs/design.md, "Crates"): no file
//! imports, through `crate::` or `super::` paths outside its tests, a file that imports it back,
//! directly or round a longer loop. The crate root (`lib.rs`, `main.rs`) is left out: it
//! declares the modules and holds the crate's error type, which every file may name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`.
pub fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of `file` in a crate whose sources are in `src` (`a/b.rs` and
/// `a/b/mod.rs` are `a::b`); `None` for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [one] if one == "lib" || one == "main" => None,
        _ => Some(parts.join("::")),
    }
}

/// The code of a file without its `#[cfg(test)] mod tests` and its `//` comments.
fn code(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths named after each `crate::` and `super::` in `code`, as (root, segments): up to
/// two segments, and one path per item of a `{…}` group.
fn paths(code: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for root in ["crate", "super"] {
        let needle = format!("{root}::");
        let mut from = 0;
        while let Some(at) = code[from..].find(&needle) {
            let start = from + at;
            from = start + needle.len();
            if code[..start].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let segs: Vec<String> = item
                        .trim()
                        .split("::")
                        .take(2)
                        .map(|s| s.chars().take_while(|c| is_ident(*c)).collect())
                        .filter(|s: &String| !s.is_empty() && s != "self")
                        .collect();
                    if !segs.is_empty() {
                        out.push((root, segs));
                    }
                }
                continue;
            }
            let segs: Vec<String> = rest
                .split("::")
                .take(2)
                .map(|s| s.chars().take_while(|c| is_ident(*c)).collect())
                .take_while(|s: &String| !s.is_empty())
                .collect();
            if !segs.is_empty() {
                out.push((root, segs));
            }
        }
    }
    out
}

/// The files (modules) of the crate in `src` and the ones each imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let texts: BTreeMap<String, String> = files
        .iter()
        .filter_map(|f| {
            let module = module_of(src, f)?;
            let text = std::fs::read_to_string(f).ok()?;
            Some((module, code(&text)))
        })
        .collect();
    let modules: BTreeSet<&String> = texts.keys().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
            let mut deps = BTreeSet::new();
            for (root, segs) in paths(text) {
                let base = match (root, parent) {
                    ("super", p) if !p.is_empty() => format!("{p}::"),
                    _ => String::new(),
                };
                let long = format!("{base}{}", segs.join("::"));
                let short = format!("{base}{}", segs[0]);
                for candidate in [long, short] {
                    if modules.contains(&candidate) {
                        if &candidate != module {
                            deps.insert(candidate);
                        }
                        break;
                    }
                }
            }
            (module.clone(), deps)
        })
        .collect()
}

/// A circle in `graph`, as the files round it, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut round = path[at..].to_vec();
            round.push(node.to_string());
            return Some(round);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(round) = visit(dep, graph, path, done) {
                return Some(round);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut seen = 0;
    for entry in std::fs::read_dir(&crates).expect("read crates/").flatten() {
        let src = entry.path().join("src");
        let graph = graph(&src);
        seen += graph.len();
        if let Some(round) = circle(&graph) {
            panic!(
                "{}: a file-level circle: {}",
                entry.path().display(),
                round.join(" -> ")
            );
        }
    }
    assert!(
        seen > 50,
        "only {seen} files read under {}",
        crates.display()
    );
}

#[test]
fn a_circle_is_found() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let code = "use super::{config::Config, peers};\nlet x = crate::step::Step::A;";
    let found = paths(code);
    assert!(found.contains(&("super", vec!["config".into(), "Config".into()])));
    assert!(found.contains(&("super", vec!["peers".into()])));
    assert!(found.contains(&("crate", vec!["step".into(), "Step".into()])));
}
