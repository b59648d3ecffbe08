//! napkin-core's floors hold: every `crate::…` path in a module names itself or a module on a
//! floor below it, and the order here is the one ARCHITECTURE.md draws.
//!
//! The source is read as text: comments are dropped, then every `crate::name`, every
//! `crate::{a, b::c}` group and every `super::` chain that leaves its top-level module is
//! resolved to the top-level module it names. Test modules are held to the same floors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// napkin-core's top-level modules from the ground up: each may use only those before it.
const FLOORS: [&str; 19] = [
    "error",
    "config",
    "rng",
    "quant",
    "predict",
    "device",
    "memory",
    "kernels",
    "model",
    "io",
    "tokenizer",
    "chat",
    "data",
    "export",
    "distributed",
    "train",
    "measure",
    "report",
    "exercises",
];

fn core_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with `//` comments (doc comments included) and string literals blanked, so that
/// a path in prose or in a message is not taken for a use.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut in_line_comment, mut block_depth) = (false, false, 0usize);
    while let Some(c) = chars.next() {
        if in_line_comment {
            if c == '\n' {
                in_line_comment = false;
                out.push('\n');
            }
        } else if block_depth > 0 {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                block_depth -= 1;
            } else if c == '/' && chars.peek() == Some(&'*') {
                chars.next();
                block_depth += 1;
            }
        } else if in_string {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            in_line_comment = true;
        } else if c == '/' && chars.peek() == Some(&'*') {
            chars.next();
            block_depth = 1;
        } else if c == '"' {
            in_string = true;
            out.push(' ');
        } else if c == '\'' {
            // A char literal ('"', '\'') or a lifetime ('a): skip a literal whole.
            let rest: String = chars.clone().take(3).collect();
            let literal_len = if rest.starts_with('\\') {
                rest.chars().skip(2).position(|r| r == '\'').map(|p| p + 3)
            } else if rest.chars().nth(1) == Some('\'') {
                Some(2)
            } else {
                None
            };
            for _ in 0..literal_len.unwrap_or(0) {
                chars.next();
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The first path segment of each item in a `{…}` group (nested groups skipped).
fn group_heads(group: &str) -> Vec<String> {
    let (mut heads, mut depth, mut current) = (Vec::new(), 0usize, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => heads.push(std::mem::take(&mut current)),
            _ if depth == 0 => current.push(c),
            _ => {}
        }
    }
    heads.push(current);
    heads
        .iter()
        .filter_map(|h| h.trim().split("::").next().map(str::trim).map(String::from))
        .filter(|h| !h.is_empty())
        .collect()
}

/// The text from `from` up to its matching `}` (`from` is just past a `{`).
fn group_at(code: &str, from: usize) -> &str {
    let mut depth = 1usize;
    for (i, c) in code[from..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[from..from + i];
                }
            }
            _ => {}
        }
    }
    &code[from..]
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules a file's code names through `crate::` or a `super::` chain that
/// leaves the module path `module` (e.g. `["data", "loader"]`).
fn named_top_modules(code: &str, module: &[String]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("crate::") {
        let start = at + found;
        at = start + "crate::".len();
        // `$crate::` or `napkin_crate::` are not this crate's root.
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident_char(c) || c == '$')
        {
            continue;
        }
        let rest = &code[at..];
        if rest.starts_with('{') {
            named.extend(group_heads(group_at(code, at + 1)));
        } else {
            let head: String = rest.chars().take_while(|&c| is_ident_char(c)).collect();
            named.insert(head);
        }
    }
    let mut at = 0;
    while let Some(found) = code[at..].find("super::") {
        let start = at + found;
        if code[..start].chars().next_back().is_some_and(is_ident_char) {
            at = start + 1;
            continue;
        }
        let mut ups = 0;
        let mut cursor = start;
        while code[cursor..].starts_with("super::") {
            ups += 1;
            cursor += "super::".len();
        }
        at = cursor;
        // Inline modules (`mod tests`) only add depth, so a chain shorter than the file's
        // module path stays inside its top-level module.
        if ups < module.len() {
            continue;
        }
        let rest = &code[cursor..];
        if rest.starts_with('{') {
            named.extend(group_heads(group_at(code, cursor + 1)));
        } else {
            let head: String = rest.chars().take_while(|&c| is_ident_char(c)).collect();
            named.insert(head);
        }
    }
    named
}

