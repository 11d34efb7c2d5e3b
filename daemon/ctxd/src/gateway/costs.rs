//! The cost ledger of instant compaction: each preparation's cost and each instant
//! answer's saving, per session, on disk, for `ctxd claude stats` and the editors'
//! context view (`ctx/context` of an observed Claude Code session).
//!
//! One append-only JSONL file per session under `<state dir>/gateway/costs/`, named by
//! the SHA-256 of the session id (an id is whatever a client sent: it never becomes a
//! path), beside the prepared summaries. A line is `ctxd_core::gateway::costs`'s ledger
//! line (figures, the session id and model; never a body, a summary or a key) written
//! with one `write` and synced. A line that does not read back (cut by a crash, edited,
//! another version) is skipped with one log line; the others still count. A file whose
//! last line was cut gets a newline before the next line, so one torn write never
//! damages the next. Reading is bounded: lines longer than [`MAX_LINE`] are skipped
//! without being held.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ctxd_core::gateway::costs::{CostEntry, CostSummary, format_usd, ledger_line, parse_ledger_line};
use sha2::{Digest, Sha256};

/// The longest ledger line read (a line is a few hundred bytes).
pub const MAX_LINE: usize = 64 << 10;

/// The ledger directory of a state dir.
#[derive(Debug, Clone)]
pub struct CostLedger {
    dir: PathBuf,
}

impl CostLedger {
    pub fn new(state_dir: &Path) -> CostLedger {
        CostLedger { dir: state_dir.join("gateway").join("costs") }
    }

    fn path(&self, session_id: &str) -> PathBuf {
        let name: String = Sha256::digest(session_id.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.jsonl"))
    }

    /// Appends one line to the entry's session (blocking: call off the runtime).
    pub fn append(&self, entry: &CostEntry) -> std::io::Result<()> {
        crate::store::create_private_dir(&self.dir).map_err(std::io::Error::other)?;
        let mut file =
            std::fs::OpenOptions::new().read(true).append(true).create(true).open(self.path(&entry.session_id))?;
        let mut line = String::new();
        let len = file.metadata()?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                line.push('\n');
            }
        }
        line.push_str(&ledger_line(entry));
        line.push('\n');
        file.write_all(line.as_bytes())?;
        file.sync_data()
    }

    /// The session's figures added up; `None` when it has no ledger (or no line reads).
    pub fn session(&self, session_id: &str) -> Option<CostSummary> {
        read_file(&self.path(session_id)).remove(session_id)
    }

    /// Every session's figures, the most recent first.
    pub fn all(&self) -> Vec<CostSummary> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut sessions: BTreeMap<String, CostSummary> = BTreeMap::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                for (id, summary) in read_file(&path) {
                    sessions.insert(id, summary);
                }
            }
        }
        let mut out: Vec<CostSummary> = sessions.into_values().collect();
        out.sort_by(|a, b| b.last_at.cmp(&a.last_at).then_with(|| a.session_id.cmp(&b.session_id)));
        out
    }
}

/// The lines of one ledger file added up per session they name (a file holds one
/// session, unless renamed by hand). Damaged lines are skipped, one log line each.
fn read_file(path: &Path) -> BTreeMap<String, CostSummary> {
    let mut sessions: BTreeMap<String, CostSummary> = BTreeMap::new();
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return sessions,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "gateway: a cost ledger cannot be read; left out");
            return sessions;
        }
    };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let read = (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line);
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "gateway: a cost ledger broke off while read");
                break;
            }
        }
        let too_long = line.len() > MAX_LINE && line.last() != Some(&b'\n');
        if too_long {
            // Skip the rest of the line without holding it.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if rest.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
        }
        let entry = (!too_long).then(|| std::str::from_utf8(&line).ok().and_then(parse_ledger_line)).flatten();
        match entry {
            Some(entry) => sessions.entry(entry.session_id.clone()).or_default().add(&entry),
            None if line.iter().all(u8::is_ascii_whitespace) && !too_long => {}
            None => tracing::warn!(
                path = %path.display(),
                line = number,
                "gateway: a damaged cost ledger line skipped"
            ),
        }
    }
    sessions
}

/// The protocol's figures of a session (also `ctxd claude stats --json`).
pub fn stats(summary: &CostSummary) -> ctxd_proto::InstantCompactionStats {
    let u = &summary.preparation_usage;
    ctxd_proto::InstantCompactionStats {
        session_id: summary.session_id.clone(),
        model: summary.model.clone(),
        preparations: summary.preparations,
        preparation_input_tokens: u.input_tokens,
        preparation_cache_read_tokens: u.cache_read_input_tokens,
        preparation_cache_write_tokens: u.cache_creation_input_tokens,
        preparation_output_tokens: u.output_tokens,
        preparation_usd: summary.preparation_usd,
        instant_compactions: summary.instant_compactions,
        saved_call_usd: summary.saved_call_usd,
        saved_cold_rewrite_usd: summary.saved_cold_rewrite_usd,
        saved_usd: summary.saved_usd(),
        net_usd: summary.net_usd(),
    }
}

