//! The size rule for the daemon's sources (issue 38): no file in `daemon/ctxd/src` holds
//! more than [`MAX_CODE_LINES`] lines of code, tests beside the code excepted. A file past
//! it is split along its concerns (as `context/watcher/` was), so a reader can hold one
//! concern at a time. `cargo test -p ctxd` checks it.
//!
//! What counts: the lines before a file's inline test module (`#[cfg(test)]`, then
//! `mod … {`) that are neither blank nor only a comment. Test files beside the code
//! (`tests.rs`, declared `#[cfg(test)] mod tests;`) do not count.

use std::path::{Path, PathBuf};

const MAX_CODE_LINES: usize = 700;

/// The lines of code in a source file's text, by the rule above.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut count = 0;
    for (at, line) in lines.iter().enumerate() {
        if *line == "#[cfg(test)]" && opens_inline_module(&lines[at + 1..]) {
            break;
        }
        if !line.is_empty() && !line.starts_with("//") {
            count += 1;
        }
    }
    count
}

/// Whether the next item after an attribute is a module written inline (`mod name {`),
/// past blank lines, comments and further attributes.
fn opens_inline_module(rest: &[&str]) -> bool {
    rest.iter()
        .find(|line| !line.is_empty() && !line.starts_with("//") && !line.starts_with("#["))
        .is_some_and(|item| item.starts_with("mod ") && item.ends_with('{'))
}

fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "tests.rs") || path.components().any(|c| c.as_os_str() == "tests")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every counted file of `src/` with its code lines, by path relative to `src/`.
fn sizes() -> Vec<(String, usize)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut sizes: Vec<(String, usize)> = files
        .iter()
        .map(|path| path.strip_prefix(&src).unwrap())
        .filter(|relative| !is_test_file(relative))
        .map(|relative| {
            let text = std::fs::read_to_string(src.join(relative)).unwrap();
            (relative.to_string_lossy().into_owned(), code_lines(&text))
        })
        .collect();
    sizes.sort();
    sizes
}

#[test]
fn no_file_in_src_has_more_than_700_lines_of_code() {
    let sizes = sizes();
    assert!(sizes.len() > 50, "the walk found the sources: {} files", sizes.len());
    let over: Vec<String> = sizes
        .iter()
        .filter(|(_, lines)| *lines > MAX_CODE_LINES)
        .map(|(path, lines)| format!("{path}: {lines} lines of code"))
        .collect();
    assert!(over.is_empty(), "over {MAX_CODE_LINES} lines of code (split along its concerns): {over:#?}");
}

#[test]
fn code_lines_counts_code_before_the_inline_test_module_only() {
    let text = "\
//! Module doc.

use std::fmt;
#[cfg(test)]
mod tests_beside;

/// Doc.
fn one() {
    // A comment.
    let x = 1;

}
#[cfg(test)]
#[allow(dead_code)]
mod tests {
    fn not_counted() {}
}
";
    // `use`, `#[cfg(test)]`, `mod tests_beside;`, `fn one() {`, `let x = 1;`, `}`.
    assert_eq!(code_lines(text), 6);
}

#[test]
fn test_files_beside_the_code_are_not_counted() {
    assert!(is_test_file(Path::new("history/tests.rs")));
    assert!(is_test_file(Path::new("provider/tests/stream.rs")));
    assert!(!is_test_file(Path::new("context/watcher/state.rs")));
}
