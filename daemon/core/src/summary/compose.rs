//! Turning the scanned facts into the nine sections' entries.
//!
//! Each writer picks what a model needs to carry on from that part of the summary and
//! decides, entry by entry, what may be cut and what must stay: the first and latest
//! requests, every user message in at least a short form, the newest files and errors.
//! The layout step then fits the result under the cap.

use std::collections::{BTreeMap, HashSet};

use super::layout::{Entry, Section};
use super::reply::{SummarySection, split_sections};
use super::scan::{Facts, Outcome, Prompt, Said, Step};
use super::terms::extension;
use super::text::{CutStyle, cut_chars, short, thousands};
use super::{FileTouched, OfflineOptions, carry};

/// Room for a request quoted inside another entry (Current Work, Pending Tasks).
const QUOTE_BYTES: usize = 300;
/// Minimum body of the entries that matter most, kept as long as the cap allows it.
const MIN_KEY: usize = 200;
/// Short form of a user message in section 6.
const MIN_USER_MESSAGE: usize = 160;
/// Shortest form, used before any user message is dropped.
const TINY_USER_MESSAGE: usize = 100;
/// Bytes of a user message's brief form, its first words: what every message keeps
/// before the oldest are counted instead.
const BRIEF_USER_MESSAGE: usize = 40;
/// Ranges listed per file before "and N more".
const MAX_RANGES: usize = 6;
/// Steps listed in Current Work.
const MAX_RECENT_STEPS: usize = 15;
/// Entries carried from an earlier summary's sections 1, 7 and 8 (section 6 and the
/// files carry all of theirs: every message and file stays accounted for).
const MAX_CARRIED: usize = 8;
/// Lead of an intent entry carried from an earlier summary.
const EARLIER: &str = "Earlier: ";
/// Lead of a task carried from an earlier summary.
const EARLIER_TASK: &str = "From before the previous compaction (may be done by now): ";
/// Said after the files section's marker: which files went, and where they are.
const FILES_LEFT_OUT: &str = " (the oldest; the transcript has their reads and edits)";
/// Earlier turns whose closing reply Problem Solving quotes.
const MAX_EARLIER_TURNS: usize = 12;

/// Context shared by the section writers.
struct Ctx<'a> {
    facts: &'a Facts,
    options: &'a OfflineOptions,
    focus_terms: Vec<String>,
    prior: Vec<SummarySection<'a>>,
    /// Sequence number of the last message that ended an assistant turn.
    last_reply_seq: usize,
}

/// Builds the nine sections.
pub(super) fn sections(facts: &Facts, options: &OfflineOptions) -> Vec<Section> {
    let prior = facts.prior_summary.as_deref().map(split_sections).unwrap_or_default();
    let last_reply_seq = facts.messages.iter().filter(|m| m.ends_turn()).map(|m| m.last_seq).max().unwrap_or(0);
    let ctx = Ctx { facts, options, focus_terms: focus_terms(options.focus.as_deref()), prior, last_reply_seq };
    let mut sections = vec![
        ctx.intent(),
        ctx.concepts(),
        ctx.files(),
        ctx.errors(),
        ctx.problem_solving(),
        ctx.user_messages(),
        ctx.pending(),
        ctx.current_work(),
        ctx.next_step(),
    ];
    for section in &mut sections {
        for entry in &mut section.entries {
            if !entry.focus {
                entry.focus = ctx.matches_focus(&entry.lead) || ctx.matches_focus(&entry.body);
            }
        }
    }
    sections
}

/// Words of the focus instructions worth matching on.
fn focus_terms(focus: Option<&str>) -> Vec<String> {
    const FILLER: &[&str] =
        &["focus", "the", "and", "for", "with", "keep", "only", "about", "on", "from", "that", "this", "what"];
    let Some(focus) = focus else {
        return Vec::new();
    };
    let mut terms: Vec<String> = focus
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '/' || c == '-'))
        .map(|w| w.trim_matches(['.', '-', '/']).to_lowercase())
        .filter(|w| w.chars().count() >= 3 && !FILLER.contains(&w.as_str()))
        .collect();
    terms.sort();
    terms.dedup();
    terms
}

