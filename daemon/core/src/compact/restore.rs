//! What comes back after the summary: recently read files, invoked skills, the plan,
//! and a list of everything that was read.
//!
//! A summary names files; it cannot hold them. The next turn usually continues on the
//! files it was just reading, so the newest few come back as if read again, within
//! fixed limits (at most 5 files, 5,000 tokens each, 50,000 in all, the ceiling not a
//! target; skills 5,000 each and 25,000 in all). A file too large to restore comes back
//! as a note naming it, and every file read before compaction is listed in a digest
//! (with whether it changed since) so the agent neither re-reads what is unchanged and
//! already shown nor trusts a memory of a file that has changed.
//!
//! Small windows: the fixed limits assume a window far larger than what they restore.
//! With a small one, restoring 50,000 tokens could put the context straight back over
//! the threshold and compact again at once. [`RestoreBudget::fitted`] therefore caps
//! all restoration at [`RESTORE_ROOM_PERCENT`] of the room left under the threshold
//! once the fixed prefix, the summary, the kept messages and hook output are counted:
//!
//! ```text
//! room  = threshold − (fixed prefix + summary + kept + hook output)
//! cap   = room × 50 %
//! digest ≤ min(2,000, cap / 10); files ≤ min(50,000, ⅔ of the rest); skills ≤ min(25,000, the rest)
//! ```
//!
//! so the post-compact context ends at least half the room below the threshold. When
//! there is no room, nothing is restored (and the guards report that compaction cannot
//! help).
//!
//! Everything here is plain data: the caller reads the ledger and the files from disk
//! and passes their text in.

use serde_json::{Value, json};

use super::text::{cut_to_tokens, estimate_tokens};

/// Most files restored (with content or as a note).
pub const MAX_RESTORED_FILES: usize = 5;
/// A file above this many tokens comes back as a note naming it.
pub const MAX_TOKENS_PER_FILE: u64 = 5_000;
/// Ceiling of restored file content (plan and notes included).
pub const MAX_FILE_TOKENS: u64 = 50_000;
/// Each invoked skill is cut to this many tokens.
pub const MAX_TOKENS_PER_SKILL: u64 = 5_000;
/// Ceiling of restored skill content.
pub const MAX_SKILL_TOKENS: u64 = 25_000;
/// Ceiling of the read-files digest.
pub const MAX_DIGEST_TOKENS: u64 = 2_000;
/// Share of the room under the threshold that restoration may use (see the module docs).
pub const RESTORE_ROOM_PERCENT: u64 = 50;

/// A skill cut below this many tokens is not worth restoring: it is dropped instead.
const MIN_SKILL_TOKENS: u64 = 500;

/// One file of the file-read ledger, as the caller found it at compaction time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileReadEntry {
    pub path: String,
    /// Order of the latest read; larger is newer.
    pub read_order: u64,
    /// Estimated tokens of the current content.
    pub tokens: u64,
    /// The file still exists.
    pub exists: bool,
    /// Its current text, read by the caller; `None` when it was not read (too large,
    /// unreadable, binary).
    pub content: Option<String>,
    /// Modified on disk since the agent read it.
    pub changed_since_read: bool,
    /// Its read result is in the messages kept verbatim: the model sees it already.
    pub in_kept_tail: bool,
}

/// A skill the agent invoked, with the content it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillEntry {
    pub name: String,
    pub content: String,
    /// Order of invocation; larger is newer.
    pub order: u64,
}

/// The session's plan file, read again from disk by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanFile {
    pub path: String,
    pub content: String,
}

/// The limits restoration works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreBudget {
    pub max_files: usize,
    pub max_tokens_per_file: u64,
    pub max_file_tokens: u64,
    pub max_tokens_per_skill: u64,
    pub max_skill_tokens: u64,
    pub max_digest_tokens: u64,
}

impl Default for RestoreBudget {
    fn default() -> RestoreBudget {
        RestoreBudget {
            max_files: MAX_RESTORED_FILES,
            max_tokens_per_file: MAX_TOKENS_PER_FILE,
            max_file_tokens: MAX_FILE_TOKENS,
            max_tokens_per_skill: MAX_TOKENS_PER_SKILL,
            max_skill_tokens: MAX_SKILL_TOKENS,
            max_digest_tokens: MAX_DIGEST_TOKENS,
        }
    }
}

/// Sizes of the post-compact context that restoration does not control, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostCompactSizes {
    /// System prompt, tools and memory: what compaction cannot remove.
    pub fixed_prefix: u64,
    /// The installed summary message.
    pub summary: u64,
    /// Messages kept verbatim.
    pub kept: u64,
    /// SessionStart hook output.
    pub hook_output: u64,
}

impl PostCompactSizes {
    pub fn total(&self) -> u64 {
        self.fixed_prefix.saturating_add(self.summary).saturating_add(self.kept).saturating_add(self.hook_output)
    }
}

