//! The memory-file text parsers (`ctxd_core::memory`): rule front matter, `@path`
//! imports and `paths:` globs.
//!
//! Input: arbitrary text plus a few chosen pieces (globs, paths) from which inputs with a
//! known answer are built.
//!
//! Properties:
//! - front matter: the body is a suffix of the text; no block, an unclosed block and a
//!   closed one are told apart; `paths:` written as a block list, a flow list, a comma
//!   string or one string reads back as the same globs, with LF or CRLF;
//! - imports: every import found is written in the text after an `@`; a paragraph
//!   `@path` ahead of any text adds exactly that path in front of the text's own imports;
//! - globs: a glob that matches a path matches everything below it; `**` matches every
//!   path inside the project and nothing outside; a glob of plain characters matches
//!   exactly the paths with a segment of that name; `./` in front and `{a,b}` mean what
//!   they say.

#![no_main]

use ctxd_core::memory::{frontmatter, glob, imports};
use libfuzzer_sys::fuzz_target;

/// Characters a glob or path may use that no parser treats specially.
fn plain(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn check_front_matter(text: &str) {
    let fm = frontmatter::parse(text);
    assert!(text.ends_with(fm.body));
    let start = fm.body.as_ptr() as usize - text.as_ptr() as usize;
    assert_eq!(start + fm.body.len(), text.len(), "body is not a suffix of the text");
    let opens = text.split_once('\n').is_some_and(|(first, _)| first.trim_end() == "---");
    if !opens || fm.unclosed {
        assert_eq!(fm.body, text);
        assert_eq!(fm.paths, None);
    }
    if !opens {
        assert!(!fm.unclosed);
    }
    if let Some(paths) = &fm.paths {
        for p in paths {
            assert!(!p.is_empty() && p.trim() == p, "{p:?}");
        }
    }
}

fn check_front_matter_forms(globs: &str, body: &str, crlf: bool, form: u8) {
    let globs: Vec<&str> = globs.split(' ').filter(|g| plain(g) || is_glob(g)).collect();
    let nl = if crlf { "\r\n" } else { "\n" };
    let value = match (form % 4, globs.len()) {
        (_, 0) => String::new(),
        (0, _) => globs.iter().map(|g| format!("{nl}  - \"{g}\"  # note")).collect(),
        (1, _) => format!(" [{}]", globs.iter().map(|g| format!("'{g}'")).collect::<Vec<_>>().join(", ")),
        (2, _) => format!(" {}", globs.join(", ")),
        _ => format!(" \"{}\"", globs[0]),
    };
    let want: Vec<String> = match (form % 4, globs.len()) {
        (_, 0) => Vec::new(),
        (3, _) => vec![globs[0].to_owned()],
        _ => globs.iter().map(|g| (*g).to_owned()).collect(),
    };
    let text = format!("---{nl}description: x{nl}paths:{value}{nl}other: y{nl}---{nl}{body}");
    let fm = frontmatter::parse(&text);
    assert_eq!(fm.paths, Some(want), "{text:?}");
    assert_eq!(fm.body, body);
    assert!(!fm.unclosed);
}

/// A glob of plain segments with `*`, `?` and `**`, which no front matter form splits.
fn is_glob(g: &str) -> bool {
    !g.is_empty()
        && g.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | '?' | '/'))
        && !g.starts_with('-')
}

fn check_imports(text: &str, names: (&str, &str)) {
    let found = imports::find_imports(text);
    assert!(found.len() <= text.matches('@').count());
    for path in &found {
        let first = path.chars().next();
        assert!(first.is_some_and(|c| c.is_alphanumeric() || matches!(c, '.' | '/' | '~' | '_' | '-')), "{path:?}");
        assert!(!path.contains('#') && !path.contains('\n'), "{path:?}");
        let written = format!("@{}", path.replace(' ', "\\ "));
        assert!(text.contains(&written), "{written:?} not in {text:?}");
    }
    // A paragraph of its own in front adds exactly its import.
    let (a, _) = names;
    if plain(a) && a.chars().next().is_some_and(char::is_alphanumeric) && !a.ends_with('.') {
        let path = format!("{a}/{a}.md");
        let with = imports::find_imports(&format!("@{path}\n\n{text}"));
        let mut want = vec![path];
        want.extend(found);
        assert_eq!(with, want, "{text:?}");
    }
}

/// The segments of a relative path as the matcher sees them, or `None` when the path is
/// empty or leaves the project.
fn segments(rel: &str) -> Option<Vec<&str>> {
    let segs: Vec<&str> = rel.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    (!segs.is_empty() && segs[0] != "..").then_some(segs)
}

fn check_glob(pattern: &str, rel: &str, names: (&str, &str)) {
    let hit = glob::matches(pattern, rel);
    let inside = segments(rel);
    if inside.is_none() {
        assert!(!hit, "{pattern:?} matched {rel:?}, which is outside the project");
        return;
    }
    let segs = inside.unwrap_or_default();
    if hit {
        assert!(glob::matches(pattern, &format!("{rel}/child")), "{pattern:?} matched {rel:?} but not a file in it");
    }
    assert!(glob::matches("**", rel));
    if pattern.trim() == pattern {
        assert_eq!(glob::matches(&format!("./{pattern}"), rel), hit, "./{pattern:?} vs {rel:?}");
    }
    let (a, b) = names;
    if plain(a) {
        assert_eq!(glob::matches(a, rel), segs.contains(&a), "{a:?} vs {rel:?}");
        if plain(b) {
            let either = glob::matches(&format!("{{{a},{b}}}"), rel);
            assert_eq!(either, glob::matches(a, rel) || glob::matches(b, rel), "{{{a},{b}}} vs {rel:?}");
        }
    }
}

// Input: fields separated by 0xFF: text, glob, path, two names, space-separated globs,
// and a byte of flags (bit 0: CRLF; bits 1-2: the `paths:` form).
fuzz_target!(|data: &[u8]| {
    let fields: Vec<String> = data.split(|b| *b == 0xff).map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    let field = |i: usize| fields.get(i).map_or("", String::as_str);
    let (text, pattern, rel, names, globs) = (field(0), field(1), field(2), (field(3), field(4)), field(5));
    let flags = field(6).bytes().next().unwrap_or(0);
    check_front_matter(text);
    check_front_matter_forms(globs, text, flags & 1 != 0, flags >> 1);
    check_imports(text, names);
    check_glob(pattern, rel, names);
    check_glob(text, rel, names);
});
