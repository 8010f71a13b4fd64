//! Every design note the code cites is in the repository, and every
//! citation resolves.
//!
//! Comments cite a note as a path under `docs/` followed by the titles of
//! the sections meant, each in double quotes: the file name, a comma, then
//! `"Title"` (several titles are separated by commas), and the citation
//! may wrap across comment lines. This test reads the sources, manifests,
//! Makefile and Markdown files of the workspace, and fails, listing each
//! one, when a cited file does not exist, when a cited title is not a
//! heading of that file word for word, or when a note is named the old way
//! (by a name in capitals that points at no file).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Directories searched, recursively; any that is absent (a packaged crate
/// has no `sm/` or `cli/`) is skipped.
const ROOTS: &[&str] = &[
    "src",
    "sm",
    "cli",
    "tests",
    "examples",
    "bench",
    "test-support",
    "fuzz/fuzz_targets",
    "scripts",
    "docs",
];

/// Files searched at the top of the repository.
const TOP_FILES: &[&str] = &[
    "Cargo.toml",
    "Makefile",
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
];

#[test]
fn every_cited_note_and_section_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = searched_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("src/lib.rs")),
        "the search found no sources under {}",
        root.display()
    );
    // The names the notes had before they were in the repository, spelled
    // so that this file does not contain them.
    let old_names: Vec<String> = ["ETCD", "BACKEND", "LIVENESS"]
        .iter()
        .map(|n| format!("{n}-NOTES"))
        .collect();

    // This file's own examples are made up.
    let this_file = root.join(file!());
    let mut problems = Vec::new();
    let mut resolved = 0;
    for file in files.iter().filter(|f| **f != this_file) {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            for old in &old_names {
                if line.contains(old.as_str()) {
                    problems.push(format!(
                        "{shown}:{}: names {old}, which is no file; cite docs/<note>.md, \"<section>\"",
                        n + 1
                    ));
                }
            }
        }
        for citation in citations(&text) {
            let note = root.join(&citation.path);
            let Ok(doc) = fs::read_to_string(&note) else {
                problems.push(format!(
                    "{shown}:{}: cites {}, which does not exist",
                    citation.line, citation.path
                ));
                continue;
            };
            let titles = headings(&doc);
            for title in &citation.titles {
                if titles.contains(title) {
                    resolved += 1;
                } else {
                    problems.push(format!(
                        "{shown}:{}: cites {}, \"{title}\", which is not a heading there",
                        citation.line, citation.path
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} citation problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
    assert!(resolved > 0, "no citation of a docs/ note found at all");
}

/// A note's headings must be unique, or a citation by title is ambiguous.
#[test]
fn note_headings_are_unique() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut problems = Vec::new();
    for entry in fs::read_dir(&docs).expect("docs/ exists") {
        let path = entry.expect("a readable docs/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let text = fs::read_to_string(&path).expect("a readable note");
        let mut seen = BTreeSet::new();
        for title in heading_list(&text) {
            if !seen.insert(title.clone()) {
                problems.push(format!("{}: heading {title:?} twice", path.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks themselves, on made-up text.
#[test]
fn citations_are_found_across_comment_lines() {
    let text = "/// text (docs/a-b.md, \"One\", \"Two\nparts\"): more\n\
                //! docs/c.md, \"Three\", measured\n\
                # see docs/d.md\n\
                https://example.com/docs/e.md, \"Not ours\"\n";
    let found: Vec<(String, Vec<String>, usize)> = citations(text)
        .into_iter()
        .map(|c| (c.path, c.titles, c.line))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                "docs/a-b.md".into(),
                vec!["One".into(), "Two parts".into()],
                1
            ),
            ("docs/c.md".into(), vec!["Three".into()], 3),
            ("docs/d.md".into(), vec![], 4),
        ]
    );
    let doc = "# Top\n\n## Atomic write + notification\ntext\n```\n# not a heading\n```\n#### Deep `code`\n";
    assert_eq!(
        heading_list(doc),
        vec!["Top", "Atomic write + notification", "Deep `code`"]
    );
}

struct Citation {
    path: String,
    titles: Vec<String>,
    /// 1-based line of the path.
    line: usize,
}

/// The citations in `text`: `docs/<name>.md` not preceded by another path
/// segment or a URL, then `, "<title>"` any number of times. Comment
/// markers at the start of a line are dropped and line breaks inside a
/// citation read as one space.
fn citations(text: &str) -> Vec<Citation> {
    // One string of the text with comment markers removed, and for each of
    // its bytes the line it came from.
    let mut flat = String::new();
    let mut line_of = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let body = strip_comment_marker(line);
        if !flat.is_empty() {
            flat.push(' ');
            line_of.push(n + 1);
        }
        flat.push_str(body);
        line_of.extend(std::iter::repeat_n(n + 1, body.len()));
    }
    let bytes = flat.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = flat[from..].find("docs/").map(|i| i + from) {
        from = at + "docs/".len();
        let before = at.checked_sub(1).map(|i| bytes[i]);
        if matches!(before, Some(b) if b.is_ascii_alphanumeric() || b"/.-_:".contains(&b)) {
            continue;
        }
        let name_end = flat[from..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .map_or(flat.len(), |i| i + from);
        if !flat[name_end..].starts_with(".md") || name_end == from {
            continue;
        }
        let path_end = name_end + ".md".len();
        let mut citation = Citation {
            path: flat[at..path_end].to_string(),
            titles: Vec::new(),
            line: line_of[at],
        };
        let mut rest = path_end;
        while let Some(after_comma) = flat[rest..].trim_start().strip_prefix(',') {
            let after_comma = after_comma.trim_start();
            let Some(quoted) = after_comma.strip_prefix('"') else {
                break;
            };
            let Some(close) = quoted.find('"') else {
                break;
            };
            let title = quoted[..close].split_whitespace().collect::<Vec<_>>();
            citation.titles.push(title.join(" "));
            rest = flat.len() - quoted.len() + close + 1;
        }
        found.push(citation);
        from = rest;
    }
    found
}

fn strip_comment_marker(line: &str) -> &str {
    let t = line.trim_start();
    for marker in ["//!", "///", "//", "#", "*"] {
        if let Some(rest) = t.strip_prefix(marker) {
            return rest;
        }
    }
    t
}

/// The Markdown headings of `doc` (ATX `#` lines outside code fences),
/// without their `#`s.
fn heading_list(doc: &str) -> Vec<String> {
    let mut titles = Vec::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            titles.push(line[hashes..].trim().to_string());
        }
    }
    titles
}

fn headings(doc: &str) -> BTreeSet<String> {
    heading_list(doc).into_iter().collect()
}

fn searched_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = TOP_FILES
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.is_file())
        .collect();
    for dir in ROOTS {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    files
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            walk(&path, files);
        } else if ["rs", "toml", "md", "sh", "py"]
            .iter()
            .any(|e| path.extension().and_then(|x| x.to_str()) == Some(e))
            || name == "Makefile"
        {
            files.push(path);
        }
    }
}
