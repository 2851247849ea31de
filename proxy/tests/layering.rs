//! The proxy's top-level modules import each other without a cycle, so each can be read
//! (and changed) knowing only the modules below it: `ctx` below admission, the upstreams,
//! the hook's channel and the stream registry; `relay` below `ending`; the routes and the
//! server above them all (`docs/src/architecture/proxy.md`).
//!
//! Read from the source: every `crate::<module>` a module names in code (comments and its
//! `#[cfg(test)]` tail left out, since tests may reach anywhere).

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
            let top = rel.split('/').next().unwrap_or_default().trim_end_matches(".rs").to_owned();
            let text = std::fs::read_to_string(&path).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("#[cfg(test)]") {
                    break;
                }
                if code.starts_with("//") {
                    continue;
                }
                let mut rest = code;
                while let Some(at) = rest.find("crate::") {
                    rest = &rest[at + "crate::".len()..];
                    let name: String =
                        rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                    if !name.is_empty() && name != top {
                        graph
                            .entry(top.clone())
                            .or_default()
                            .entry(name)
                            .or_insert_with(|| format!("{rel}:{}", n + 1));
                    }
                }
            }
        }
    }
    graph
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
