//! The layout check's reader: a crate's imports as a reader follows them, from the source text.
//!
//! Every `use` (braces expanded) and every path through `crate::`, `$crate::`, `super::`,
//! `self::`, a child module or a module a `use` named. A path is charged to the file that
//! *defines* the item, following `pub use` re-exports. Comments (nested too), string literals
//! (raw ones with any number of `#`), char literals and `#[cfg(test)]` items are left out;
//! `a :: b` reads as `a::b`. Forms that would hide an import from it (`extern crate self`,
//! `#[path]`, `include!`, a path built by a macro from a fragment) are refused by the check
//! itself (`no_hidden_imports`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every file under `dir`.
pub(super) fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// `p` under `base`, with `/`.
pub(super) fn rel(p: &Path, base: &Path) -> String {
    p.strip_prefix(base)
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

/// The source with comments, string and char literals blanked, `pub(in …)` read as `pub`, and
/// `#[cfg(test)]` items removed.
pub(super) fn code(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        let after_ident = i > 0 && is_ident(src[..i].chars().next_back().unwrap());
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            // Block comments nest.
            let (mut depth, mut k) = (0usize, 0);
            while k < rest.len() {
                if rest[k..].starts_with("/*") {
                    depth += 1;
                    k += 2;
                } else if rest[k..].starts_with("*/") {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += rest[k..].chars().next().unwrap().len_utf8();
                }
            }
            i += k;
            out.push(' ');
        } else if let Some(hashes) = raw_string(rest, after_ident && !src[..i].ends_with('b')) {
            // r"…", r#"…"#, r##"…"##: ends at a quote followed by as many hashes.
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += rest[body..]
                .find(&close)
                .map_or(rest.len(), |e| body + e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let end = if let Some(esc) = rest.strip_prefix("'\\") {
                esc.find('\'').map(|e| e + 3)
            } else {
                rest.char_indices()
                    .nth(2)
                    .filter(|&(_, c)| c == '\'')
                    .map(|(k, _)| k + 1)
            };
            match end {
                Some(e) => {
                    i += e;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    // `a :: b` is `a::b`.
    let parts: Vec<&str> = out.split("::").collect();
    let mut s = String::with_capacity(out.len());
    for (n, part) in parts.iter().enumerate() {
        let mut part = *part;
        if n > 0 {
            s.push_str("::");
            part = part.trim_start();
        }
        if n + 1 < parts.len() {
            part = part.trim_end();
        }
        s.push_str(part);
    }
    // `$crate::` (a macro's path to this crate) is `crate::`.
    let mut s = s.replace("$crate::", "crate::");
    while let Some(at) = s.find("pub(in ") {
        let end = at + s[at..].find(')').unwrap() + 1;
        s.replace_range(at..end, "pub");
    }
    while let Some(at) = s.find("#[cfg(test)]") {
        let mut j = at + "#[cfg(test)]".len();
        // Further attributes of the same item.
        loop {
            let t = s[j..].trim_start();
            j = s.len() - t.len();
            if t.starts_with("#[") {
                j += t.find(']').unwrap() + 1;
            } else {
                break;
            }
        }
        let end = match (s[j..].find(';'), s[j..].find('{')) {
            (Some(semi), Some(open)) if semi < open => j + semi + 1,
            (_, Some(open)) => {
                let mut depth = 0;
                let mut k = j + open;
                for (n, c) in s[k..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                k += n + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                k
            }
            (Some(semi), None) => j + semi + 1,
            (None, None) => s.len(),
        };
        s.replace_range(at..end, "");
    }
    s
}

/// The number of `#` of a raw string literal starting at `rest` (`r"`, `r#"`, …), unless the
/// `r` ends an identifier.
fn raw_string(rest: &str, in_ident: bool) -> Option<usize> {
    if in_ident || !rest.starts_with('r') {
        return None;
    }
    let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
    rest[1 + hashes..].starts_with('"').then_some(hashes)
}

/// A `use` tree expanded into its paths (`a::{b, c::{d as e}}` → `a::b`, `a::c::d as e`).
pub(super) fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split_whitespace().collect::<Vec<_>>().join(" ")];
    };
    let close = tree.rfind('}').unwrap();
    let (prefix, body) = (&tree[..open], &tree[open + 1..close]);
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (n, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[start..n]);
                start = n + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    items
        .into_iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(|i| expand(i).into_iter().map(move |p| format!("{prefix}{p}")))
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

pub(super) fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every `a::b::c` path in `s` whose first segment is `first`.
pub(super) fn paths_from<'a>(s: &'a str, first: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let pat = format!("{first}::");
    let mut from = 0;
    while let Some(at) = s[from..].find(&pat) {
        let at = from + at;
        from = at + pat.len();
        let before = s[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        let mut end = from;
        loop {
            let n = s[end..].chars().take_while(|&c| is_ident(c)).count();
            if n == 0 {
                break;
            }
            end += n;
            if s[end..].starts_with("::") && s[end + 2..].starts_with(is_ident) {
                end += 2;
            } else {
                break;
            }
        }
        // `a::b::{…}` is a `use` tree's prefix: `use_trees` reads its leaves.
        if end > from && !s[end..].starts_with("::{") {
            out.push(&s[at..end]);
        }
    }
    out
}

/// The library's files (no `bin/`), by module path (`[]` for `lib.rs`).
pub(super) struct Crate {
    files: BTreeMap<Vec<String>, (String, String)>,
    /// Per file, `pub use` names → the absolute path they re-export.
    exports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    /// The library under `root` (`src/`, without `bin/`).
    pub(super) fn read(src: &Path) -> Self {
        let mut all = Vec::new();
        files(src, &mut all);
        Self::new(
            all.iter()
                .map(|p| (rel(p, src), p))
                .filter(|(name, _)| name.ends_with(".rs") && !name.starts_with("bin/"))
                .map(|(name, p)| (name, std::fs::read_to_string(p).unwrap())),
        )
    }

    /// A crate of `(path under src/, source)` files.
    pub(super) fn new(sources: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut files = BTreeMap::new();
        for (name, text) in sources {
            let module: Vec<String> = match name.trim_end_matches(".rs") {
                "lib" => vec![],
                m => m.split('/').map(str::to_string).collect(),
            };
            files.insert(module, (name, code(&text)));
        }
        let mut krate = Crate {
            files,
            exports: BTreeMap::new(),
        };
        let mut exports = BTreeMap::new();
        for (module, (name, text)) in &krate.files {
            let mut map = BTreeMap::new();
            for tree in use_trees(text, true) {
                for p in expand(&tree) {
                    let (path, alias) = match p.split_once(" as ") {
                        Some((p, a)) => (p.to_string(), Some(a.to_string())),
                        None => (p, None),
                    };
                    if let Some(abs) = krate.absolute(module, &path)
                        && abs.last().is_some_and(|l| l != "*")
                    {
                        map.insert(alias.unwrap_or_else(|| abs.last().unwrap().clone()), abs);
                    }
                }
            }
            exports.insert(name.clone(), map);
        }
        krate.exports = exports;
        krate
    }

    /// `path` as written in module `me`, made absolute; `None` for an outside crate.
    fn absolute(&self, me: &[String], path: &str) -> Option<Vec<String>> {
        let segs: Vec<String> = path.split("::").map(|s| s.trim().to_string()).collect();
        let mut abs = match segs[0].as_str() {
            "crate" => vec![],
            "self" => me.to_vec(),
            "super" => {
                let up = segs.iter().take_while(|s| *s == "super").count();
                let mut a = me[..me.len() - up].to_vec();
                a.extend(segs[up..].iter().cloned());
                return Some(a);
            }
            _ => {
                let mut child = me.to_vec();
                child.push(segs[0].clone());
                if !self.files.contains_key(&child) {
                    return None;
                }
                let mut a = me.to_vec();
                a.extend(segs.iter().cloned());
                return Some(a);
            }
        };
        abs.extend(segs[1..].iter().cloned());
        Some(abs)
    }

    /// The file that defines `path` (the deepest module on it, through re-exports).
    fn resolve(&self, path: &[String], depth: usize) -> Option<&str> {
        let path: Vec<String> = path
            .iter()
            .filter(|s| *s != "self" && *s != "*")
            .cloned()
            .collect();
        for k in (0..=path.len()).rev() {
            if let Some((name, _)) = self.files.get(&path[..k]) {
                if let Some(next) = path
                    .get(k)
                    .and_then(|item| self.exports.get(name).and_then(|e| e.get(item)))
                    && depth < 10
                {
                    let mut p = next.clone();
                    p.extend(path[k + 1..].iter().cloned());
                    return self.resolve(&p, depth + 1);
                }
                return Some(name);
            }
        }
        None
    }

    /// File → the files it imports.
    pub(super) fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (me, (name, text)) in &self.files {
            let mut paths: Vec<String> = use_trees(text, false)
                .iter()
                .flat_map(|t| expand(t))
                .map(|p| p.split(" as ").next().unwrap().to_string())
                .collect();
            for first in ["crate", "super", "self"] {
                paths.extend(paths_from(text, first).into_iter().map(str::to_string));
            }
            // Child modules, and modules a `use` bound to a name, used as `name::item`.
            let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for m in self.files.keys() {
                if m.len() == me.len() + 1 && m.starts_with(me) {
                    bound.insert(m.last().unwrap().clone(), m.clone());
                }
            }
            for t in use_trees(text, false) {
                for p in expand(&t) {
                    let (path, alias) = match p.split_once(" as ") {
                        Some((p, a)) => (p, Some(a.to_string())),
                        None => (p.as_str(), None),
                    };
                    if let Some(mut abs) = self.absolute(me, path) {
                        if abs.last().is_some_and(|l| l == "self") {
                            abs.pop();
                        }
                        if self.files.contains_key(&abs) && !abs.is_empty() {
                            bound.insert(alias.unwrap_or_else(|| abs.last().unwrap().clone()), abs);
                        }
                    }
                }
            }
            for (alias, module) in &bound {
                for p in paths_from(text, alias) {
                    paths.push(format!("crate::{}{}", module.join("::"), &p[alias.len()..]));
                }
            }
            let mut to = BTreeSet::new();
            for p in paths {
                if let Some(abs) = self.absolute(me, &p)
                    && let Some(file) = self.resolve(&abs, 0)
                    && file != name
                {
                    to.insert(file.to_string());
                }
            }
            edges.insert(name.clone(), to);
        }
        edges
    }
}

/// The trees of every `use` in `text` (only `pub use` ones when `public`).
pub(super) fn use_trees(text: &str, public: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("use") {
        let at = from + at;
        from = at + 3;
        let before = text[..at].chars().next_back();
        let after = text[from..].chars().next();
        if before.is_some_and(is_ident) || !after.is_some_and(char::is_whitespace) {
            continue;
        }
        let head = text[..at].trim_end();
        let is_pub = head.ends_with("pub") || head.ends_with(')') && head.contains("pub(");
        if public && !is_pub {
            continue;
        }
        let end = from + text[from..].find(';').unwrap();
        out.push(text[from..end].to_string());
    }
    out
}

/// Strongly connected components of `edges` with more than one file (Tarjan).
pub(super) fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for t in w.edges.get(v).into_iter().flatten() {
            if !w.index.contains_key(t.as_str()) {
                visit(w, t);
                let l = w.low[t.as_str()].min(w.low[v]);
                w.low.insert(v, l);
            } else if w.stack.contains(&t.as_str()) {
                let l = w.index[t.as_str()].min(w.low[v]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut c = Vec::new();
            while let Some(x) = w.stack.pop() {
                c.push(x.to_string());
                if x == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                w.out.push(c);
            }
        }
    }
    let mut w = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.out
}

/// A file's room: its top-level module (`store/redis/lua.rs` → `store`).
pub(super) fn room(file: &str) -> &str {
    file.split('/').next().unwrap().trim_end_matches(".rs")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader itself: a circle through a re-export, an import in a string or a test module,
    /// and a room reaching up are all seen as they are.
    #[test]
    fn the_reader_follows_imports_as_written() {
        let text = code(
            "use crate::a::{b::{C, D as E}, f};\n\
             // use crate::hidden;\n\
             const S: &str = \"crate::hidden::X\";\n\
             fn g<'a>(c: char) -> bool { c == '{' || c == '}' }\n\
             pub(in crate::x) fn h() { super::y::z(); }\n\
             #[cfg(test)]\n#[allow(dead_code)]\nmod tests { use crate::hidden; }\n",
        );
        assert!(!text.contains("hidden"), "{text}");
        assert!(text.contains("pub fn h()"), "{text}");
        assert_eq!(
            use_trees(&text, false)
                .iter()
                .flat_map(|t| expand(t))
                .collect::<Vec<_>>(),
            ["crate::a::b::C", "crate::a::b::D as E", "crate::a::f"]
        );
        assert_eq!(paths_from(&text, "super"), ["super::y::z"]);
        assert!(paths_from(&text, "crate").is_empty());
        let mut edges = BTreeMap::new();
        for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
            edges
                .entry(a.to_string())
                .or_insert_with(BTreeSet::new)
                .insert(b.to_string());
        }
        assert_eq!(circles(&edges), [["a", "b", "c"]]);
    }

    fn edges(files: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        Crate::new(files.iter().map(|(n, t)| (n.to_string(), t.to_string()))).imports()
    }

    fn to(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Vec<String> {
        edges[from].iter().cloned().collect()
    }

    /// A path is charged to the file that defines the item, through a re-export: two files
    /// naming each other's items, one through the crate root, are a circle.
    #[test]
    fn re_exports_lead_to_the_defining_file() {
        let e = edges(&[
            ("lib.rs", "mod a; mod b; pub use a::A;"),
            ("a.rs", "pub struct A; use crate::b::B;"),
            ("b.rs", "pub struct B; fn f() -> crate::A { todo!() }"),
        ]);
        assert_eq!(to(&e, "b.rs"), ["a.rs"]);
        assert_eq!(circles(&e), [["a.rs", "b.rs"]]);
    }

    /// Paths without a `use`: inline through `crate::`, `$crate::`, a module a `use` named, a
    /// child module.
    #[test]
    fn paths_without_a_use_are_imports() {
        let e = edges(&[
            ("lib.rs", "mod a; mod b; mod c; mod d; mod e;"),
            ("a.rs", "pub struct A;"),
            ("b.rs", "fn f() { crate::a::A; }"),
            ("c.rs", "macro_rules! m { () => { $crate::a::A } }"),
            ("d.rs", "use crate::a; fn f() { a::A; }"),
            ("e.rs", "mod f; fn g() { f::x(); }"),
            ("e/f.rs", "pub fn x() {}"),
        ]);
        for f in ["b.rs", "c.rs", "d.rs"] {
            assert_eq!(to(&e, f), ["a.rs"], "{f}");
        }
        assert_eq!(to(&e, "e.rs"), ["e/f.rs"]);
    }

    /// What could hide an import from a naive reader does not: a nested block comment holding
    /// a quote, a raw string with `##` holding one, spaces around `::`, `use` on its own line.
    #[test]
    fn no_text_hides_an_import() {
        let e = edges(&[
            ("lib.rs", "mod a; mod b; mod c; mod d; mod e;"),
            ("a.rs", "pub struct A;"),
            ("b.rs", "/* a /* b */ \" */\nuse crate::a::A;"),
            ("c.rs", "const S: &str = r##\"a\"b\"##;\nuse crate::a::A;"),
            ("d.rs", "fn f() { crate :: a :: A; }"),
            ("e.rs", "use\n    crate::a::A;"),
        ]);
        for f in ["b.rs", "c.rs", "d.rs", "e.rs"] {
            assert_eq!(to(&e, f), ["a.rs"], "{f}");
        }
    }
}
