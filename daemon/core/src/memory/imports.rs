//! `@path` imports: finding them in a memory file's text and loading what they name.
//!
//! An import pulls another file into the context right after the file that names it,
//! depth-first (a file's own imports come before its importer's next import). Each
//! imported file is its own entry carrying the chain that led to it, so a context view
//! can show why it is there. Cycles and chains past the hop limit are reported, not
//! followed; a character budget per top-level file bounds what a fan-out can add.
//!
//! What counts as an import: `@` at the start of a line or after whitespace, followed
//! by a path (spaces escaped as `\ `). `a@b.com` is not one, and neither is anything in
//! an inline code span or a fenced code block, where `@` is usually code (decorators,
//! npm scopes) rather than a request to load a file.

use std::path::{Path, PathBuf};

use super::discover::Read;
use super::{Cut, Diagnostic, MemoryEntry, MemoryFs, MemoryKind, MemorySet, Problem, Status};

/// The `@path` strings in `text`, in order, as written (not yet resolved).
pub fn find_imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    let mut paragraph: Vec<&str> = Vec::new();
    for line in text.lines() {
        if let Some((ch, len)) = fence {
            if closes_fence(line, ch, len) {
                fence = None;
            }
            continue;
        }
        if let Some(open) = opens_fence(line) {
            scan_paragraph(&paragraph, &mut out);
            paragraph.clear();
            fence = Some(open);
        } else if line.trim().is_empty() {
            // Code spans cannot cross a blank line, so paragraphs are scanned one by one.
            scan_paragraph(&paragraph, &mut out);
            paragraph.clear();
        } else {
            paragraph.push(line);
        }
    }
    scan_paragraph(&paragraph, &mut out);
    out
}

/// A line opening a fenced block: three or more backticks or tildes. Indentation is
/// allowed (fences inside list items); a backtick "fence" with a backtick later on the
/// line is inline code instead.
fn opens_fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let ch = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == ch).count();
    if len < 3 || (ch == '`' && trimmed[len..].contains('`')) {
        return None;
    }
    Some((ch, len))
}

fn closes_fence(line: &str, ch: char, len: usize) -> bool {
    let trimmed = line.trim();
    trimmed.len() >= len && trimmed.chars().all(|c| c == ch)
}

fn scan_paragraph(lines: &[&str], out: &mut Vec<String>) {
    if lines.is_empty() {
        return;
    }
    let chars: Vec<char> = lines.join("\n").chars().collect();
    let code = code_span_mask(&chars);
    let mut i = 0;
    while i < chars.len() {
        let starts_import = chars[i] == '@' && !code[i] && (i == 0 || chars[i - 1].is_whitespace());
        if !starts_import {
            i += 1;
            continue;
        }
        let mut token = String::new();
        let mut j = i + 1;
        while j < chars.len() && !code[j] {
            match chars[j] {
                '\\' if chars.get(j + 1) == Some(&' ') => {
                    token.push(' ');
                    j += 2;
                }
                c if c.is_whitespace() => break,
                c => {
                    token.push(c);
                    j += 1;
                }
            }
        }
        if let Some(path) = clean_token(&token) {
            out.push(path);
        }
        i = j;
    }
}

/// Marks the characters inside inline code spans: a run of N backticks up to the next
/// run of exactly N. A run with no closer is plain text.
fn code_span_mask(chars: &[char]) -> Vec<bool> {
    let mut code = vec![false; chars.len()];
    let run_at = |k: usize| chars[k..].iter().take_while(|c| **c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = run_at(i);
        let mut k = i + open;
        let mut close = None;
        while k < chars.len() {
            if chars[k] == '`' {
                let run = run_at(k);
                if run == open {
                    close = Some(k + run);
                    break;
                }
                k += run;
            } else {
                k += 1;
            }
        }
        match close {
            Some(end) => {
                code[i..end].iter_mut().for_each(|c| *c = true);
                i = end;
            }
            None => i += open,
        }
    }
    code
}

