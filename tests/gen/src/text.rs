//! The words, code and command output the generated sessions are made of. Sizes are in
//! bytes (all text here is ASCII, apart from the `→` of numbered lines added elsewhere).

use crate::rng::Rng;

/// The vocabulary of a session about a context-managing daemon.
const WORDS: &[&str] = &[
    "context",
    "window",
    "token",
    "summary",
    "compact",
    "boundary",
    "session",
    "transcript",
    "daemon",
    "editor",
    "request",
    "cache",
    "model",
    "tool",
    "result",
    "file",
    "memory",
    "watcher",
    "budget",
    "snip",
    "collapse",
    "restore",
    "skill",
    "hook",
    "status",
    "usage",
    "threshold",
    "pipeline",
    "record",
    "ledger",
    "index",
    "frame",
    "reader",
    "writer",
    "queue",
    "retry",
    "limit",
    "parser",
    "schema",
    "client",
    "server",
    "store",
];
const VERBS: &[&str] =
    &["fix", "explain", "rename", "test", "refactor", "check", "measure", "document", "simplify", "split", "review"];
const TYPES: &[&str] = &["usize", "u64", "bool", "String", "Option<Record>", "Vec<Value>", "Result<(), Error>"];
const COMMANDS: &[&str] = &["cargo test -p", "cargo build -p", "cargo clippy -p", "cargo bench -p", "rg -n"];

pub fn word(rng: &mut Rng) -> &'static str {
    WORDS[rng.count(0, WORDS.len() - 1)]
}

/// `n` words separated by spaces.
pub fn phrase(rng: &mut Rng, n: usize) -> String {
    (0..n).map(|_| word(rng)).collect::<Vec<_>>().join(" ")
}

/// Between `lo` and `hi` words as sentences (capitalized, each ending with a full stop),
/// on one line.
pub fn sentences(rng: &mut Rng, lo: usize, hi: usize) -> String {
    let mut left = rng.count(lo, hi);
    let mut out = String::new();
    while left > 0 {
        let n = rng.count(4, 14).min(left);
        left -= n;
        let mut sentence = phrase(rng, n);
        sentence[..1].make_ascii_uppercase();
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&sentence);
        out.push('.');
    }
    out
}

/// A user's prompt: a request, then some detail, on one line.
pub fn prompt(rng: &mut Rng) -> String {
    let verb = rng.pick(VERBS);
    let mut out = format!("Please {verb} the {} {}", word(rng), word(rng));
    if rng.chance(0.5) {
        out.push_str(&format!(" in src/{}.rs", word(rng)));
    }
    out.push('.');
    let detail = sentences(rng, 4, 70);
    if !detail.is_empty() {
        out.push(' ');
        out.push_str(&detail);
    }
    out
}

/// The size of a tool result: log-normal with a median near 2 KB, about one in twenty
/// over 16 KB, clamped to 40 B..200 KB.
pub fn result_size(rng: &mut Rng) -> usize {
    (rng.log_normal(7.6, 1.3) as usize).clamp(40, 200_000)
}

/// `src/<word>/<word>_<n>.rs`.
pub fn source_path(rng: &mut Rng) -> String {
    format!("src/{}/{}_{}.rs", word(rng), word(rng), rng.between(0, 60))
}

/// Appends lines from `line` until `size` bytes, then cuts to exactly `size` (at most).
fn fill(rng: &mut Rng, size: usize, mut line: impl FnMut(&mut Rng) -> String) -> String {
    let mut out = String::with_capacity(size + 80);
    while out.len() < size {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line(rng));
    }
    out.truncate(size);
    out
}

/// Rust-looking source of `size` bytes: functions of a few statements.
pub fn code(rng: &mut Rng, size: usize) -> String {
    let mut depth = 0;
    fill(rng, size, |rng| {
        if depth == 0 {
            depth = rng.count(2, 8);
            return format!("pub fn {}_{}(&self) -> {} {{", word(rng), rng.between(0, 99), rng.pick(TYPES));
        }
        depth -= 1;
        match (depth, rng.count(0, 5)) {
            (0, _) => "}".to_owned(),
            (_, 0) => {
                let n = rng.count(3, 9);
                format!("    // {}", phrase(rng, n))
            }
            (_, 1) => format!("    if self.{}.is_empty() {{ return {}::default(); }}", word(rng), rng.pick(TYPES)),
            _ => format!("    let {}_{} = self.{}({});", word(rng), rng.between(0, 999), word(rng), rng.between(0, 99)),
        }
    })
}

/// A shell command a coding agent runs.
pub fn command(rng: &mut Rng) -> String {
    format!("{} {}", rng.pick(COMMANDS), word(rng))
}

/// Build or test output of `size` bytes.
pub fn log(rng: &mut Rng, size: usize) -> String {
    fill(rng, size, |rng| match rng.count(0, 3) {
        0 => format!("   Compiling {} v0.{}.{}", word(rng), rng.between(1, 9), rng.between(0, 20)),
        1 => format!("test {}::{}_{} ... ok", word(rng), word(rng), rng.between(0, 99)),
        2 => format!("warning: unused variable `{}`", word(rng)),
        _ => format!("    Finished `dev` profile in {}.{:02}s", rng.between(0, 90), rng.between(0, 99)),
    })
}

/// Search hits of about `size` bytes (`path:line: text`), and their count.
pub fn matches(rng: &mut Rng, size: usize) -> (String, usize) {
    let text = fill(rng, size, |rng| format!("src/{}.rs:{}: {}", word(rng), rng.between(1, 900), phrase(rng, 8)));
    let lines = text.lines().count();
    (text, lines)
}