impl RestoreBudget {
    /// The default limits, shrunk so that restoration uses at most
    /// [`RESTORE_ROOM_PERCENT`] of the room left under `threshold` (module docs).
    pub fn fitted(threshold: u64, sizes: &PostCompactSizes) -> RestoreBudget {
        let d = RestoreBudget::default();
        let room = threshold.saturating_sub(sizes.total());
        let cap = room / 100 * RESTORE_ROOM_PERCENT + room % 100 * RESTORE_ROOM_PERCENT / 100;
        let digest = d.max_digest_tokens.min(cap / 10);
        let rest = cap - digest;
        let files = d.max_file_tokens.min(rest / 3 * 2);
        let skills = d.max_skill_tokens.min(rest - files);
        RestoreBudget {
            max_files: d.max_files,
            max_tokens_per_file: d.max_tokens_per_file.min(files),
            max_file_tokens: files,
            max_tokens_per_skill: d.max_tokens_per_skill.min(skills),
            max_skill_tokens: skills,
            max_digest_tokens: digest,
        }
    }

    /// Most tokens restoration can use under these limits.
    pub fn ceiling(&self) -> u64 {
        self.max_file_tokens + self.max_skill_tokens + self.max_digest_tokens
    }
}

/// Everything restoration chooses from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreInput {
    /// The file-read ledger, in any order.
    pub files: Vec<FileReadEntry>,
    pub skills: Vec<SkillEntry>,
    pub plan: Option<PlanFile>,
    pub budget: RestoreBudget,
    /// The working directory, to show paths relative to it.
    pub cwd: Option<String>,
}

/// An attachment to install after the summary: the `attachment` object of an
/// `attachment` record, the texts the model sees, and their role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredAttachment {
    pub attachment: Value,
    /// The `rendered` texts, in order (each becomes `{"content": text}`).
    pub rendered: Vec<String>,
    /// `user` or `system`, as the host renders the attachment.
    pub rendered_role: &'static str,
    /// Estimated tokens of the rendered texts.
    pub tokens: u64,
}

/// What happened to one file of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOutcome {
    /// Restored with its content.
    Restored,
    /// Restored as a note naming it: over the per-file limit.
    ReferenceTooLarge,
    /// Restored as a note naming it: its content would pass the total ceiling.
    ReferenceOverBudget,
    /// Restored as a note naming it: the caller had no content for it.
    ReferenceNoContent,
    /// Not restored: the kept messages show its read result already.
    InKeptTail,
    /// Not restored: it no longer exists.
    Deleted,
    /// Not restored: the file limit was reached first, or not even a note fits.
    NotRestored,
}

/// What restoration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Every ledger file, newest first, with what happened to it.
    pub files: Vec<(String, FileOutcome)>,
    /// Skills restored whole, then cut, then dropped (names, newest first).
    pub skills_restored: Vec<String>,
    pub skills_cut: Vec<String>,
    pub skills_dropped: Vec<String>,
    /// The plan came back (cut when `plan_cut`).
    pub plan_restored: bool,
    pub plan_cut: bool,
    /// Tokens counted against the file ceiling: file content at the ledger's
    /// estimate, plus the plan and notes as rendered.
    pub file_tokens: u64,
    /// Skill content counted against the skill ceiling (after cutting).
    pub skill_tokens: u64,
    pub digest_tokens: u64,
    /// Estimated tokens of everything installed, framing included (Read call lines,
    /// line numbers, headings): what the post-compact context grows by.
    pub rendered_tokens: u64,
}

