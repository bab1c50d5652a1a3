//! The crate's layout, checked (tests only): `docs/layout.md` names every file, no file under
//! `src/` is longer than [`MAX_LINES`], and the library's imports point down — no import
//! circle of more than [`MAX_CIRCLE`] files, each room importing only what its `may import:`
//! line in `docs/layout.md` allows, every line naming only rooms on the floors below it.
//!
//! How imports are read (every `use` and path, re-exports followed to the defining file) is
//! `layout_check/reader.rs`; the rules are here, as a pure function of the import graph and
//! the page's lines ([`violations`]), so each rule is also tested on a graph made to break it.

mod reader;

use reader::{Crate, circles, files, rel, room};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The largest import circle allowed, in files: a module and the few children that name its
/// types back (a builder and what it builds) — never a floor that reaches up.
const MAX_CIRCLE: usize = 5;

/// The longest a file under `src/` may be, tests included: past it, a file holds more than one
/// concept and is split by concept.
const MAX_LINES: usize = 700;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn layout() -> String {
    std::fs::read_to_string(root().join("docs/layout.md")).unwrap()
}

/// `docs/layout.md` is the crate's one layout: every Rust file under `src/`, `tests/`,
/// `benches/` and `examples/` has its own line there (the path first, then what it holds), so
/// the map cannot silently fall behind the territory.
#[test]
fn docs_layout_names_every_file() {
    let layout = layout();
    let listed: BTreeSet<&str> = layout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut all = Vec::new();
    for dir in ["src", "tests", "benches", "examples"] {
        files(&root().join(dir), &mut all);
    }
    let missing: Vec<String> = all
        .iter()
        .map(|p| rel(p, root()))
        .filter(|p| p.ends_with(".rs"))
        .filter(|p| !listed.contains(p.as_str()))
        .collect();
    assert!(missing.is_empty(), "no line of docs/layout.md: {missing:?}");
    assert!(listed.contains("src/scripts/*.lua"));
}

#[test]
fn every_file_holds_one_concept() {
    let mut all = Vec::new();
    files(&root().join("src"), &mut all);
    let long: Vec<String> = all
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", rel(p, root())))
        })
        .collect();
    assert!(long.is_empty(), "longer than {MAX_LINES} lines: {long:?}");
}

/// Forms that would hide an import from the reader are not used in the library: a module path
/// built by a macro from a fragment (`crate::$m`), a module file outside `src/` (`#[path]`), code
/// pasted in (`include!`), the crate under another name (`extern crate self`).
#[test]
fn no_hidden_imports() {
    let mut all = Vec::new();
    files(&root().join("src"), &mut all);
    let mut found = Vec::new();
    for p in all
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
    {
        let text = reader::code(&std::fs::read_to_string(p).unwrap());
        for form in [
            "crate::$",
            "super::$",
            "self::$",
            "#[path",
            "include!(",
            "extern crate",
        ] {
            if text.contains(form) {
                found.push(format!("{}: {form}", rel(p, root())));
            }
        }
    }
    assert!(
        found.is_empty(),
        "imports the layout check cannot read: {found:?}"
    );
}

/// The rooms each room may import, as `docs/layout.md` states them, floor by floor: a line
/// `` `room` may import: `a`, `b` `` (or `nothing`) under the room's paragraph; an entry may
/// also name one file of a higher room (`` `src/cart/id.rs` ``), when only that file is below.
fn floors(layout: &str) -> Vec<(String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for line in layout.lines() {
        let Some((head, list)) = line.split_once(" may import: ") else {
            continue;
        };
        let name = head.trim().trim_matches('`').to_string();
        let rooms = list
            .split(',')
            .map(|r| r.trim().trim_end_matches('.').trim_matches('`').to_string())
            .filter(|r| !r.is_empty() && r != "nothing")
            .collect();
        out.push((name, rooms));
    }
    out
}

