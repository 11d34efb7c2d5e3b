//! Counting the identifiers and words a session keeps coming back to, for the "Key
//! Technical Concepts" section.
//!
//! Without a model there is no understanding of what matters, but frequency is a fair
//! proxy once noise is removed: English filler and language keywords are dropped,
//! ids and hashes are dropped, and code-shaped names (`snake_case`, `camelCase`,
//! `PascalCase`) weigh more than plain words because they are what a model continuing
//! the work has to type again. Counting is one pass over bytes with one map lookup per
//! token, so it stays cheap on multi-megabyte sessions.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A small, fast, deterministic hasher for short keys (the multiply-rotate scheme of
/// rustc's `FxHasher`). Token lookups are the hot loop of the concepts count; SipHash's
/// protection against crafted keys buys nothing for counting words of a transcript.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Map type for the scanner's lookups.
pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
pub(super) type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

/// What a token seen before counts towards.
const IGNORED: u32 = u32::MAX;

/// Running counts of tokens seen in the session.
#[derive(Debug)]
pub(super) struct Terms {
    /// Every distinct token as written → its slot in `counts` (or `IGNORED`), so each
    /// token is classified once and then costs one lookup.
    seen: FastMap<Box<str>, u32>,
    /// Counted terms: code-shaped names as written, plain words in lower case.
    counts: Vec<(Box<str>, u32)>,
    /// Lower-case word → slot, so "Watcher" and "watcher" share a count.
    words: FastMap<Box<str>, u32>,
    /// `STOP_WORDS` as a set.
    stop: FastSet<&'static str>,
}

impl Default for Terms {
    fn default() -> Terms {
        Terms {
            seen: FastMap::default(),
            counts: Vec::new(),
            words: FastMap::default(),
            stop: STOP_WORDS.iter().copied().collect(),
        }
    }
}

/// A ranked term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ranked {
    pub term: String,
    pub count: u32,
}

/// Words too common to say anything about a session: English filler and the keywords
/// of the languages agents most often touch.
const STOP_WORDS: &[&str] = &[
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "also",
    "and",
    "any",
    "are",
    "around",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "can",
    "cannot",
    "could",
    "did",
    "does",
    "doing",
    "done",
    "down",
    "during",
    "each",
    "either",
    "else",
    "even",
    "every",
    "few",
    "for",
    "from",
    "further",
    "get",
    "gets",
    "given",
    "had",
    "has",
    "have",
    "having",
    "her",
    "here",
    "hers",
    "him",
    "his",
    "how",
    "however",
    "into",
    "its",
    "itself",
    "just",
    "let",
    "like",
    "look",
    "made",
    "make",
    "many",
    "may",
    "might",
    "more",
    "most",
    "much",
    "must",
    "need",
    "needs",
    "not",
    "now",
    "off",
    "once",
    "one",
    "only",
    "other",
    "our",
    "ours",
    "out",
    "over",
    "own",
    "please",
    "same",
    "see",
    "should",
    "since",
    "some",
    "still",
    "such",
    "sure",
    "take",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "thing",
    "things",
    "this",
    "those",
    "through",
    "too",
    "two",
    "under",
    "until",
    "use",
    "used",
    "uses",
    "using",
    "very",
    "want",
    "was",
    "way",
    "well",
    "were",
    "what",
    "when",
    "where",
    "whether",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "within",
    "without",
    "would",
    "yes",
    "yet",
    "you",
    "your",
    "yours",
    "okay",
    "let's",
    "i'll",
    "i'm",
    "it's",
    "don't",
    "now",
    "first",
    "next",
    "last",
    "new",
    "old",
    "good",
    "know",
    "think",
    "going",
    "right",
    "back",
    "line",
    "lines",
    "file",
    "files",
    "step",
    "steps",
    "done",
    "able",
    "already",
    "another",
    "instead",
    "check",
    "change",
    "changes",
    // Keywords and near-keywords of common languages.
    "async",
    "await",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "class",
    "const",
    "continue",
    "crate",
    "def",
    "default",
    "elif",
    "enum",
    "except",
    "export",
    "extern",
    "false",
    "final",
    "finally",
    "float",
    "func",
    "function",
    "impl",
    "import",
    "int",
    "interface",
    "lambda",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "nil",
    "none",
    "null",
    "package",
    "pass",
    "private",
    "protected",
    "pub",
    "public",
    "raise",
    "readonly",
    "ref",
    "return",
    "self",
    "static",
    "str",
    "string",
    "struct",
    "super",
    "switch",
    "throw",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "undefined",
    "unsafe",
    "usize",
    "var",
    "void",
    "where",
    "yield",
    "some",
    "err",
    "println",
    "print",
    "console",
    "log",
    "test",
    "tests",
    "todo",
    "http",
    "https",
    "www",
    "com",
    "org",
];

