//! ARCHITECTURE.md is the code map; a map that names files which are gone or moved
//! misleads every reader. This test reads every backticked name in it that looks like a
//! path of the repository and checks that the repository has it, so a rename that
//! forgets the map fails here rather than in a reader's search.
//!
//! What counts as a path: one token without spaces, made of path characters, that ends
//! with `/` (a folder) or a file extension of the repository's files, or that has a `/`
//! and starts at a top-level entry of the repository. Names on the user's machine
//! (`~/.claude`, `<state dir>/…`, `/proc`) and protocol names (`ctx/append`,
//! `$/progress`) are not paths of the repository and are left out by their first
//! character or prefix.
//!
//! Where a path may be: at the repository's root, or anywhere under the folder that the
//! current `###` section is about (`### \`daemon/ctxd\`` makes `read.rs` mean a file
//! somewhere under `daemon/ctxd`), as a whole trailing part of a path there. Outside such
//! a section, anywhere in the repository.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::BTreeSet;
use std::path::Path;

use ctxd_e2e::repo_root;

/// File extensions of repository files the map names.
const EXTENSIONS: &[&str] = &["rs", "md", "json", "jsonl", "ts", "js", "py", "lua", "toml", "txt", "sh"];

/// Names with a path's shape that are not files of this repository: Claude Code's
/// files on the user's machine.
const NOT_OURS: &[&str] = &[".claude.json", ".mcp.json", "cli.js"];

/// Protocol names and other slash-separated words that are not paths.
const NOT_PATH_PREFIXES: &[&str] = &["ctx/", "system/", "$", "/", "~", "<", ".await"];

/// Every file and folder of the repository, relative to its root, `/`-separated (build
/// output, dependencies and git's own files left out).
fn repo_entries(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let file_type = entry.file_type().unwrap();
            if file_type.is_dir() && matches!(name.as_str(), "target" | "node_modules" | ".git" | ".vscode-test") {
                continue;
            }
            let relative = entry.path().strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            out.insert(relative);
            if file_type.is_dir() {
                walk(root, &entry.path(), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// The backticked tokens of one line.
fn backticked(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// Whether a backticked token names a path of the repository (see the module docs).
fn looks_like_repo_path(token: &str, top_level: &BTreeSet<String>) -> bool {
    if token.is_empty() || token.chars().any(char::is_whitespace) || NOT_OURS.contains(&token) {
        return false;
    }
    if NOT_PATH_PREFIXES.iter().any(|p| token.starts_with(p)) {
        return false;
    }
    if !token.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c)) {
        return false;
    }
    let trimmed = token.trim_end_matches('/');
    let has_extension = trimmed
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && !stem.ends_with('/') && EXTENSIONS.contains(&ext));
    let first = trimmed.split('/').next().unwrap_or_default();
    has_extension || token.ends_with('/') || (token.contains('/') && top_level.contains(first))
}

/// Whether `path` is at the root, or is the whole trailing part of an entry under `scope`.
fn found(path: &str, scope: Option<&str>, entries: &BTreeSet<String>) -> bool {
    let path = path.trim_end_matches('/');
    if entries.contains(path) {
        return true;
    }
    entries.iter().any(|entry| {
        let in_scope = scope.is_none_or(|s| entry.starts_with(&format!("{s}/")));
        in_scope && (entry == path || entry.ends_with(&format!("/{path}")))
    })
}

/// A path the map names: its line (from 1), the token, and the folder of its section.
struct Named {
    line: usize,
    token: String,
    scope: Option<String>,
}

/// Every backticked token of `text` that looks like a path of the repository.
fn named_paths(text: &str, entries: &BTreeSet<String>) -> Vec<Named> {
    let top_level: BTreeSet<String> = entries.iter().filter(|e| !e.contains('/')).cloned().collect();
    let mut scope: Option<String> = None;
    let mut named = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            scope = None;
        } else if let Some(heading) = line.strip_prefix("### ") {
            // The section is about the folder its heading names first, if it is one.
            scope =
                backticked(heading).next().map(|t| t.trim_end_matches('/').to_owned()).filter(|t| entries.contains(t));
        }
        for token in backticked(line).filter(|t| looks_like_repo_path(t, &top_level)) {
            named.push(Named { line: number + 1, token: token.to_owned(), scope: scope.clone() });
        }
    }
    named
}

/// The paths `text` names that the repository does not have, with their lines.
fn missing_paths(text: &str, entries: &BTreeSet<String>) -> Vec<String> {
    named_paths(text, entries)
        .into_iter()
        .filter(|n| !found(&n.token, n.scope.as_deref(), entries))
        .map(|n| {
            let within = n.scope.map(|s| format!(" (under {s})")).unwrap_or_default();
            format!("line {}: `{}`{within}", n.line, n.token)
        })
        .collect()
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let entries = repo_entries(&root);
    let missing = missing_paths(&text, &entries);
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths the repository does not have:\n{}", missing.join("\n"));
    // The check reads paths at all.
    let named = named_paths(&text, &entries);
    assert!(named.iter().any(|n| n.token == "read.rs"), "the transport's reader is not among the paths read");
    let named = named.len();
    assert!(named > 100, "only {named} paths found in ARCHITECTURE.md");
}

#[test]
fn a_path_that_is_gone_or_outside_is_reported() {
    let entries: BTreeSet<String> = [
        "daemon",
        "daemon/ctxd",
        "daemon/ctxd/src",
        "daemon/ctxd/src/wire.rs",
        "tests",
        "tests/src",
        "tests/src/lib.rs",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let text = "\
intro `../elsewhere/DESIGN.md`, `ctx/append`, `~/.claude`, `<state dir>/ctxd.sock`
### `daemon/ctxd` (crate)
- `wire.rs` and `gone.rs`; `src/lib.rs` is not under daemon/ctxd
## Invariants
`src/lib.rs` anywhere; `daemon/ctxd/src/old/` is gone
";
    assert_eq!(
        missing_paths(text, &entries),
        vec![
            "line 1: `../elsewhere/DESIGN.md`".to_owned(),
            "line 3: `gone.rs` (under daemon/ctxd)".to_owned(),
            "line 3: `src/lib.rs` (under daemon/ctxd)".to_owned(),
            "line 5: `daemon/ctxd/src/old/`".to_owned(),
        ]
    );
}
