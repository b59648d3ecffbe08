//! The documents hold together: README.md is short and starts with what a newcomer needs, every
//! chapter of the book (`docs/`, an mdBook) is in its table of contents and short, and every
//! relative link, `{{#include}}` and `docs/….md` named in the code points at a file (and a link's
//! `#anchor` at one of its headings).
//!
//! The book's HTML is built by `scripts/book.sh` (mdBook), which fails on its own warnings;
//! mdBook does not check links between pages, so this test does.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// README.md's longest allowed length: what a newcomer reads in two minutes.
const README_MAX_LINES: usize = 200;
/// A chapter's longest allowed length (the generated CLI reference excepted).
const CHAPTER_MAX_LINES: usize = 300;
/// What a terminal's first screen of README.md must show.
const FIRST_SCREEN_LINES: usize = 50;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The book's chapters: every `.md` file under docs/.
fn chapters() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The documents a reader opens: the top-level ones and the book.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
    ]
    .iter()
    .map(|name| root.join(name))
    .collect();
    docs.extend(chapters());
    docs
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose_lines(text: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push(String::new());
            continue;
        }
        if in_fence {
            out.push(String::new());
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push(kept);
    }
    out
}

/// Every `[text](target)` link target in the prose, with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// The anchors mdBook and GitHub give a file's headings: lower case, letters, digits, `-` and
/// `_` kept, spaces made `-`, everything else dropped.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim().replace('`', "");
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        out.insert(slug);
    }
    out
}

/// `path` with `.` and `..` folded, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn readme_is_short_and_starts_with_what_a_newcomer_needs() {
    let readme = read(&root().join("README.md"));
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= README_MAX_LINES,
        "README.md has {} lines; at most {README_MAX_LINES} (move the rest into a chapter of docs/)",
        lines.len()
    );
    let first_screen = lines[..lines.len().min(FIRST_SCREEN_LINES)].join("\n");
    for needed in [
        "scripts/sandbox.sh",
        "scripts/test.sh",
        "cargo install",
        "napkin train",
    ] {
        assert!(
            first_screen.contains(needed),
            "README.md's first {FIRST_SCREEN_LINES} lines do not show `{needed}`"
        );
    }
    // .ci/run runs the README's test command.
    let ci = read(&root().join(".ci/run"));
    assert!(
        ci.contains("bash scripts/test.sh"),
        ".ci/run must run README's test command, scripts/test.sh"
    );
}

#[test]
fn every_chapter_is_in_the_table_of_contents_and_short() {
    let docs = root().join("docs");
    let summary = read(&docs.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|(_, target)| normalise(&docs.join(target)))
        .collect();
    for listed_chapter in &listed {
        assert!(
            listed_chapter.is_file(),
            "docs/SUMMARY.md lists {}, which does not exist",
            relative(listed_chapter)
        );
    }
    for chapter in chapters() {
        let name = chapter.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&chapter),
            "{} is not in docs/SUMMARY.md: mdBook would not build it",
            relative(&chapter)
        );
        if name == "cli.md" {
            continue; // generated from clap, as long as the flags are
        }
        let lines = read(&chapter).lines().count();
        assert!(
            lines <= CHAPTER_MAX_LINES,
            "{} has {lines} lines; a page holds at most {CHAPTER_MAX_LINES} (split it)",
            relative(&chapter)
        );
    }
}

#[test]
fn every_relative_link_and_include_resolves() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().expect("a document's folder");
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                normalise(&dir.join(file))
            };
            if !path.exists() {
                broken.push(format!("{}:{line}: {target}: no such file", relative(&doc)));
                continue;
            }
            if let Some(anchor) = anchor
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&path)).contains(anchor)
            {
                broken.push(format!(
                    "{}:{line}: {target}: no heading with anchor `{anchor}`",
                    relative(&doc)
                ));
            }
        }
        for (n, line) in text.lines().enumerate() {
            let Some(start) = line.find("{{#include ") else {
                continue;
            };
            let spec = line[start + "{{#include ".len()..]
                .split("}}")
                .next()
                .unwrap_or("");
            let file = spec.trim().split(':').next().unwrap_or("");
            if !normalise(&dir.join(file)).is_file() {
                broken.push(format!(
                    "{}:{}: include {file}: no such file",
                    relative(&doc),
                    n + 1
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Files that may name a chapter or a script: the source, the scripts, the documents.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !matches!(
                name,
                "target" | "node_modules" | "dist" | "models" | "runs" | "corpus"
            ) && !name.starts_with('.')
            {
                sources(&path, out);
            }
        } else if ["rs", "sh", "py", "mjs", "toml", "ipynb", "md"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

/// Every `docs/….md` chapter and `scripts/…` file named in the code, the scripts and the
/// documents exists, so a moved page or script cannot leave a stale name behind.
#[test]
fn every_chapter_and_script_the_tree_names_exists() {
    let root = root();
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.push(root.join(".ci/run"));
    let mut missing = BTreeSet::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for folder in ["docs/", "scripts/"] {
            let mut from = 0;
            while let Some(found) = text[from..].find(folder) {
                let at = from + found;
                from = at + folder.len();
                // Only the repository's own folders: `docs/x` or ` scripts/x`, not `web/docs/x`.
                let standalone = text[..at].chars().last().is_none_or(|c| {
                    !(c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '.'))
                });
                let tail = &text[at..];
                let end = tail
                    .find(|c: char| {
                        !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
                    })
                    .unwrap_or(tail.len());
                let named = tail[..end].trim_end_matches('.');
                let is_file = [".md", ".sh", ".py", ".txt", ".mjs"]
                    .iter()
                    .any(|e| named.ends_with(e));
                if standalone && is_file && !root.join(named).is_file() {
                    missing.insert(format!("{}: {named}", relative(&file)));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but missing:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}
