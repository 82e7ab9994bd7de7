//! docs/design.md is true of the code (issue 33): every source file it names in backticks
//! (`something.rs`, `crates/…`) exists, and every type and function it names in backticks is
//! declared somewhere in the workspace's sources. A rename that leaves the design doc behind
//! fails here with the names the doc still uses.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::file_circles::sources;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the sources declare: type names (struct, enum, trait, type, const, static, mod) and
/// function names.
fn declared(files: &[PathBuf]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let kinds = [
        "struct ", "enum ", "trait ", "type ", "fn ", "const ", "static ", "mod ",
    ];
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines() {
            let l = line.trim_start();
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub ").unwrap_or(l);
            for kind in kinds {
                if let Some(rest) = l.strip_prefix(kind) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
            // Enum variants and fields (`Type::Variant`, `Type::field`): a line that starts
            // with an identifier followed by `(`, `{`, `,` or `:`.
            let ident: String = l
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let after = l[ident.len()..].trim_start().chars().next();
            if !ident.is_empty() && matches!(after, Some('(' | '{' | ',' | ':')) {
                names.insert(ident);
            }
        }
    }
    names
}

/// The spans in backticks of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// A Rust path's last segments worth checking: `a::B::c` gives `B` and `c`; a call
/// `f(…)` gives `f`. Only identifiers: anything with spaces, dashes or dots is not a Rust name.
fn rust_names(span: &str) -> Vec<String> {
    let span = span.split('(').next().unwrap_or("");
    let span = span.trim_end_matches("()");
    if span.is_empty()
        || !span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '<' || c == '>')
    {
        return Vec::new();
    }
    let segments: Vec<&str> = span
        .split("::")
        .flat_map(|s| s.split(['<', '>']))
        .filter(|s| !s.is_empty())
        .collect();
    let Some(last) = segments.last() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // A CamelCase name anywhere in the path is a type.
    for s in &segments {
        let camel = s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && s.chars().any(|c| c.is_ascii_lowercase());
        if camel {
            out.push((*s).to_string());
        }
    }
    // The last segment of a path with `::` is an item (a module, a function, a field).
    if span.contains("::")
        && last
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
    {
        out.push((*last).to_string());
    }
    out
}

#[test]
fn the_files_types_and_functions_design_md_names_exist() {
    let root = root();
    let text = std::fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    sources(&root.join("tests"), &mut files);
    let mut names = declared(&files);
    // The standard library's traits the doc names.
    names.extend(["Display", "Drop", "From", "Into"].map(String::from));
    // Flannel's annotation field, which the doc quotes.
    names.insert("VtepMAC".into());
    let rel: Vec<String> = files
        .iter()
        .filter_map(|f| f.strip_prefix(&root).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let mut missing = Vec::new();
    for span in backticked(&text) {
        let path_like = span.ends_with(".rs") || span.starts_with("crates/");
        if path_like && !span.contains(' ') && !span.contains('{') && !span.contains('*') {
            let span = span.trim_end_matches('/');
            let found = if span.starts_with("crates/") || span.starts_with("tests/") {
                root.join(span).exists()
            } else {
                // `agent/reconcile.rs` is `crates/agent/src/reconcile.rs`; `doctor/` a directory.
                rel.iter().map(|r| r.replace("/src/", "/")).any(|r| {
                    r.ends_with(&format!("/{span}"))
                        || r.contains(&format!("/{}/", span.trim_end_matches(".rs")))
                })
            };
            if !found {
                missing.push(format!("file {span}"));
            }
            continue;
        }
        for name in rust_names(span) {
            if !names.contains(&name) {
                missing.push(format!("name {name} (in `{span}`)"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/design.md names what the sources no longer have:\n{}",
        missing.join("\n")
    );
}

#[test]
fn names_are_read_from_paths_and_calls() {
    assert_eq!(
        rust_names("sticky_sites::round::Memory"),
        ["Memory", "Memory"][..1].to_vec()
    );
    assert_eq!(rust_names("plan"), Vec::<String>::new());
    assert_eq!(rust_names("heal::follow"), ["follow"]);
    assert_eq!(rust_names("Side<D>"), ["Side"]);
    assert_eq!(rust_names("CniResult::to_json"), ["CniResult", "to_json"]);
    assert_eq!(rust_names("ip -batch"), Vec::<String>::new());
    assert_eq!(rust_names("CNI_ARGS"), Vec::<String>::new());
}