/// A file's module path under `core/src` (`data/loader.rs` → `["data", "loader"]`,
/// `data/mod.rs` → `["data"]`, `lib.rs` → `[]`).
fn module_path(file: &Path) -> Vec<String> {
    let relative = file
        .strip_prefix(core_src())
        .expect("a file under core/src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    let crate_root = parts.is_empty() && stem == "lib";
    if stem != "mod" && !crate_root {
        parts.push(stem.to_string());
    }
    parts
}

/// Every `crate::` path in napkin-core names a module on the same floor or one below.
#[test]
fn no_module_uses_a_floor_above_it() {
    let mut files = Vec::new();
    rust_files(&core_src(), &mut files);
    let floor_of = |name: &str| FLOORS.iter().position(|f| *f == name);
    let mut upward = Vec::new();
    for file in &files {
        let module = module_path(file);
        let Some(top) = module.first() else {
            continue; // lib.rs
        };
        let own = floor_of(top).unwrap_or_else(|| {
            panic!(
                "{}: top-level module `{top}` is on no floor of FLOORS",
                file.display()
            )
        });
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for name in named_top_modules(&code_only(&text), &module) {
            match floor_of(&name) {
                Some(floor) if floor > own => upward.push(format!(
                    "{} (floor {own}, `{top}`) uses `{name}` (floor {floor})",
                    file.strip_prefix(core_src()).unwrap_or(file).display()
                )),
                // Crate-root items (`crate::Result`) and the same module are fine.
                _ => {}
            }
        }
    }
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
}

/// Every `pub mod` of lib.rs is on a floor, and every floor is a module of lib.rs.
#[test]
fn every_module_has_a_floor() {
    let lib = std::fs::read_to_string(core_src().join("lib.rs")).expect("lib.rs");
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let floors: BTreeSet<&str> = FLOORS.iter().copied().collect();
    assert_eq!(declared, floors, "lib.rs's modules against FLOORS");
}

/// ARCHITECTURE.md's drawing of the floors (top floor first) lists the same modules in the
/// same order.
#[test]
fn architecture_md_draws_the_same_floors() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let section = doc
        .split("## Inside napkin-core: floors from the ground up")
        .nth(1)
        .expect("ARCHITECTURE.md has the floors section");
    let drawing = section
        .split("```")
        .nth(1)
        .expect("the floors section has a drawing in a code block");
    // Each floor starts a line with its name (`train/`, `rng.rs`); descriptions are indented.
    let mut drawn: Vec<String> = drawing
        .lines()
        .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .filter_map(|l| l.split_whitespace().next())
        .map(|name| {
            name.trim_end_matches('/')
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    drawn.reverse();
    assert_eq!(
        drawn, FLOORS,
        "ARCHITECTURE.md's floors (read bottom-up) against FLOORS"
    );
}

/// The reader sees through the forms the code uses: grouped imports, `super::` chains that
/// leave the module, and paths inside comments and strings (ignored).
#[test]
fn the_reader_finds_every_form_of_use() {
    let code = code_only(
        "use crate::{model::Llama, train::{a, b}};\n\
         // use crate::exercises::x;\n\
         let s = \"crate::report\";\n\
         let c = '\"'; fn f<'a>() { crate::io::read(); }\n\
         use super::super::data::X;\n\
         use super::sibling;\n",
    );
    let module = ["predict".to_string(), "inventory".to_string()];
    let named = named_top_modules(&code, &module);
    let expected: BTreeSet<String> = ["model", "train", "io", "data"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(named, expected);
}

/// Inside the kernels floor, `kernels/cpu/` (host values) and `kernels/gpu/` (cubecl) are two
/// rooms that do not use each other: what picks between them for one op lives beside them
/// (`kernels/norm_and_gating.rs`) or in `model/`.
#[test]
fn cpu_and_gpu_kernels_do_not_use_each_other() {
    let kernels = core_src().join("kernels");
    for (room, other) in [("cpu", "gpu"), ("gpu", "cpu")] {
        let mut files = Vec::new();
        rust_files(&kernels.join(room), &mut files);
        assert!(!files.is_empty(), "kernels/{room}/ has no files");
        for file in files {
            let code = code_only(&std::fs::read_to_string(&file).expect("a source file"));
            for form in [
                format!("kernels::{other}"),
                format!("super::{other}"),
                format!("super::super::{other}"),
            ] {
                assert!(
                    !code.contains(&form),
                    "{}: a kernels/{room}/ file names `{form}`",
                    file.display()
                );
            }
        }
    }
}