/// Turns the text after `@` into a path, or `None` when it does not look like one.
/// Sentence punctuation after a path (`see @a.md.`) and `#fragments` are dropped.
fn clean_token(token: &str) -> Option<String> {
    let mut path = token.split('#').next().unwrap_or_default().to_owned();
    loop {
        let mut tail = path.chars().rev();
        let last = tail.next();
        let before = tail.next();
        match last {
            Some(',' | ';' | ':' | '!' | '?' | ')' | ']' | '}' | '"' | '\'') => {}
            Some('.') if before.is_some_and(char::is_alphanumeric) => {}
            _ => break,
        }
        path.pop();
    }
    let first = path.chars().next()?;
    let plausible = first.is_alphanumeric() || matches!(first, '.' | '/' | '~' | '_' | '-');
    plausible.then_some(path)
}

/// Where an import points: `~` is the home directory, absolute paths stay, anything
/// else is relative to the importing file's folder.
pub(super) fn resolve(spec: &str, importer_dir: &Path, home: &Path) -> PathBuf {
    let joined = if spec == "~" {
        home.to_path_buf()
    } else if let Some(rest) = spec.strip_prefix("~/") {
        home.join(rest)
    } else if Path::new(spec).is_absolute() {
        PathBuf::from(spec)
    } else {
        importer_dir.join(spec)
    };
    super::normalize(&joined)
}

/// State of one import walk under a top-level entry.
struct Walk {
    slot: u8,
    source: u32,
    next_import: u32,
    budget_left: usize,
    added: Vec<usize>,
}

impl MemorySet {
    /// Loads the imports under the top-level entry `root`, each placed after its
    /// importer. Returns the ids of the entries added.
    pub(super) fn load_imports(&mut self, root: usize, fs: &dyn MemoryFs) -> Vec<usize> {
        let Some(entry) = self.entries.get(root) else {
            return Vec::new();
        };
        let (slot, source, _) = entry.order;
        let chain = vec![entry.path.clone()];
        let text = entry.content.clone();
        let mut walk =
            Walk { slot, source, next_import: 1, budget_left: self.config.max_import_chars, added: Vec::new() };
        self.import_from(&text, &chain, fs, &mut walk);
        walk.added
    }

    fn import_from(&mut self, text: &str, chain: &[PathBuf], fs: &dyn MemoryFs, walk: &mut Walk) {
        let Some(importer) = chain.last() else {
            return;
        };
        let importer_dir = importer.parent().unwrap_or(Path::new("/")).to_path_buf();
        for spec in find_imports(text) {
            let path = resolve(&spec, &importer_dir, &self.config.home);
            if chain.contains(&path) {
                self.diagnose(path, Problem::ImportCycle { chain: chain.to_vec() });
                continue;
            }
            // Already in the context (another import, or a memory file of its own).
            if self.loaded.contains(&path) {
                continue;
            }
            if !self.may_import(&path, &chain[0], fs) {
                let importer = importer.clone();
                self.diagnose(path, Problem::ImportOutside { importer });
                continue;
            }
            // The chain holds the top-level file plus one file per hop taken so far.
            if chain.len() > self.config.max_import_depth {
                let max_depth = self.config.max_import_depth;
                self.diagnose(path, Problem::ImportTooDeep { chain: chain.to_vec(), max_depth });
                continue;
            }
            if walk.budget_left == 0 {
                let budget_chars = self.config.max_import_chars;
                let importer = importer.clone();
                self.diagnose(path, Problem::ImportBudgetSpent { importer, budget_chars });
                continue;
            }
            let text = match self.read_text(fs, &path) {
                Read::Text(text) => text,
                Read::Missing => {
                    let importer = importer.clone();
                    self.diagnose(path, Problem::ImportNotFound { importer });
                    continue;
                }
                Read::Failed => continue,
            };
            let (mut content, mut cut) = super::discover::cap_chars(text, self.config.max_file_chars);
            let chars = content.chars().count();
            if chars > walk.budget_left {
                let total_chars = match &cut {
                    Some(Cut::FileCap { total_chars, .. }) => *total_chars,
                    _ => chars,
                };
                let (kept, _) = super::discover::cap_chars(content, walk.budget_left);
                content = kept;
                cut = Some(Cut::ImportBudget { kept_chars: walk.budget_left, total_chars });
            }
            walk.budget_left -= content.chars().count();
            self.loaded.insert(path.clone());
            let id = self.entries.len();
            self.entries.push(MemoryEntry {
                path: path.clone(),
                kind: MemoryKind::Import,
                content: content.clone(),
                status: Status::Active,
                cut,
                imported_by: chain.to_vec(),
                rule_paths: Vec::new(),
                order: (walk.slot, walk.source, walk.next_import),
            });
            walk.next_import += 1;
            walk.added.push(id);
            let mut deeper = chain.to_vec();
            deeper.push(path);
            self.import_from(&content, &deeper, fs, walk);
        }
    }

