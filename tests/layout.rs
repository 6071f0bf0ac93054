//! The house's layout rule, checked: no module of the kernels, the engine or the app imports one
//! that imports it back. Each crate's top-level modules (a file or a folder) are nodes; a path in a
//! module's code (comments aside) that names another from the crate's root (`crate::`), from the
//! module (`self::`) or from above it (`super::`), groups included, is an edge; the graph must
//! have no cycle. The same holds for
//! every file's module inside the folders (test modules aside; a folder's `mod.rs` and its own
//! children are not counted against each other, since it declares and re-exports them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its `//` comments (doc links name modules without using them).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path in `src` that starts at the crate (`crate::`), at the module itself (`self::`) or
/// above it (`super::`, repeated), as the module path it names from the crate's root, `module`
/// being the module the code is in. A group (`crate::a::{b::C, d}`, nested too) gives one path
/// per member.
fn module_paths(src: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = src.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "self::", "super::"]
            .into_iter()
            .find(|k| b[i..].starts_with(k.as_bytes()));
        if starts.is_none() || (i > 0 && word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut base: Vec<String> = match starts {
            Some("crate::") => Vec::new(),
            _ => module.to_vec(),
        };
        let mut j = i;
        if starts == Some("crate::") {
            j += "crate::".len();
        } else if starts == Some("self::") {
            j += "self::".len();
        } else {
            while src[j..].starts_with("super::") {
                base.pop();
                j += "super::".len();
            }
        }
        i = j;
        group(src, &mut j, base, &mut out);
        i = i.max(j);
    }
    out
}

/// Reads `a::b::{...}` or `a::b` at `src[*j..]` below `base`, pushing each full path.
fn group(src: &str, j: &mut usize, mut base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let b = src.as_bytes();
    loop {
        let s = *j;
        while *j < b.len() && (b[*j].is_ascii_alphanumeric() || b[*j] == b'_') {
            *j += 1;
        }
        if *j > s {
            base.push(src[s..*j].to_string());
        }
        if src[*j..].starts_with("::") {
            *j += 2;
            continue;
        }
        break;
    }
    while *j < b.len() && b[*j].is_ascii_whitespace() {
        *j += 1;
    }
    if *j < b.len() && b[*j] == b'{' {
        *j += 1;
        loop {
            while *j < b.len() && (b[*j].is_ascii_whitespace() || b[*j] == b',') {
                *j += 1;
            }
            if *j >= b.len() || b[*j] == b'}' {
                *j += 1;
                return;
            }
            let before = *j;
            if src[*j..].starts_with("self")
                && !src[*j + 4..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                *j += 4;
                out.push(base.clone());
            } else {
                group(src, j, base.clone(), out);
            }
            // Skip what a member may carry after its path (`as name`).
            while *j < b.len() && b[*j] != b',' && b[*j] != b'}' {
                *j += 1;
            }
            if *j == before {
                *j += 1;
            }
        }
    }
    out.push(base);
}

/// Each file's module (`formats::gguf`; a folder's `mod.rs` is the folder) and the modules its
/// non-test code names, by the longest module prefix of each `crate::` path; a module and its
/// own parent or children are not counted (a folder's `mod.rs` declares and re-exports them).
fn file_graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut mods = BTreeMap::new();
    for f in &files {
        let parts = module_of(root, f);
        if parts.is_empty() {
            continue;
        }
        mods.insert(parts.join("::"), f.clone());
    }
    let related = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
    };
    let mut g = Graph::new();
    for (m, f) in &mods {
        let text = std::fs::read_to_string(f).unwrap();
        let non_test = text.split("#[cfg(test)]").next().unwrap_or("");
        let deps = g.entry(m.clone()).or_default();
        let here: Vec<String> = m.split("::").map(str::to_string).collect();
        for path in module_paths(&code(non_test), &here) {
            let target = (1..=path.len())
                .rev()
                .map(|k| path[..k].join("::"))
                .find(|c| mods.contains_key(c));
            if let Some(t) = target.filter(|t| !related(m, t)) {
                deps.insert(t);
            }
        }
    }
    g
}

/// Each file's module path from the crate's root (a folder's `mod.rs` is the folder; the root's
/// `lib.rs` or `main.rs` is the empty path).
fn module_of(root: &Path, f: &Path) -> Vec<String> {
    let rel = f.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

fn graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut g = Graph::new();
    for f in &files {
        let here = module_of(root, f);
        let Some(top) = here.first().cloned() else {
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let refs = module_paths(&code(&text), &here);
        let e = g.entry(top.clone()).or_default();
        e.extend(
            refs.into_iter()
                .filter_map(|p| p.first().cloned())
                .filter(|r| *r != top),
        );
    }
    let nodes: BTreeSet<String> = g.keys().cloned().collect();
    for deps in g.values_mut() {
        deps.retain(|d| nodes.contains(d));
    }
    g
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn cycles(g: &Graph) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn check(dir: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let g = graph(&root);
    assert!(g.len() > 3, "{dir}: found only {:?}", g.keys());
    let found = cycles(&g);
    let edges = |c: &BTreeSet<String>| {
        c.iter()
            .map(|m| format!("{m} -> {:?}", g[m].intersection(c).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    };
    let described: Vec<_> = found.iter().map(edges).collect();
    assert!(found.is_empty(), "{dir}: import cycles {described:?}");
}

fn check_files(dir: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let g = file_graph(&root);
    assert!(g.len() > 10, "{dir}: found only {:?}", g.keys());
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "{dir}: import cycles between files {found:?}"
    );
}

#[test]
fn engine_files_import_no_cycle() {
    check_files("engine/src");
}

#[test]
fn app_files_import_no_cycle() {
    check_files("app");
}

#[test]
fn kernels_files_import_no_cycle() {
    check_files("kernels/src");
}

#[test]
fn kernels_modules_import_no_cycle() {
    check("kernels/src");
}

#[test]
fn engine_modules_import_no_cycle() {
    check("engine/src");
}

#[test]
fn app_modules_import_no_cycle() {
    check("app");
}

#[test]
fn the_checker_sees_a_cycle() {
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    g.insert("d".into(), ["a".to_string()].into());
    assert_eq!(
        cycles(&g),
        vec![["a", "b", "c"].iter().map(|s| s.to_string()).collect()]
    );
    let here = ["a".to_string(), "b".to_string()];
    let paths: Vec<String> = module_paths(
        "use crate::x::Y; tpslab_crate::z; crate::w; use super::{c::D, e::{f, g as h}, self};\n\
         super::super::top::T; self::kid::K",
        &here,
    )
    .iter()
    .map(|p| p.join("::"))
    .collect();
    assert_eq!(
        paths,
        [
            "x::Y",
            "w",
            "a::c::D",
            "a::e::f",
            "a::e::g",
            "a",
            "top::T",
            "a::b::kid::K"
        ]
    );
}
