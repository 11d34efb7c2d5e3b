//! The status line part of `ctxd claude setup`: `statusLine` in Claude Code's user
//! settings runs `ctxd statusline`, and `--undo` takes it out or puts the user's back.
//!
//! The settings file is the user's: only that member's text changes. The edit works on
//! the text (a scan of the top-level object's members), not on a re-serialized value,
//! so key order, indentation, escapes and every other byte stay as they were, and each
//! edit is checked to give the same JSON with only that member changed.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value;

use super::shell::shell_quote;

/// The status line's refresh, in seconds: the cache's "cold in 4m" counts down between
/// turns (Claude Code also re-runs the line when its cache expires).
pub(super) const STATUS_REFRESH_SECS: u64 = 30;

/// The status-line command for `ctxd` at `ctxd`.
pub fn status_line_command(ctxd: &Path) -> String {
    format!("{} statusline", shell_quote(&ctxd.to_string_lossy()))
}

/// The `statusLine` setting setup writes.
pub(super) fn status_line_value(ctxd: &Path) -> Value {
    serde_json::json!({"type": "command", "command": status_line_command(ctxd), "refreshInterval": STATUS_REFRESH_SECS})
}

/// The `statusLine` command there is now (for the message), checking that the file is
/// a JSON object setup can edit.
pub(super) fn status_line_of(text: &str, path: &Path) -> anyhow::Result<Option<String>> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text)
        .with_context(|| format!("{} is not plain JSON (comments?): left as it is", path.display()))?;
    let Some(object) = value.as_object() else {
        bail!("{} is not a JSON object: left as it is", path.display());
    };
    Ok(object.get("statusLine").map(|s| match s.get("command").and_then(Value::as_str) {
        Some(command) => command.to_owned(),
        None => s.to_string(),
    }))
}

/// `env.ANTHROPIC_BASE_URL` of Claude Code's settings, if set.
pub(super) fn settings_env_base_url(text: &str) -> Option<String> {
    let value: Value = serde_json::from_str(text).ok()?;
    value.pointer("/env/ANTHROPIC_BASE_URL").and_then(Value::as_str).map(str::to_owned)
}

/// `text` with `statusLine` as it was in `before` (or without it), if it still runs
/// ctxd; `None` when the user set another since.
pub(super) fn undo_status_line(text: &str, before: &str) -> anyhow::Result<Option<String>> {
    let value: Value = serde_json::from_str(text).context("no longer plain JSON; left as it is")?;
    let ours = value
        .get("statusLine")
        .and_then(|s| s.get("command"))
        .and_then(Value::as_str)
        .is_some_and(|c| c.ends_with(" statusline") && c.contains("ctxd"));
    if !ours {
        return Ok(None);
    }
    let old = if before.trim().is_empty() {
        None
    } else {
        serde_json::from_str::<Value>(before).ok().and_then(|v| v.get("statusLine").cloned())
    };
    Ok(Some(match old {
        Some(old) => set_member(text, "statusLine", &old)?,
        None => remove_member(text, "statusLine")?,
    }))
}

// --- JSON members, edited in place --------------------------------------------------

/// A member of the top-level object: where its key starts and its value ends.
#[derive(Debug, Clone)]
struct Member {
    key: String,
    key_start: usize,
    value_start: usize,
    value_end: usize,
}

/// The top-level object of a JSON text: its braces and members. The text has been
/// checked to be JSON.
fn object_members(text: &str) -> anyhow::Result<(usize, usize, Vec<Member>)> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        bail!("not a JSON object");
    }
    let open = i;
    i += 1;
    let mut members = Vec::new();
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b'}') => return Ok((open, i, members)),
            Some(b',') => i += 1,
            Some(b'"') => {
                let key_start = i;
                let key_end = value_end(b, i)?;
                let key: String = serde_json::from_str(&text[key_start..key_end])?;
                i = skip_ws(b, key_end);
                if b.get(i) != Some(&b':') {
                    bail!("no ':' after a key");
                }
                let value_start = skip_ws(b, i + 1);
                let end = value_end(b, value_start)?;
                members.push(Member { key, key_start, value_start, value_end: end });
                i = end;
            }
            _ => bail!("unexpected text in the object"),
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where the value starting at `i` ends.
fn value_end(b: &[u8], i: usize) -> anyhow::Result<usize> {
    match b.get(i) {
        Some(b'"') => {
            let mut j = i + 1;
            while let Some(&c) = b.get(j) {
                match c {
                    b'\\' => j += 2,
                    b'"' => return Ok(j + 1),
                    _ => j += 1,
                }
            }
            bail!("a string without its end")
        }
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = value_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            bail!("an object or array without its end")
        }
        Some(_) => {
            let mut j = i;
            while b.get(j).is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')) {
                j += 1;
            }
            Ok(j)
        }
        None => bail!("a value is missing"),
    }
}