/// Shape of a token once it passed the noise filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `snake_case`, `camelCase`, `PascalCase`: kept as written.
    Code,
    /// An ordinary word: counted in lower case.
    Word,
}

fn shape(token: &str) -> Option<Shape> {
    let bytes = token.as_bytes();
    if bytes.len() < 3 || bytes.len() > 48 || bytes[0].is_ascii_digit() {
        return None;
    }
    let digits = bytes.iter().filter(|b| b.is_ascii_digit()).count();
    let letters = bytes.iter().filter(|b| b.is_ascii_alphabetic()).count();
    // Ids, hashes and counters: many digits, or long mixed runs like tool-use ids.
    if letters < 2 || digits >= 4 || (bytes.len() >= 16 && digits > 0) {
        return None;
    }
    if bytes.len() >= 8 && digits > 0 && bytes.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    // `word_12`: a numbered variant, not a name anyone would look up.
    let numbered = token.rsplit_once('_').is_some_and(|(stem, n)| {
        !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && !stem.contains('_')
            && stem.bytes().all(|b| b.is_ascii_lowercase())
    });
    if numbered {
        return None;
    }
    let inner_underscore = token.trim_matches('_').contains('_');
    let camel = bytes.windows(2).any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
    if inner_underscore || camel {
        Some(Shape::Code)
    } else if token.starts_with('_') || digits > 0 {
        // `__init__`, `v2`: rarely a concept on their own.
        None
    } else {
        Some(Shape::Word)
    }
}

impl Terms {
    /// Counts the tokens of `text`, each `weight` times.
    pub(super) fn add(&mut self, text: &str, weight: u32) {
        self.add_bytes(text, weight, false);
    }

    /// Counts the tokens of raw JSON text (a string literal as stored, escapes and
    /// all), so a tool result need not be decoded just to be counted: `\n`, `\t` and
    /// `\uXXXX` separate tokens instead of gluing an `n` or `t` onto the next word.
    pub(super) fn add_json(&mut self, raw: &str, weight: u32) {
        self.add_bytes(raw, weight, true);
    }