impl RestoreReport {
    pub fn total_tokens(&self) -> u64 {
        self.file_tokens + self.skill_tokens + self.digest_tokens
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    /// In installation order: plan, files (newest first), skills, digest.
    pub attachments: Vec<RestoredAttachment>,
    pub report: RestoreReport,
}

/// Chooses what to restore.
///
/// Ceilings count content: a file at its ledger estimate (`tokens`), a skill after
/// cutting; the plan, notes and digest count as rendered. Framing around content
/// (tags, the Read call line, line numbers, headings) is not counted against the
/// ceilings; [`RestoreReport::rendered_tokens`] has the full size.
///
/// Files, newest first: skipped when deleted or already in the kept tail (neither uses
/// one of the `max_files` places); a note when over the per-file limit, when the
/// content would pass the total ceiling, or when no content was given; otherwise the
/// content. The plan comes first and counts against the file ceiling (cut to the
/// per-file limit, with the path to read the rest). Skills, newest first: each cut to
/// its limit; once the skill ceiling is nearly spent, older skills are dropped. The
/// digest lists every ledger file last.
pub fn plan_restoration(input: &RestoreInput) -> RestorePlan {
    let budget = input.budget;
    let mut report = RestoreReport::default();
    let mut attachments = Vec::new();
    let display = |path: &str| display_path(path, input.cwd.as_deref());

    if let Some(plan) = &input.plan {
        let limit = budget.max_tokens_per_file.min(budget.max_file_tokens);
        let (text, cut) = cut_to_tokens(&plan.content, limit.saturating_sub(PLAN_OVERHEAD), "plan");
        let attachment = plan_attachment(plan, &text, cut);
        if attachment.tokens <= budget.max_file_tokens && !text.trim().is_empty() {
            report.file_tokens += attachment.tokens;
            report.plan_restored = true;
            report.plan_cut = cut;
            attachments.push(attachment);
        }
    }

    let mut files: Vec<&FileReadEntry> = input.files.iter().collect();
    files.sort_by(|a, b| b.read_order.cmp(&a.read_order).then_with(|| a.path.cmp(&b.path)));
    let mut places = 0usize;
    for entry in &files {
        let outcome = if !entry.exists {
            FileOutcome::Deleted
        } else if entry.in_kept_tail {
            FileOutcome::InKeptTail
        } else if places >= budget.max_files {
            FileOutcome::NotRestored
        } else {
            let left = budget.max_file_tokens.saturating_sub(report.file_tokens);
            let full = entry
                .content
                .as_deref()
                .filter(|_| entry.tokens <= budget.max_tokens_per_file)
                .map(|content| file_attachment(entry, content, &display(&entry.path)))
                .filter(|_| entry.tokens <= left);
            let (attachment, outcome) = match full {
                Some(a) => (Some(a), FileOutcome::Restored),
                None => {
                    let reason = if entry.tokens > budget.max_tokens_per_file {
                        FileOutcome::ReferenceTooLarge
                    } else if entry.content.is_none() {
                        FileOutcome::ReferenceNoContent
                    } else {
                        FileOutcome::ReferenceOverBudget
                    };
                    let note = reference_attachment(&entry.path, &display(&entry.path), reason);
                    if note.tokens <= left { (Some(note), reason) } else { (None, FileOutcome::NotRestored) }
                }
            };
            if let Some(a) = attachment {
                places += 1;
                // Content counts at the ledger's estimate; a note as rendered.
                report.file_tokens += if outcome == FileOutcome::Restored { entry.tokens } else { a.tokens };
                attachments.push(a);
            }
            outcome
        };
        report.files.push((entry.path.clone(), outcome));
    }

    let mut skills: Vec<&SkillEntry> = input.skills.iter().collect();
    skills.sort_by_key(|s| std::cmp::Reverse(s.order));
    let mut restored: Vec<(&SkillEntry, String)> = Vec::new();
    for skill in skills {
        let left = budget.max_skill_tokens.saturating_sub(report.skill_tokens);
        let limit = budget.max_tokens_per_skill.min(left);
        if limit < MIN_SKILL_TOKENS.min(budget.max_tokens_per_skill).max(1) {
            report.skills_dropped.push(skill.name.clone());
            continue;
        }
        let (text, cut) = cut_to_tokens(&skill.content, limit, "skill");
        report.skill_tokens += estimate_tokens(&text);
        if cut {
            report.skills_cut.push(skill.name.clone());
        } else {
            report.skills_restored.push(skill.name.clone());
        }
        restored.push((skill, text));
    }
    if !restored.is_empty() {
        // Rendered oldest first, the order they were used in.
        restored.reverse();
        attachments.push(skills_attachment(&restored));
    }

    if !files.is_empty()
        && let Some(digest) = digest_attachment(&files, &report.files, budget.max_digest_tokens, &display)
    {
        report.digest_tokens = digest.tokens;
        attachments.push(digest);
    }

    report.rendered_tokens = attachments.iter().map(|a| a.tokens).sum();
    RestorePlan { attachments, report }
}

/// Tokens the plan's framing adds to its content.
const PLAN_OVERHEAD: u64 = 60;

/// `path` relative to `cwd` when it lies below it.
fn display_path(path: &str, cwd: Option<&str>) -> String {
    if let Some(cwd) = cwd {
        let cwd = cwd.trim_end_matches('/');
        if let Some(rest) = path.strip_prefix(cwd).and_then(|r| r.strip_prefix('/'))
            && !rest.is_empty()
        {
            return rest.to_owned();
        }
    }
    path.to_owned()
}

fn reminder(text: &str) -> String {
    format!("<system-reminder>\n{text}\n</system-reminder>")
}

fn tokens_of(rendered: &[String]) -> u64 {
    rendered.iter().map(|r| estimate_tokens(r)).sum()
}

/// A file restored as a Read call and its result, in the host's `file` attachment shape.
fn file_attachment(entry: &FileReadEntry, content: &str, display: &str) -> RestoredAttachment {
    let lines: Vec<&str> = content.split('\n').collect();
    let numbered: Vec<String> = lines.iter().enumerate().map(|(i, line)| format!("{}\t{line}", i + 1)).collect();
    let input = json!({"file_path": entry.path}).to_string();
    let rendered = vec![
        reminder(&format!("Read call, restored after compaction: {input}")),
        reminder(&format!("Read result:\n{}", numbered.join("\n"))),
    ];
    RestoredAttachment {
        attachment: json!({
            "type": "file",
            "filename": entry.path,
            "content": {
                "type": "text",
                "file": {
                    "filePath": entry.path,
                    "content": content,
                    "numLines": lines.len(),
                    "startLine": 1,
                    "totalLines": lines.len(),
                },
            },
            "displayPath": display,
        }),
        tokens: tokens_of(&rendered),
        rendered,
        rendered_role: "user",
    }
}

/// A file named but not restored, in the host's `compact_file_reference` shape.
fn reference_attachment(path: &str, display: &str, reason: FileOutcome) -> RestoredAttachment {
    let why = match reason {
        FileOutcome::ReferenceTooLarge => "it is too large",
        FileOutcome::ReferenceNoContent => "it could not be loaded again",
        _ => "it would take too much of the context",
    };
    let rendered = vec![reminder(&format!(
        "{path} (read earlier in this session) is not shown again here: {why}. \
         Use the Read tool on it if you need its content."
    ))];
    RestoredAttachment {
        attachment: json!({
            "type": "compact_file_reference",
            "filename": path,
            "displayPath": display,
        }),
        tokens: tokens_of(&rendered),
        rendered,
        rendered_role: "system",
    }
}

fn plan_attachment(plan: &PlanFile, text: &str, cut: bool) -> RestoredAttachment {
    let more = if cut { " It was cut to fit; read the file for the rest." } else { "" };
    let rendered =
        vec![reminder(&format!("The plan for this session is in {}.{more} Its current content:\n{text}", plan.path))];
    RestoredAttachment {
        attachment: json!({
            "type": "plan_file_reference",
            "planFilePath": plan.path,
            "planContent": text,
        }),
        tokens: tokens_of(&rendered),
        rendered,
        rendered_role: "user",
    }
}

fn skills_attachment(skills: &[(&SkillEntry, String)]) -> RestoredAttachment {
    let mut text = String::from("Skills used earlier in this session, with the instructions they gave:");
    for (skill, content) in skills {
        text.push_str(&format!("\n\n## Skill: {}\n{content}", skill.name));
    }
    let rendered = vec![reminder(&text)];
    RestoredAttachment {
        attachment: json!({
            "type": "invoked_skills",
            "skills": skills
                .iter()
                .map(|(s, content)| json!({"name": s.name, "content": content}))
                .collect::<Vec<_>>(),
        }),
        tokens: tokens_of(&rendered),
        rendered,
        rendered_role: "user",
    }
}

/// The list of every file read before compaction, newest first, within `max_tokens`
/// (the oldest entries give way to a count).
fn digest_attachment(
    files: &[&FileReadEntry],
    outcomes: &[(String, FileOutcome)],
    max_tokens: u64,
    display: &dyn Fn(&str) -> String,
) -> Option<RestoredAttachment> {
    const INTRO: &str = "Files read before this conversation was summarized, newest first. \
                         \"unchanged\" means the file still has the content that was read; \
                         read a file again only when you need text that is not shown here.";
    let mut lines: Vec<String> = Vec::new();
    let mut entries = Vec::new();
    for (entry, (_, outcome)) in files.iter().zip(outcomes) {
        let state = if !entry.exists {
            "deleted since it was read"
        } else if entry.changed_since_read {
            "changed since it was read"
        } else {
            "unchanged"
        };
        let shown = match outcome {
            FileOutcome::Restored => ", shown above",
            FileOutcome::InKeptTail => ", shown in the recent messages",
            _ => "",
        };
        lines.push(format!("- {} ({state}{shown})", display(&entry.path)));
        entries.push(json!({
            "path": entry.path,
            "exists": entry.exists,
            "changedSinceRead": entry.changed_since_read,
        }));
    }
    // Drop the oldest lines until the digest fits.
    let mut keep = lines.len();
    loop {
        let mut text = String::from(INTRO);
        for line in &lines[..keep] {
            text.push('\n');
            text.push_str(line);
        }
        if keep < lines.len() {
            text.push_str(&format!("\n- … and {} older files", lines.len() - keep));
        }
        let rendered = vec![reminder(&text)];
        let tokens = tokens_of(&rendered);
        if tokens <= max_tokens {
            entries.truncate(keep);
            return Some(RestoredAttachment {
                attachment: json!({"type": "ctxd_read_files", "files": entries}),
                tokens,
                rendered,
                rendered_role: "system",
            });
        }
        if keep == 0 {
            return None;
        }
        keep -= 1;
    }
}