/// The indentation of the line `at` is on (its leading spaces and tabs).
fn line_indent(text: &str, at: usize) -> &str {
    let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let line = &text[line_start..at];
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// `value` as pretty JSON indented by `unit` per level, its later lines shifted by
/// `base`.
fn render(value: &Value, unit: &str, base: &str) -> anyhow::Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut serializer)?;
    let text = String::from_utf8(out)?;
    Ok(text.replace('\n', &format!("\n{base}")))
}

/// `text` (a JSON object, or empty) with member `key` set to `value`: an existing
/// member's value is replaced where it stands; a new member goes last, laid out like
/// the members before it. Everything else keeps its bytes. The result is checked to be
/// the same JSON with only that member changed.
pub fn set_member(text: &str, key: &str, value: &Value) -> anyhow::Result<String> {
    if text.trim().is_empty() {
        let body = render(&serde_json::json!({ key: value }), "  ", "")?;
        return Ok(format!("{body}\n"));
    }
    let (open, close, members) = object_members(text)?;
    let key_json = serde_json::to_string(key)?;
    let out = if let Some(m) = members.iter().find(|m| m.key == key) {
        let indent = line_indent(text, m.key_start);
        let unit = indent_unit(text, &members);
        let rendered = if text[m.key_start..m.value_end].contains('\n') || text[open..close].contains('\n') {
            render(value, &unit, indent)?
        } else {
            serde_json::to_string(value)?
        };
        format!("{}{rendered}{}", &text[..m.value_start], &text[m.value_end..])
    } else if let Some(last) = members.last() {
        let multiline = text[open..members[0].key_start].contains('\n');
        if multiline {
            let indent = line_indent(text, last.key_start);
            let unit = indent_unit(text, &members);
            let rendered = render(value, &unit, indent)?;
            format!("{},\n{indent}{key_json}: {rendered}{}", &text[..last.value_end], &text[last.value_end..])
        } else {
            let rendered = serde_json::to_string(value)?;
            format!("{}, {key_json}: {rendered}{}", &text[..last.value_end], &text[last.value_end..])
        }
    } else {
        // `{}`, `{ }`, `{\n}`: the object is rewritten, what surrounds it kept.
        let body = render(&serde_json::json!({ key: value }), "  ", line_indent(text, open))?;
        format!("{}{body}{}", &text[..open], &text[close + 1..])
    };
    check_edit(text, &out, key, Some(value))?;
    Ok(out)
}

/// `text` without member `key` (its comma and the layout before it go too).
pub fn remove_member(text: &str, key: &str) -> anyhow::Result<String> {
    let (open, _, members) = object_members(text)?;
    let Some(at) = members.iter().position(|m| m.key == key) else {
        return Ok(text.to_owned());
    };
    let m = &members[at];
    let out = if at > 0 {
        // From the end of the member before it.
        format!("{}{}", &text[..members[at - 1].value_end], &text[m.value_end..])
    } else if let Some(next) = members.get(1) {
        // The first of several: up to the next member's key.
        format!("{}{}", &text[..m.key_start], &text[next.key_start..])
    } else {
        // The only member: the object's inside is emptied (only layout follows it).
        let close = skip_ws(text.as_bytes(), m.value_end);
        format!("{}{}", &text[..open + 1], &text[close..])
    };
    check_edit(text, &out, key, None)?;
    Ok(out)
}

/// The indentation unit of a pretty-printed object: the first member's indentation (a
/// top-level member is one level deep), else two spaces.
fn indent_unit(text: &str, members: &[Member]) -> String {
    members
        .first()
        .map(|m| line_indent(text, m.key_start))
        .filter(|indent| !indent.is_empty())
        .unwrap_or("  ")
        .to_owned()
}

