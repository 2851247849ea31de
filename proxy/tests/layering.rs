//! The proxy's top-level modules import each other without a cycle, so each can be read
//! (and changed) knowing only the modules below it: `ctx` below admission, the upstreams,
//! the hook's channel and the stream registry; `relay` below `ending`; the routes and the
//! server above them all (`docs/src/architecture/proxy.md`).
//!
//! Read from the source: every top-level module a module names in code, through
//! `crate::<module>`, a `crate::{...}` group or `super::` climbing out of it (comments and
//! its `#[cfg(test)]` tail left out, since tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules its code names, each with one place it does.
fn imports() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).expect("under src/").to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&path).expect("a source file");
            let top = module_path(&rel).into_iter().next().unwrap_or_default();
            for (name, line) in named_modules(&rel, &text) {
                if name != top {
                    graph
                        .entry(top.clone())
                        .or_default()
                        .entry(name)
                        .or_insert_with(|| format!("{rel}:{line}"));
                }
            }
        }
    }
    graph
}

/// The module path of a file under `src/` (`relay/body.rs` is `relay::body`,
/// `relay/mod.rs` is `relay`, `lib.rs` the crate root).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Every top-level module a file's code names, with the line it does: through `crate::a`,
/// `crate::{a, b::c}` (a group may span lines), and `super::` chains that climb out of
/// the file's own top-level module. Comments and the `#[cfg(test)]` tail are left out,
/// since tests may reach anywhere.
fn named_modules(rel: &str, text: &str) -> Vec<(String, usize)> {
    // The code as one string, each byte's line kept.
    let mut code = String::new();
    let mut line_of = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let kept = trimmed.split(" //").next().unwrap_or_default();
        code.push_str(kept);
        code.push('\n');
        line_of.extend(std::iter::repeat_n(n + 1, kept.len() + 1));
    }
    let ident =
        |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let here = module_path(rel);
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let boundary = at == 0 || !code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if boundary && rest.starts_with("crate::") {
            let after = &rest["crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                // Each element of the group, at its own depth: `a`, `b::c`, `d::{e, f}`.
                let mut depth = 0usize;
                let mut element_start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => element_start = true,
                        c if element_start && !c.is_whitespace() => {
                            element_start = false;
                            let name = ident(&group[i..]);
                            let offset = at + "crate::{".len() + i;
                            if !name.is_empty() && name != "self" {
                                found.push((name, line_of[offset]));
                            }
                        }
                        _ => {}
                    }
                }
            } else {
                let name = ident(after);
                if !name.is_empty() {
                    found.push((name, line_of[at]));
                }
            }
            at += "crate::".len();
            continue;
        }
        if boundary && rest.starts_with("super::") {
            let mut climbs = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                climbs += 1;
                tail = t;
            }
            // Climbing to the crate root, the next name is a top-level module.
            if climbs >= here.len() && climbs > 0 {
                let name = ident(tail);
                if !name.is_empty() {
                    found.push((name, line_of[at]));
                }
            }
            at += "super::".len() * climbs;
            continue;
        }
        at += rest.chars().next().map_or(1, char::len_utf8);
    }
    found
}

#[test]
fn the_scan_reads_groups_and_climbs_out_of_a_module() {
    let names = |rel: &str, text: &str| -> Vec<String> {
        named_modules(rel, text).into_iter().map(|(n, _)| n).collect()
    };
    assert_eq!(names("relay/body.rs", "use crate::ctx::Arrival;"), ["ctx"]);
    assert_eq!(
        names("relay/body.rs", "use crate::{ctx::Arrival, ending, upstream::{A, B}};"),
        ["ctx", "ending", "upstream"]
    );
    assert_eq!(
        names("relay/body.rs", "use crate::{\n    ctx,\n    // no\n    hook::X,\n};"),
        ["ctx", "hook"]
    );
    assert_eq!(named_modules("a.rs", "fn f() {}\nuse crate::{\n    ctx,\n};")[0], ("ctx".to_owned(), 3));
    assert_eq!(names("relay/body.rs", "use super::super::ending::Plan;"), ["ending"], "climbs to the root");
    assert_eq!(names("relay/body.rs", "use super::stage::Flow;"), Vec::<String>::new(), "stays in relay");
    assert_eq!(
        names("relay/mod.rs", "use super::ending;"),
        ["ending"],
        "a module's mod.rs is one level down"
    );
    assert_eq!(
        names("relay/body.rs", "// use crate::ending;\nlet x = 1; // crate::hook"),
        Vec::<String>::new()
    );
    assert_eq!(
        names("relay/body.rs", "fn f() {}\n#[cfg(test)]\nmod tests { use crate::ending; }"),
        Vec::<String>::new()
    );
}

/// A cycle through `start`, as the modules on it, if there is one.
fn cycle_from(graph: &BTreeMap<String, BTreeMap<String, String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeMap<String, String>>,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flat_map(BTreeMap::keys) {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    walk(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn no_top_level_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(graph.len() > 10, "the walk found the proxy's modules: {:?}", graph.keys());
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module) {
            let steps: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(a, b)| format!("{a} -> {b} ({})", graph[a][b]))
                .collect();
            panic!("a module cycle:\n  {}", steps.join("\n  "));
        }
    }
}

#[test]
fn the_walk_sees_a_cycle_when_there_is_one() {
    let edge = |to: &str| BTreeMap::from([(to.to_owned(), "here".to_owned())]);
    let graph = BTreeMap::from([
        ("a".to_owned(), edge("b")),
        ("b".to_owned(), edge("c")),
        ("c".to_owned(), edge("a")),
        ("d".to_owned(), edge("a")),
    ]);
    assert_eq!(cycle_from(&graph, "a"), Some(vec!["a".into(), "b".into(), "c".into()]));
    assert_eq!(cycle_from(&graph, "d"), None, "d reaches the cycle but is not on it");
}