fn section(number: usize, entries: Vec<Entry>, empty: &'static str, noun: (&'static str, &'static str)) -> Section {
    Section { number, entries, empty, noun, folded: 0, marker_hint: "" }
}

/// An entry that only says a section was empty ("None recorded.").
fn is_placeholder(entry: &str) -> bool {
    let bare = entry.trim().trim_end_matches('.').to_lowercase();
    bare.is_empty()
        || matches!(bare.as_str(), "none" | "n/a" | "nothing" | "none yet" | "none recorded")
        || bare == "nothing is in progress"
        || (bare.starts_with("no ") && bare.ends_with("in this part of the conversation"))
}

/// Messages in order, identical ones (the same text) folded into one entry at the
/// latest one's place, their counts added.
fn group_identical(messages: Vec<(usize, String)>) -> Vec<(usize, String)> {
    let mut latest: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, (_, text)) in messages.iter().enumerate() {
        latest.insert(text.trim(), i);
    }
    if latest.len() == messages.len() {
        return messages;
    }
    let mut times: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (n, text) in &messages {
        *times.entry(text.trim()).or_default() += n;
    }
    let keep: Vec<bool> = messages.iter().enumerate().map(|(i, (_, text))| latest[text.trim()] == i).collect();
    let counts: Vec<usize> = messages.iter().map(|(_, text)| times[text.trim()]).collect();
    messages
        .into_iter()
        .zip(keep.into_iter().zip(counts))
        .filter(|(_, (keep, _))| *keep)
        .map(|((_, text), (_, n))| (n, text))
        .collect()
}

/// `“text”` on one line, cut to `bytes`.
fn quote(text: &str, bytes: usize) -> String {
    format!("“{}”", short(text, bytes))
}