/// Everything wrong with `edges` (file → files it imports, paths under `src/`) against
/// `floors`: circles of more than [`MAX_CIRCLE`] files; a line naming a room that is not on a
/// floor below it; a room without a line; an import its line does not allow; a single file a
/// line names that itself imports what the naming room may not.
fn violations(
    edges: &BTreeMap<String, BTreeSet<String>>,
    floors: &[(String, BTreeSet<String>)],
) -> Vec<String> {
    let mut wrong: Vec<String> = circles(edges)
        .into_iter()
        .filter(|c| c.len() > MAX_CIRCLE)
        .map(|c| format!("an import circle of {} files: {c:?}", c.len()))
        .collect();
    for (n, (room, may)) in floors.iter().enumerate() {
        for r in may.iter().filter(|r| !r.ends_with(".rs")) {
            if !floors[..n].iter().any(|(below, _)| below == r) {
                wrong.push(format!(
                    "docs/layout.md: `{room}` may import `{r}`, not on a floor below it"
                ));
            }
        }
    }
    let allowed: BTreeMap<&str, &BTreeSet<String>> =
        floors.iter().map(|(r, may)| (r.as_str(), may)).collect();
    let may_import = |from: &str, to: &str| {
        let r = room(to);
        r == from
            || allowed
                .get(from)
                .is_some_and(|may| may.contains(r) || may.contains(&format!("src/{to}")))
    };
    for (file, to) in edges {
        let from = room(file);
        // The crate root re-exports every room; the check does not check itself.
        if from == "lib" || from == "layout_check" {
            continue;
        }
        if !allowed.contains_key(from) {
            wrong.push(format!(
                "{file}: room `{from}` has no `may import:` line in docs/layout.md"
            ));
            continue;
        }
        for t in to.iter().filter(|t| !may_import(from, t)) {
            wrong.push(format!(
                "{file} imports {t}: `{from}` may not import `{}`",
                room(t)
            ));
        }
    }
    // A file named on its own sits, for that room, below it: all it imports must be.
    for (room_name, may) in floors {
        for f in may.iter().filter_map(|e| e.strip_prefix("src/")) {
            for t in edges.get(f).into_iter().flatten() {
                if !may_import(room_name, t) {
                    wrong.push(format!(
                        "{f}, which `{room_name}` may import, imports {t}: `{room_name}` may not"
                    ));
                }
            }
        }
    }
    wrong
}

#[test]
fn imports_point_down() {
    let edges = Crate::read(&root().join("src")).imports();
    let wrong = violations(&edges, &floors(&layout()));
    assert!(
        wrong.is_empty(),
        "imports against docs/layout.md:\n{}",
        wrong.join("\n")
    );
}

/// Each rule, on a graph made to break it (and the same graph kept, not broken, passes).
#[test]
fn every_rule_fails_when_broken() {
    let page = "`low` may import: nothing.\n\
                `mid` may import: `low`, `src/top/pure.rs`.\n\
                `top` may import: `low`, `mid`.\n";
    let graph = |extra: &[(&str, &str)]| {
        let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in [
            ("mid.rs", "low.rs"),
            ("mid.rs", "top/pure.rs"),
            ("top.rs", "mid.rs"),
            ("top.rs", "top/pure.rs"),
            ("top/pure.rs", "low.rs"),
        ]
        .iter()
        .chain(extra)
        {
            e.entry(a.to_string()).or_default().insert(b.to_string());
            e.entry(b.to_string()).or_default();
        }
        e
    };
    assert_eq!(violations(&graph(&[]), &floors(page)), Vec::<String>::new());
    let broken = |extra: &[(&str, &str)], page: &str, says: &str| {
        let wrong = violations(&graph(extra), &floors(page));
        assert!(wrong.iter().any(|w| w.contains(says)), "{says}: {wrong:?}");
    };
    broken(&[("low.rs", "mid.rs")], page, "`low` may not import `mid`");
    broken(
        &[("top/pure.rs", "top.rs")],
        page,
        "top/pure.rs, which `mid` may import",
    );
    broken(
        &[("odd.rs", "low.rs")],
        page,
        "room `odd` has no `may import:` line",
    );
    let upside_down = page.replace("`low` may import: nothing.", "`low` may import: `top`.");
    broken(
        &[],
        &upside_down,
        "`low` may import `top`, not on a floor below it",
    );
    let ring: Vec<(String, String)> = (0..6)
        .map(|i| (format!("top/r{i}.rs"), format!("top/r{}.rs", (i + 1) % 6)))
        .collect();
    let ring: Vec<(&str, &str)> = ring.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    broken(&ring, page, "an import circle of 6 files");
    let five: Vec<(&str, &str)> = ring[..4]
        .iter()
        .copied()
        .chain([("top/r4.rs", "top/r0.rs")])
        .collect();
    assert!(
        violations(&graph(&five), &floors(page)).is_empty(),
        "5 files may circle"
    );
}