    /// Whether an import may read `path`: where it really leads (symlinks resolved) lies
    /// in the project, `~/.claude`, the folder of the chain's top-level file `top` or an
    /// allowed folder, and never in `/proc`, `/sys` or `/dev`.
    fn may_import(&self, path: &Path, top: &Path, fs: &dyn MemoryFs) -> bool {
        let real = fs.real_path(path);
        if ["/proc", "/sys", "/dev"].iter().any(|system| real.starts_with(system)) {
            return false;
        }
        let top_dir = top.parent().unwrap_or(Path::new("/"));
        let claude = self.config.home.join(".claude");
        let roots = [self.cwd.as_path(), claude.as_path(), top_dir].into_iter();
        roots
            .chain(self.config.import_roots.iter().map(PathBuf::as_path))
            .any(|root| real.starts_with(fs.real_path(root)))
    }

    /// Records a problem once, however often the same one is met.
    pub(super) fn diagnose(&mut self, path: PathBuf, problem: Problem) {
        let diagnostic = Diagnostic { path, problem };
        if !self.diagnostics.contains(&diagnostic) {
            self.diagnostics.push(diagnostic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_imports_at_line_start_and_after_space() {
        let text = "@a.md\nSee @docs/b.md and @~/c.md, also @/abs/d.md.\n- @e\\ f.md";
        assert_eq!(find_imports(text), ["a.md", "docs/b.md", "~/c.md", "/abs/d.md", "e f.md"]);
    }

    #[test]
    fn email_and_mid_word_at_are_not_imports() {
        assert!(find_imports("mail a@b.com or x@y, (@paren) \"@quoted\"").is_empty());
    }

    #[test]
    fn code_spans_are_ignored_but_text_around_them_is_not() {
        let text = "Use `@Override` and ``a ` @b`` then @real.md\n`@c` @after.md";
        assert_eq!(find_imports(text), ["real.md", "after.md"]);
    }

    #[test]
    fn unclosed_backtick_is_plain_text() {
        assert_eq!(find_imports("a ` @x.md"), ["x.md"]);
    }

    #[test]
    fn fenced_blocks_are_ignored() {
        let text = "@one.md\n```ts\n@Component\n@two.md\n```\n~~~~\n@three.md\n~~~\nstill fenced @four.md\n~~~~\n  ```\n  @five.md\n  ```\n@six.md";
        assert_eq!(find_imports(text), ["one.md", "six.md"]);
    }

    #[test]
    fn unclosed_fence_runs_to_the_end() {
        assert_eq!(find_imports("@a.md\n```\n@b.md\n"), ["a.md"]);
    }

    #[test]
    fn code_span_does_not_cross_a_blank_line() {
        assert_eq!(find_imports("a ` b\n\n@c.md `"), ["c.md"]);
    }

    #[test]
    fn fragments_and_non_paths_are_dropped() {
        assert_eq!(find_imports("@guide.md#setup @@x @# @"), ["guide.md"]);
    }

    #[test]
    fn resolve_relative_home_and_absolute() {
        let dir = Path::new("/w/p/docs");
        let home = Path::new("/home/u");
        assert_eq!(resolve("../x.md", dir, home), PathBuf::from("/w/p/x.md"));
        assert_eq!(resolve("./y.md", dir, home), PathBuf::from("/w/p/docs/y.md"));
        assert_eq!(resolve("~/z.md", dir, home), PathBuf::from("/home/u/z.md"));
        assert_eq!(resolve("/etc/a.md", dir, home), PathBuf::from("/etc/a.md"));
    }
}