    fn add_bytes(&mut self, text: &str, weight: u32, json: bool) {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if json && b == b'\\' {
                i += if bytes.get(i + 1) == Some(&b'u') { 6 } else { 2 };
                continue;
            }
            if !is_token_byte(b) {
                i += 1;
                continue;
            }
            let start = i;
            while i < bytes.len() && is_token_byte(bytes[i]) {
                i += 1;
            }
            // Token bytes are ASCII, so these are char boundaries.
            self.count(&text[start..i], weight);
        }
    }

    fn count(&mut self, token: &str, weight: u32) {
        if let Some(&slot) = self.seen.get(token) {
            if slot != IGNORED {
                let n = &mut self.counts[slot as usize].1;
                *n = n.saturating_add(weight);
            }
            return;
        }
        // Tokens that can never count (numbers) are not worth remembering.
        if token.len() < 3 || token.as_bytes()[0].is_ascii_digit() {
            return;
        }
        let slot = self.classify(token);
        self.seen.insert(Box::from(token), slot);
        if slot != IGNORED {
            let n = &mut self.counts[slot as usize].1;
            *n = n.saturating_add(weight);
        }
    }

    /// The slot a token never seen before counts towards.
    fn classify(&mut self, token: &str) -> u32 {
        let next = u32::try_from(self.counts.len()).unwrap_or(IGNORED);
        match shape(token) {
            None => IGNORED,
            Some(Shape::Code) => {
                self.counts.push((Box::from(token), 0));
                next
            }
            Some(Shape::Word) => {
                let lower = token.to_ascii_lowercase();
                if lower.len() < 4 || self.stop.contains(lower.as_str()) {
                    return IGNORED;
                }
                if let Some(&slot) = self.words.get(lower.as_str()) {
                    return slot;
                }
                self.counts.push((Box::from(lower.as_str()), 0));
                self.words.insert(lower.into_boxed_str(), next);
                next
            }
        }
    }

    /// The `limit` highest-scoring code-shaped identifiers and plain words, each seen
    /// with at least `min_count` weighted occurrences. Ties break by name so the output
    /// never depends on hash order.
    pub(super) fn top(&self, limit_code: usize, limit_words: usize, min_count: u32) -> (Vec<Ranked>, Vec<Ranked>) {
        let mut code = Vec::new();
        let mut words = Vec::new();
        for (term, count) in &self.counts {
            if *count < min_count {
                continue;
            }
            let ranked = Ranked { term: term.to_string(), count: *count };
            match shape(term) {
                Some(Shape::Code) => code.push(ranked),
                _ => words.push(ranked),
            }
        }
        let order = |a: &Ranked, b: &Ranked| b.count.cmp(&a.count).then_with(|| a.term.cmp(&b.term));
        code.sort_by(order);
        words.sort_by(order);
        code.truncate(limit_code);
        words.truncate(limit_words);
        (code, words)
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The extension of a path's file name (`rs` for `src/a.rs`), if it has a short one.
pub(super) fn extension(path: &str) -> Option<&str> {
    let name = path.rsplit(['/', '\\']).next()?;
    let (stem, ext) = name.rsplit_once('.')?;
    if stem.is_empty() || ext.is_empty() || ext.len() > 10 || !ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_shapes_beat_noise() {
        let mut t = Terms::default();
        t.add("the summarize_offline function calls parseReply and OfflineOptions", 1);
        t.add("toolu_01AbCdEfGhIjKlMnOp deadbeef12 12345 the the the and", 5);
        t.add("summarize_offline again; compaction compaction", 1);
        let (code, words) = t.top(10, 10, 1);
        let code: Vec<_> = code.iter().map(|r| (r.term.as_str(), r.count)).collect();
        assert_eq!(code, vec![("summarize_offline", 2), ("OfflineOptions", 1), ("parseReply", 1)]);
        let words: Vec<_> = words.iter().map(|r| (r.term.as_str(), r.count)).collect();
        assert_eq!(words, vec![("compaction", 2), ("calls", 1)]);
    }

    #[test]
    fn words_fold_case_and_respect_the_minimum() {
        let mut t = Terms::default();
        t.add("Watcher watcher WATCHER budget", 1);
        let (_, words) = t.top(5, 5, 2);
        assert_eq!(words, vec![Ranked { term: "watcher".into(), count: 3 }]);
    }

    #[test]
    fn raw_json_escapes_separate_tokens() {
        let mut t = Terms::default();
        t.add_json(r#""fn main() {\n    let watcher_loop = 1;\n}\tbudget\u00e9budget""#, 1);
        let (code, words) = t.top(5, 5, 1);
        assert_eq!(code, vec![Ranked { term: "watcher_loop".into(), count: 1 }]);
        assert_eq!(words, vec![Ranked { term: "budget".into(), count: 2 }, Ranked { term: "main".into(), count: 1 }]);
    }

    #[test]
    fn extensions() {
        assert_eq!(extension("/a/b/main.rs"), Some("rs"));
        assert_eq!(extension("README.md"), Some("md"));
        assert_eq!(extension("/a/.gitignore"), None);
        assert_eq!(extension("/a/Makefile"), None);
        assert_eq!(extension("/a.b/c"), None);
    }
}