impl Ctx<'_> {
    fn matches_focus(&self, text: &str) -> bool {
        if self.focus_terms.is_empty() || text.is_empty() {
            return false;
        }
        let lower = text.to_lowercase();
        self.focus_terms.iter().any(|t| lower.contains(t.as_str()))
    }

    /// A section of the earlier summary as flat entries (quotations of still earlier
    /// summaries opened, placeholders such as "None" left out), and the count its
    /// marker says was left out; `None` when it has no entry.
    fn carried(&self, number: u8) -> Option<(Vec<String>, usize)> {
        let body = self.prior.iter().find(|s| s.number == number)?.body;
        let mut folded = 0;
        let mut entries = Vec::new();
        for entry in carry::entries(body) {
            match carry::folded_count(&entry) {
                Some(n) => folded += n,
                None if is_placeholder(&entry) => {}
                None => entries.push(entry),
            }
        }
        (!entries.is_empty() || folded > 0).then_some((entries, folded))
    }

    /// A user message as kept in the summary: whole up to the configured length.
    fn message_text(&self, prompt: &Prompt) -> String {
        cut_chars(&prompt.text, self.options.max_user_message_chars.max(1), CutStyle::HeadTail)
    }

    fn turn_end(&self, prompt_index: usize) -> usize {
        self.facts.prompts.get(prompt_index + 1).map_or(usize::MAX, |p| p.seq)
    }

    fn latest_prompt(&self) -> Option<&Prompt> {
        self.facts.prompts.last()
    }

    /// Prompts after the assistant's last finished reply.
    fn unanswered(&self) -> impl Iterator<Item = &Prompt> {
        self.facts.prompts.iter().filter(move |p| p.seq > self.last_reply_seq)
    }

    fn failed_steps(&self) -> impl Iterator<Item = (usize, &Step, &str)> {
        self.facts.steps.iter().enumerate().filter_map(|(i, s)| match &s.outcome {
            Outcome::Failed(why) => Some((i, s, why.as_str())),
            _ => None,
        })
    }

    // 1 ---------------------------------------------------------------------------
    fn intent(&self) -> Section {
        let f = self.facts;
        let mut entries = Vec::new();
        if let Some(focus) = self.options.focus.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            let mut e = Entry::new("- Focus requested for this summary: ", focus).min(MIN_KEY).keep();
            e.focus = true;
            entries.push(e);
        }
        // The earlier summary's first request is the session's; its other entries
        // (written by another summarizer) are carried flat, a few at most.
        let mut prior_first = None;
        if let Some((carried, _)) = self.carried(1) {
            let mut earlier = 0;
            for entry in carried {
                if let Some(first) = entry.strip_prefix("First request: ").or_else(|| entry.strip_prefix("Request: ")) {
                    prior_first.get_or_insert_with(|| first.to_owned());
                } else if ["Latest request: ", "Scope of this summary", "Focus requested for this summary"]
                    .iter()
                    .any(|lead| entry.starts_with(lead))
                {
                } else if earlier < MAX_CARRIED {
                    let text = entry.strip_prefix(EARLIER).unwrap_or(&entry).to_owned();
                    entries.push(Entry::new(format!("- {EARLIER}"), text).min(100).rank(1));
                    earlier += 1;
                }
            }
        } else if f.prior_summary.is_some() && self.prior.is_empty() {
            // An earlier summary in a shape we cannot split: keep its start.
            let text = f.prior_summary.as_deref().unwrap_or("");
            entries.push(Entry::new(format!("- {EARLIER}"), text).min(100).rank(1));
        }
        match (prior_first, f.prompts.as_slice()) {
            (None, []) => {}
            (Some(first), []) => entries.push(Entry::new("- First request: ", first).min(MIN_KEY).keep().head_tail()),
            (None, [only]) => {
                entries.push(Entry::new("- Request: ", self.message_text(only)).min(MIN_KEY).keep().head_tail());
            }
            (Some(first), [.., last]) => {
                entries.insert(0, Entry::new("- First request: ", first).min(MIN_KEY).keep().head_tail());
                entries.push(Entry::new("- Latest request: ", self.message_text(last)).min(MIN_KEY).keep().head_tail());
            }
            (None, [first, .., last]) => {
                entries.push(Entry::new("- First request: ", self.message_text(first)).min(MIN_KEY).keep().head_tail());
                entries.push(Entry::new("- Latest request: ", self.message_text(last)).min(MIN_KEY).keep().head_tail());
            }
        }
        let failed = self.failed_steps().count();
        let scope = format!(
            "- Scope of this summary: {} user message{}, {} tool call{} ({} failed), {} file{} touched.",
            thousands(f.prompts.len()),
            plural(f.prompts.len()),
            thousands(f.steps.len()),
            plural(f.steps.len()),
            thousands(failed),
            thousands(f.files.len()),
            plural(f.files.len()),
        );
        entries.push(Entry::new(scope, "").min(0).rank(0));
        section(1, entries, "- No user request is recorded in this part of the conversation.", ("entry", "entries"))
    }

    // 2 ---------------------------------------------------------------------------
    fn concepts(&self) -> Section {
        let f = self.facts;
        let mut entries = Vec::new();
        let (code, words) = f.terms.top(20, 15, 2);
        if !code.is_empty() {
            let list: Vec<String> = code.iter().map(|r| format!("`{}` ({})", r.term, r.count)).collect();
            entries.push(Entry::new("- Identifiers: ", list.join(", ")).min(80).rank(3));
        }
        if !words.is_empty() {
            let list: Vec<String> = words.iter().map(|r| format!("{} ({})", r.term, r.count)).collect();
            entries.push(Entry::new("- Recurring terms: ", list.join(", ")).min(60).rank(2));
        }
        let mut exts: BTreeMap<String, usize> = BTreeMap::new();
        for file in &f.files {
            if let Some(ext) = extension(&file.path) {
                *exts.entry(format!(".{}", ext.to_ascii_lowercase())).or_default() += 1;
            }
        }
        if !exts.is_empty() {
            let mut list: Vec<(String, usize)> = exts.into_iter().collect();
            list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let text: Vec<String> = list.iter().map(|(e, n)| format!("{e} ({n} file{})", plural(*n))).collect();
            entries.push(Entry::new("- File types: ", text.join(", ")).min(60).rank(4));
        }
        let mut tools: BTreeMap<&str, usize> = BTreeMap::new();
        for step in f.steps.iter().filter(|s| !s.tool.is_empty()) {
            *tools.entry(step.tool.as_str()).or_default() += 1;
        }
        if !tools.is_empty() {
            let mut list: Vec<(&str, usize)> = tools.into_iter().collect();
            list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            let text: Vec<String> = list.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
            entries.push(Entry::new("- Tools used: ", text.join(", ")).min(60).rank(1));
        }
        section(2, entries, "- None stood out.", ("entry", "entries"))
    }

    // 3 ---------------------------------------------------------------------------
    /// Every file this part read or changed is named, by its path at least (paths are
    /// short, and the next turn cannot do without knowing which files are in play):
    /// what it did to each, and the last edit, give way first. Files of the earlier
    /// summary that this part did not touch again follow, and are cut before any of
    /// this part's.
    fn files(&self) -> Section {
        let files = &self.facts.files;
        let mut entries: Vec<Entry> = files
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let actions = format!(": {}", file_actions(file));
                let edit = match &file.last_edit {
                    Some(edit) if !(edit.old.is_empty() && edit.new.is_empty()) => {
                        format!(". Last edit: `{}` → `{}`", edit.old, edit.new)
                    }
                    _ => String::new(),
                };
                // Newest first in the list; the newest also rank highest.
                Entry::new(format!("- {}", file.path), format!("{actions}{edit}"))
                    .min(actions.len())
                    .brief(0)
                    .whole_prefix(actions.len())
                    .named()
                    .rank(files.len() - i + 1)
            })
            .collect();
        // Files of the earlier summary that this part did not touch again, flat after
        // this part's (the newer entry describes a file touched again).
        let mut folded = 0;
        if let Some((carried, prior_folded)) = self.carried(3) {
            folded = prior_folded;
            for entry in carried {
                let path = entry.split_once(": ").map_or(entry.as_str(), |(p, _)| p);
                if !files.iter().any(|f| f.path == path) {
                    entries.push(Entry::new("- ", entry).min(60).rank(0));
                }
            }
        }
        let mut section =
            section(3, entries, "- No file was read or changed in this part of the conversation.", ("file", "files"));
        section.folded = folded;
        // Files are left out oldest first, and only past the file list's own room.
        section.marker_hint = FILES_LEFT_OUT;
        section
    }

    // 4 ---------------------------------------------------------------------------
    fn errors(&self) -> Section {
        let steps = &self.facts.steps;
        // Runs of adjacent calls that failed for the same reason (parallel calls
        // cancelled together) make one entry.
        let mut runs: Vec<(usize, usize, &str)> = Vec::new(); // (first, last, why)
        for (i, _, why) in self.failed_steps() {
            match runs.last_mut() {
                Some(run) if run.1 + 1 == i && run.2 == why => run.1 = i,
                _ => runs.push((i, i, why)),
            }
        }
        let entries: Vec<Entry> = runs
            .iter()
            .enumerate()
            .map(|(n, &(first, last, why))| {
                let step = &steps[last];
                let after = step.result_seq.unwrap_or(step.seq);
                let end = self.turn_end_after(after);
                let next: Vec<String> = steps[last + 1..]
                    .iter()
                    .filter(|s| s.seq > after && s.seq < end)
                    .take(3)
                    .map(|s| format!("{}{}", s.label, outcome_note(&s.outcome)))
                    .collect();
                let then = if !next.is_empty() {
                    format!("Then: {}.", next.join("; "))
                } else if self.facts.said.iter().any(|s| s.seq > after && s.seq < end) {
                    "Then the assistant replied without another tool call (see Problem Solving).".to_owned()
                } else {
                    "Nothing was done about it yet.".to_owned()
                };
                let later_ok = steps[first..=last].iter().all(|failed| {
                    !failed.tool.is_empty()
                        && steps[last + 1..].iter().any(|s| s.label == failed.label && s.outcome == Outcome::Ok)
                });
                let resolved = match (later_ok, first == last) {
                    (false, _) => "",
                    (true, true) => " The same call succeeded later.",
                    (true, false) => " The same calls succeeded later.",
                };
                let lead = if first == last {
                    format!("- {} failed: ", steps[first].label)
                } else {
                    format!("- {} and {} more call{} failed: ", steps[first].label, last - first, plural(last - first))
                };
                Entry::new(lead, format!("{}{then}{resolved}", sentence(why))).min(100).rank(n + 1)
            })
            .collect();
        section(4, entries, "- No tool call failed in this part of the conversation.", ("error", "errors"))
    }

    /// End of the turn that contains `seq` (the next prompt's sequence number).
    fn turn_end_after(&self, seq: usize) -> usize {
        self.facts.prompts.iter().map(|p| p.seq).find(|&s| s > seq).unwrap_or(usize::MAX)
    }

    // 5 ---------------------------------------------------------------------------
    fn problem_solving(&self) -> Section {
        let f = self.facts;
        let mut entries = Vec::new();
        // Texts already quoted, so a reply near two failures or closing a turn is
        // quoted once.
        let mut quoted: HashSet<usize> = HashSet::new();
        let failures: Vec<&Step> = self.failed_steps().map(|(_, s, _)| s).collect();
        for (n, step) in failures.iter().enumerate() {
            let after = step.result_seq.unwrap_or(step.seq);
            // Up to the next failure's result, or the end of the turn.
            let next_failure = failures.get(n + 1).map_or(usize::MAX, |s| s.result_seq.unwrap_or(s.seq));
            let end = self.turn_end_after(after).min(next_failure);
            let texts: Vec<&Said> = f.said.iter().filter(|s| s.seq > after && s.seq < end).take(2).collect();
            if !texts.is_empty() {
                quoted.extend(texts.iter().map(|s| s.seq));
                let body: Vec<&str> = texts.iter().map(|s| s.text.as_str()).collect();
                entries.push(
                    Entry::new(format!("- After {} failed: ", step.label), body.join("\n")).min(100).rank(1000 + n),
                );
            }
        }
        // How earlier requests ended: the assistant's closing words of each turn.
        let turns = f.prompts.len();
        let first_turn = turns.saturating_sub(MAX_EARLIER_TURNS + 1);
        for t in first_turn..turns.saturating_sub(1) {
            let prompt = &f.prompts[t];
            let end = self.turn_end(t);
            let closing = f.said.iter().rev().find(|s| s.seq > prompt.seq && s.seq < end);
            if let Some(said) = closing.filter(|s| !quoted.contains(&s.seq)) {
                entries.push(
                    Entry::new(format!("- Outcome of {}: ", quote(&prompt.text, 80)), said.text.as_str())
                        .min(80)
                        .rank(t + 1),
                );
            }
        }
        section(5, entries, "- Nothing to add beyond Current Work.", ("entry", "entries"))
    }

    // 6 ---------------------------------------------------------------------------
    /// Every user message of the session: the earlier summary's, read back one by one,
    /// then this part's. Each is one entry, cut only inside itself; identical messages
    /// are one entry with their count; what the cap forces out is counted in one marker
    /// (with what earlier summaries already counted there), never cut across messages.
    fn user_messages(&self) -> Section {
        let mut folded = 0usize;
        let mut messages: Vec<(usize, String)> = Vec::new();
        if let Some(prior) = self.prior.iter().find(|s| s.number == 6) {
            for entry in carry::entries(prior.body) {
                if let Some(n) = carry::folded_count(&entry) {
                    folded += n;
                } else if !entry.starts_with("No user message in this part") {
                    // Only the section's own placeholder is skipped: a message may
                    // well be "none".
                    let (times, text) = carry::split_times(&entry);
                    messages.push((times, text.to_owned()));
                }
            }
        }
        messages.extend(self.facts.prompts.iter().map(|p| (1, self.message_text(p))));
        let messages = group_identical(messages);
        let last = messages.len().saturating_sub(1);
        let entries = messages
            .into_iter()
            .enumerate()
            .map(|(i, (times, text))| {
                let lead = if times > 1 { format!("- {}", carry::times_lead(times)) } else { "- ".to_owned() };
                let e = Entry::new(lead, text)
                    .stands_for(times)
                    .min(MIN_USER_MESSAGE)
                    .tiny(TINY_USER_MESSAGE)
                    .brief(BRIEF_USER_MESSAGE)
                    .rank(i + 1)
                    .head_tail();
                if i == 0 || i == last { e.keep() } else { e }
            })
            .collect();
        let mut section = section(
            6,
            entries,
            "- No user message in this part of the conversation.",
            ("user message", "user messages"),
        );
        section.folded = folded;
        section
    }

    // 7 ---------------------------------------------------------------------------
    fn pending(&self) -> Section {
        let f = self.facts;
        let mut entries = Vec::new();
        if let Some(todos) = &f.todos {
            for (i, todo) in todos.iter().enumerate().filter(|(_, t)| t.status != "completed") {
                let rank = if todo.status == "in_progress" { 10_000 } else { 5_000 - i.min(4_999) };
                entries.push(Entry::new(format!("- [{}] ", todo.status), todo.content.as_str()).min(80).rank(rank));
            }
        } else if let Some((carried, _)) = self.carried(7) {
            // The earlier summary's open tasks; requests it had not answered are in
            // section 6 and answered or not by now, so they are not carried.
            for entry in carried.into_iter().filter(|e| !e.starts_with("Not yet answered: ")).take(MAX_CARRIED) {
                let text = entry.strip_prefix(EARLIER_TASK).unwrap_or(&entry).to_owned();
                entries.push(Entry::new(format!("- {EARLIER_TASK}"), text).min(80).rank(0));
            }
        }
        let unanswered: Vec<&Prompt> = self.unanswered().collect();
        let last = unanswered.len().saturating_sub(1);
        for (i, prompt) in unanswered.iter().enumerate() {
            let mut e =
                Entry::new("- Not yet answered: ", self.message_text(prompt)).min(MIN_KEY).rank(20_000 + i).head_tail();
            if i == last {
                e = e.keep();
            }
            entries.push(e);
        }
        section(7, entries, "- None recorded.", ("task", "tasks"))
    }

    // 8 ---------------------------------------------------------------------------
    fn current_work(&self) -> Section {
        let f = self.facts;
        let mut entries = Vec::new();
        let since = self.latest_prompt().map_or(0, |p| p.seq);
        if let Some(prompt) = self.latest_prompt() {
            entries.push(Entry::new("- Working on: ", quote(&prompt.text, QUOTE_BYTES)).min(MIN_KEY).keep());
        }
        if f.prompts.is_empty()
            && let Some((carried, _)) = self.carried(8)
        {
            for entry in carried.into_iter().take(MAX_CARRIED) {
                entries.push(Entry::new("- Before the previous compaction: ", entry).min(80).rank(0));
            }
        }
        let recent: Vec<&Step> = f.steps.iter().filter(|s| s.seq > since).collect();
        if !recent.is_empty() {
            let skipped = recent.len().saturating_sub(MAX_RECENT_STEPS);
            let mut list: Vec<String> =
                recent[skipped..].iter().map(|s| format!("{}{}", s.label, outcome_note(&s.outcome))).collect();
            if skipped > 0 {
                list.insert(0, format!("({} earlier steps)", thousands(skipped)));
            }
            let lead = if f.prompts.is_empty() {
                format!("- Steps in this part of the conversation ({}): ", thousands(recent.len()))
            } else {
                format!("- Steps since that request ({}): ", thousands(recent.len()))
            };
            entries.push(Entry::new(lead, list.join("; ")).min(120).rank(2).head_tail());
        }
        if let Some(last) = f.said.last() {
            let text: Vec<&str> =
                f.said.iter().filter(|s| s.message == last.message).map(|s| s.text.as_str()).collect();
            let lead = if last.seq > since {
                "- Last assistant message: "
            } else {
                "- Last assistant message (before the latest request): "
            };
            entries.push(Entry::new(lead, text.join("\n")).min(MIN_KEY).keep().head_tail());
        }
        if let Some(step) = f.steps.last() {
            let after_text = f.said.last().is_none_or(|s| s.seq < step.seq);
            if after_text {
                let note = match &step.outcome {
                    Outcome::Pending => format!("- In flight: {} was called and has no result yet.", step.label),
                    Outcome::Failed(why) => format!("- The last step failed: {}: {}", step.label, short(why, 200)),
                    Outcome::Ok => {
                        format!("- The last step was {}, which succeeded; no reply followed it yet.", step.label)
                    }
                };
                entries.push(Entry::new(note, "").min(0).keep());
            }
        }
        section(8, entries, "- Nothing is in progress.", ("entry", "entries"))
    }

    // 9 ---------------------------------------------------------------------------
    fn next_step(&self) -> Section {
        let f = self.facts;
        let todos = f.todos.as_deref().unwrap_or(&[]);
        let text = if let Some(prompt) = self.unanswered().last() {
            let started = f.steps.iter().any(|s| s.seq > prompt.seq) || f.said.iter().any(|s| s.seq > prompt.seq);
            let verb = if started { "Continue working on" } else { "Answer" };
            format!("- {verb} the latest request: {}", quote(&prompt.text, QUOTE_BYTES))
        } else if let Some(todo) = todos.iter().find(|t| t.status == "in_progress") {
            format!("- Continue the task in progress: {}", short(&todo.content, QUOTE_BYTES))
        } else if let Some(todo) = todos.iter().find(|t| t.status != "completed") {
            format!("- Start the next pending task: {}", short(&todo.content, QUOTE_BYTES))
        } else if let Some(step) = f
            .steps
            .last()
            .filter(|s| matches!(s.outcome, Outcome::Failed(_)) && f.said.last().is_none_or(|t| t.seq < s.seq))
        {
            format!("- Deal with the failure of {}.", step.label)
        } else if f.prompts.is_empty() {
            if f.messages.last().is_none_or(|m| m.ends_turn()) {
                "- None: the assistant's last reply finished its turn. Wait for the user's next message.".to_owned()
            } else {
                "- Continue the work in progress described in Current Work.".to_owned()
            }
        } else {
            "- None: the latest request was answered. Wait for the user's next message rather than starting new work."
                .to_owned()
        };
        section(9, vec![Entry::new("", text).min(MIN_KEY).keep()], "- None.", ("entry", "entries"))
    }
}