/// The edit changed member `key` (to `value`, or removed it) and nothing else.
fn check_edit(before: &str, after: &str, key: &str, value: Option<&Value>) -> anyhow::Result<()> {
    let mut want: Value = serde_json::from_str(before)?;
    let object = want.as_object_mut().context("not a JSON object")?;
    match value {
        Some(value) => {
            object.insert(key.to_owned(), value.clone());
        }
        None => {
            object.shift_remove(key);
        }
    }
    let got: Value = serde_json::from_str(after).context("the edit did not give JSON")?;
    if got != want {
        bail!("the edit changed more than {key}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Value {
        status_line_value(Path::new("/opt/ctxd/bin/ctxd"))
    }

    #[test]
    fn a_member_added_last_in_the_files_own_layout() {
        let text = "{\n    \"model\": \"opus\",\n    \"env\": {\n        \"A\": \"é\\u00e9\"\n    }\n}\n";
        let out = set_member(text, "statusLine", &status()).unwrap();
        assert_eq!(
            out,
            "{\n    \"model\": \"opus\",\n    \"env\": {\n        \"A\": \"é\\u00e9\"\n    },\n    \"statusLine\": {\n        \
             \"type\": \"command\",\n        \"command\": \"'/opt/ctxd/bin/ctxd' statusline\",\n        \"refreshInterval\": 30\n    }\n}\n"
        );
        // One line stays one line.
        let out = set_member("{\"a\": 1}", "statusLine", &serde_json::json!({"x": 1})).unwrap();
        assert_eq!(out, "{\"a\": 1, \"statusLine\": {\"x\":1}}");
    }

    #[test]
    fn a_member_replaced_where_it_stands() {
        let text =
            "{\n  \"statusLine\": {\"type\": \"command\", \"command\": \"~/bin/line.sh\"},\n  \"theme\": \"dark\"\n}";
        let out = set_member(text, "statusLine", &serde_json::json!({"type": "command", "command": "x"})).unwrap();
        assert_eq!(
            out,
            "{\n  \"statusLine\": {\n    \"type\": \"command\",\n    \"command\": \"x\"\n  },\n  \"theme\": \"dark\"\n}"
        );
    }

    #[test]
    fn empty_files_and_objects() {
        assert_eq!(set_member("", "k", &serde_json::json!(1)).unwrap(), "{\n  \"k\": 1\n}\n");
        assert_eq!(set_member("{}\n", "k", &serde_json::json!(1)).unwrap(), "{\n  \"k\": 1\n}\n");
        assert_eq!(set_member("  { \n }", "k", &serde_json::json!(1)).unwrap(), "  {\n    \"k\": 1\n  }");
    }

    #[test]
    fn members_removed_with_their_commas() {
        let three = "{\n  \"a\": 1,\n  \"statusLine\": {\"x\": [1, \"}\"]},\n  \"b\": 2\n}";
        assert_eq!(remove_member(three, "statusLine").unwrap(), "{\n  \"a\": 1,\n  \"b\": 2\n}");
        let first = "{\"statusLine\": 1, \"b\": 2}";
        assert_eq!(remove_member(first, "statusLine").unwrap(), "{\"b\": 2}");
        let last = "{\"a\": 1,\n\"statusLine\": 1\n}";
        assert_eq!(remove_member(last, "statusLine").unwrap(), "{\"a\": 1\n}");
        let only = "{\n  \"statusLine\": 1\n}\n";
        assert_eq!(remove_member(only, "statusLine").unwrap(), "{}\n");
        assert_eq!(remove_member("{\"a\": 1}", "statusLine").unwrap(), "{\"a\": 1}");
    }

    #[test]
    fn strings_with_braces_quotes_and_escapes_do_not_confuse_the_scan() {
        let text = r#"{"a": "}\"{,", "b": [{"c": "]"}], "d": -1.5e3, "e": null}"#;
        let out = set_member(text, "statusLine", &serde_json::json!(true)).unwrap();
        assert_eq!(out, r#"{"a": "}\"{,", "b": [{"c": "]"}], "d": -1.5e3, "e": null, "statusLine": true}"#);
        let (_, _, members) = object_members(text).unwrap();
        assert_eq!(members.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["a", "b", "d", "e"]);
    }

    #[test]
    fn undoing_a_status_line_put_back_or_taken_out() {
        let ours = set_member("{\"a\": 1}", "statusLine", &status()).unwrap();
        // There was none: it goes.
        assert_eq!(undo_status_line(&ours, "{\"a\": 1}").unwrap().unwrap(), "{\"a\": 1}");
        // There was one: it comes back.
        let before = "{\"a\": 1, \"statusLine\": {\"type\": \"command\", \"command\": \"mine\"}}";
        let back = undo_status_line(&ours, before).unwrap().unwrap();
        assert_eq!(serde_json::from_str::<Value>(&back).unwrap(), serde_json::from_str::<Value>(before).unwrap());
        // The user set another since: left alone.
        let theirs = set_member(&ours, "statusLine", &serde_json::json!({"type": "command", "command": "x"})).unwrap();
        assert_eq!(undo_status_line(&theirs, before).unwrap(), None);
    }
}