/// `ctxd claude stats [SESSION] [--json]`: the figures of every session with a ledger,
/// or of the one whose id starts with `session`; an error when none does, or more
/// than one.
pub fn stats_command(state_dir: &Path, session: Option<&str>, json: bool) -> Result<String, String> {
    let mut all = CostLedger::new(state_dir).all();
    if let Some(prefix) = session {
        all.retain(|s| s.session_id.starts_with(prefix));
        match all.len() {
            0 => {
                return Err(format!(
                    "no instant-compaction figures for a session {prefix:?} (none on this gateway's ledger, {})",
                    CostLedger::new(state_dir).dir.display()
                ));
            }
            1 => {}
            n => {
                let ids: Vec<&str> = all.iter().map(|s| s.session_id.as_str()).collect();
                return Err(format!("{n} sessions start with {prefix:?}: {}", ids.join(", ")));
            }
        }
    }
    if json {
        let sessions: Vec<_> = all.iter().map(stats).collect();
        return serde_json::to_string_pretty(&serde_json::json!({ "sessions": sessions }))
            .map(|text| text + "\n")
            .map_err(|e| e.to_string());
    }
    if all.is_empty() {
        return Ok("no instant-compaction figures yet (no session prepared on this gateway)\n".to_owned());
    }
    Ok(all.iter().map(stats_text).collect::<Vec<_>>().join("\n"))
}

/// One session as text.
fn stats_text(s: &CostSummary) -> String {
    let u = &s.preparation_usage;
    let net = s.net_usd();
    let net_text = if net < 0.0 {
        format!("{} more spent than saved", format_usd(-net))
    } else {
        format!("{} saved", format_usd(net))
    };
    format!(
        "session {} ({})\n  preparations         {} ({} input, {} cache read, {} cache write, {} output tokens) {}\n  instant compactions  {}\n  estimated savings    {} (compaction calls {}, cold re-writes {})\n  net                  {}\n",
        s.session_id,
        s.model,
        s.preparations,
        ctxd_core::summary::thousands(u.input_tokens),
        ctxd_core::summary::thousands(u.cache_read_input_tokens),
        ctxd_core::summary::thousands(u.cache_creation_input_tokens),
        ctxd_core::summary::thousands(u.output_tokens),
        format_usd(s.preparation_usd),
        s.instant_compactions,
        format_usd(s.saved_usd()),
        format_usd(s.saved_call_usd),
        format_usd(s.saved_cold_rewrite_usd),
        net_text,
    )
}

#[cfg(test)]
mod tests {
    use ctxd_core::gateway::costs::CostKind;
    use ctxd_core::record::TokenUsage;

    use super::*;

    fn entry(session: &str, kind: CostKind, usd: f64) -> CostEntry {
        CostEntry {
            at: "2026-12-06T07:00:00.000Z".into(),
            session_id: session.into(),
            model: "claude-opus-5-5".into(),
            kind,
            usage: TokenUsage {
                input_tokens: 12_305,
                cache_read_input_tokens: 98_304,
                cache_creation_input_tokens: 4_096,
                output_tokens: 321,
            },
            usd,
            cold_rewrite_usd: 0.0,
        }
    }

    #[test]
    fn lines_add_up_per_session_and_a_damaged_or_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = CostLedger::new(dir.path());
        assert_eq!(ledger.session("s-1"), None);
        ledger.append(&entry("s-1", CostKind::Preparation, 0.25)).unwrap();
        ledger.append(&entry("s-2", CostKind::Preparation, 0.5)).unwrap();
        let path = ledger.path("s-1");
        // A damaged line in the middle, then a torn one at the end (a crash mid-write).
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&ledger_line(&entry("s-1", CostKind::Preparation, 9.0)).replace("9.0", "8.0"));
        text.push('\n');
        text.push_str(&ledger_line(&entry("s-1", CostKind::Preparation, 7.0))[..40]);
        std::fs::write(&path, text).unwrap();
        ledger.append(&entry("s-1", CostKind::InstantCompaction, 1.5)).unwrap();
        let s1 = ledger.session("s-1").unwrap();
        assert_eq!((s1.preparations, s1.instant_compactions), (1, 1), "{s1:?}");
        assert!((s1.preparation_usd - 0.25).abs() < 1e-9 && (s1.saved_usd() - 1.5).abs() < 1e-9);
        let lines = std::fs::read_to_string(&path).unwrap();
        assert!(lines.ends_with('\n') && lines.lines().count() == 4, "the torn line ended before the next: {lines}");
        assert_eq!(ledger.all().len(), 2);
        assert!(!std::fs::read_to_string(ledger.path("s-2")).unwrap().contains("s-1"));
    }

    #[test]
    fn a_line_too_long_is_skipped_without_being_held() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = CostLedger::new(dir.path());
        ledger.append(&entry("s-1", CostKind::Preparation, 0.25)).unwrap();
        let path = ledger.path("s-1");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&"x".repeat(3 * MAX_LINE));
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        ledger.append(&entry("s-1", CostKind::Preparation, 0.5)).unwrap();
        assert_eq!(ledger.session("s-1").unwrap().preparations, 2);
    }

    #[test]
    fn stats_name_a_session_by_a_prefix_and_refuse_an_unknown_or_ambiguous_one() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = CostLedger::new(dir.path());
        ledger.append(&entry("abc-1", CostKind::Preparation, 0.25)).unwrap();
        ledger.append(&entry("abd-2", CostKind::InstantCompaction, 1.2)).unwrap();
        let one = stats_command(dir.path(), Some("abc"), false).unwrap();
        assert!(one.starts_with("session abc-1 (claude-opus-5-5)"), "{one}");
        assert!(
            one.contains(
                "preparations         1 (12,305 input, 98,304 cache read, 4,096 cache write, 321 output tokens) $0.25"
            ),
            "{one}"
        );
        assert!(one.contains("net                  $0.25 more spent than saved"), "{one}");
        let json: serde_json::Value = serde_json::from_str(&stats_command(dir.path(), None, true).unwrap()).unwrap();
        assert_eq!(json["sessions"].as_array().unwrap().len(), 2);
        assert!(stats_command(dir.path(), Some("zz"), false).unwrap_err().contains("no instant-compaction figures"));
        assert!(stats_command(dir.path(), Some("ab"), true).unwrap_err().contains("2 sessions start with"));
    }
}