/// `text` ended as a sentence, followed by a space, ready for the next one.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    if text.ends_with(['.', '!', '?', ':', '…']) { format!("{text} ") } else { format!("{text}. ") }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn outcome_note(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Ok => "",
        Outcome::Failed(_) => " (failed)",
        Outcome::Pending => " (no result yet)",
    }
}

/// "read lines 1–40, 90–120 of 300; edited ×2".
fn file_actions(file: &FileTouched) -> String {
    let mut parts: Vec<String> = Vec::new();
    if file.read {
        let whole =
            matches!((file.ranges.as_slice(), file.total_lines), ([r], Some(total)) if r.start == 1 && r.end >= total);
        let text = if whole {
            format!(
                "read in full ({} lines)",
                thousands(usize::try_from(file.total_lines.unwrap_or(0)).unwrap_or(usize::MAX))
            )
        } else if file.ranges.is_empty() {
            "read".to_owned()
        } else {
            let shown: Vec<String> =
                file.ranges.iter().take(MAX_RANGES).map(|r| format!("{}–{}", r.start, r.end)).collect();
            let more = file.ranges.len().saturating_sub(MAX_RANGES);
            let mut t = format!("read lines {}", shown.join(", "));
            if more > 0 {
                t.push_str(&format!(" and {more} more range{}", plural(more)));
            }
            if let Some(total) = file.total_lines {
                t.push_str(&format!(" of {}", thousands(usize::try_from(total).unwrap_or(usize::MAX))));
            }
            t
        };
        parts.push(text);
    }
    if file.edited {
        parts.push(if file.edits > 1 { format!("edited ×{}", file.edits) } else { "edited".to_owned() });
    }
    if file.written {
        parts.push(match file.written_lines {
            Some(n) => format!("written ({n} line{})", plural(n)),
            None => "written".to_owned(),
        });
    }
    if file.restored {
        parts.push("re-attached after the previous compaction".to_owned());
    }
    if file.referenced {
        parts.push("too large to re-attach after the previous compaction; read it again when needed".to_owned());
    }
    if parts.is_empty() {
        parts.push("touched".to_owned());
    }
    parts.join("; ")
}
