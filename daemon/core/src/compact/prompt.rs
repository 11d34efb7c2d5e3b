//! The words of compaction: the instruction that asks a model for a summary, the note
//! that asks again, the system prompt of the fallback path, and the text of the summary
//! message installed after the boundary.
//!
//! The wording lives in `templates/*.md` so it can be read and reviewed as prose; this
//! file only assembles the pieces. Every form asks for the same nine numbered sections,
//! because one parser ([`crate::summary::parse_summary_reply`]) reads every reply and a
//! later compaction may carry an earlier summary's sections forward.

const SECTIONS: &str = include_str!("templates/sections.md");
const INTRO_FULL: &str = include_str!("templates/intro_full.md");
const INTRO_SHORT: &str = include_str!("templates/intro_short.md");
const INTRO_RECENT: &str = include_str!("templates/intro_recent.md");
const FORMAT_FULL: &str = include_str!("templates/format_full.md");
const FORMAT_SHORT: &str = include_str!("templates/format_short.md");
const KEPT_AFTER: &str = include_str!("templates/kept_after.md");
const REASK: &str = include_str!("templates/reask.md");
const FALLBACK_SYSTEM: &str = include_str!("templates/fallback_system.md");
const MESSAGE_INTRO: &str = include_str!("templates/message_intro.md");
const MESSAGE_TRANSCRIPT: &str = include_str!("templates/message_transcript.md");
const MESSAGE_HISTORY_TOOLS: &str = include_str!("templates/message_history_tools.md");
const MESSAGE_CONTINUE: &str = include_str!("templates/message_continue.md");
const MESSAGE_KEPT_AFTER: &str = include_str!("templates/message_kept_after.md");
const MESSAGE_KEPT_BEFORE: &str = include_str!("templates/message_kept_before.md");

/// Which summary is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptForm {
    /// An `<analysis>` draft, then the `<summary>`.
    Full,
    /// Only the `<summary>`, in at most `max_words` words: for small windows and for
    /// models that spend too much on drafts.
    Short { max_words: u32 },
    /// Partial compaction: summarize only the messages after a point; the earlier part
    /// stays as it is or is already summarized. `start_hint` (for example the first
    /// recent user message, shortened) tells the model where the recent part begins.
    RecentOnly { start_hint: Option<String> },
}

/// Everything that shapes the summary instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptSpec {
    pub form: PromptForm,
    /// The user's focus instructions merged with PreCompact hook output
    /// ([`merge_instructions`]).
    pub additional: Option<String>,
    /// The newest messages are kept verbatim after the summary and are not part of the
    /// request (automatic compaction keeps the latest tool round; partial compaction
    /// "up to" a message keeps what follows it).
    pub newer_messages_kept: bool,
}

impl PromptSpec {
    /// The full form, with nothing added.
    pub fn full() -> PromptSpec {
        PromptSpec { form: PromptForm::Full, additional: None, newer_messages_kept: false }
    }
}

/// The summary instruction: the text sent as (or appended to) the final user message of
/// the summary request.
pub fn summary_instruction(spec: &PromptSpec) -> String {
    let (intro, format) = match &spec.form {
        PromptForm::Full => (INTRO_FULL.trim_end().to_owned(), FORMAT_FULL),
        PromptForm::Short { max_words } => {
            (INTRO_SHORT.trim_end().replace("{max_words}", &max_words.to_string()), FORMAT_SHORT)
        }
        PromptForm::RecentOnly { start_hint } => {
            let hint = match start_hint.as_deref().map(str::trim) {
                Some(h) if !h.is_empty() => {
                    format!(" The recent part begins with this message: \"{h}\"")
                }
                _ => String::new(),
            };
            (INTRO_RECENT.trim_end().replace("{start_hint}", &hint), FORMAT_FULL)
        }
    };
    let mut out = String::new();
    out.push_str(&intro);
    out.push_str("\n\n");
    out.push_str(SECTIONS.trim_end());
    if spec.newer_messages_kept {
        out.push_str("\n\n");
        out.push_str(KEPT_AFTER.trim_end());
    }
    out.push_str("\n\n");
    out.push_str(format.trim_end());
    if let Some(extra) = spec.additional.as_deref().map(str::trim)
        && !extra.is_empty()
    {
        out.push_str("\n\nAdditional instructions:\n");
        out.push_str(extra);
    }
    out
}

/// Merges the user's focus instructions with the PreCompact hooks' output into one
/// "additional instructions" text: the user's words first, then each hook's in order,
/// empty ones and exact repeats left out. `None` when nothing remains.
pub fn merge_instructions(focus: Option<&str>, hook_outputs: &[String]) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in focus.into_iter().chain(hook_outputs.iter().map(String::as_str)) {
        let part = part.trim();
        if !part.is_empty() && !parts.contains(&part) {
            parts.push(part);
        }
    }
    if parts.is_empty() { None } else { Some(parts.join("\n\n")) }
}

/// The note added to the instruction when the previous reply had no `<summary>`.
pub fn reask_note() -> &'static str {
    REASK.trim_end()
}

/// The system prompt of the streaming fallback (path 2), which does not share the
/// parent's system prompt.
pub fn fallback_system_prompt() -> &'static str {
    FALLBACK_SYSTEM.trim_end()
}

/// Where messages kept verbatim sit relative to the summary message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptMessages {
    /// Nothing was kept.
    None,
    /// The newest messages follow the summary (automatic compaction, partial "up to").
    After,
    /// The earliest messages precede the summary (partial "from").
    Before,
}

/// The tools that search the history of the session (ctxd's MCP server), named as the
/// model calls them (`mcp__ctxd__search_history`), when the host gives the model them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryTools {
    /// Finds records by their words.
    pub search: String,
    /// Reads one record in full.
    pub read: String,
}

/// The closing line that points the model at the history tools, and at the
/// transcript's file when one is named.
pub fn history_tools_line(tools: &HistoryTools, transcript_path: Option<&str>) -> String {
    let file = transcript_path.map(|p| format!(" (it is the file {p})")).unwrap_or_default();
    MESSAGE_HISTORY_TOOLS
        .trim_end()
        .replace("{search}", &tools.search)
        .replace("{read}", &tools.read)
        .replace("{file}", &file)
}

/// What the installed summary message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryMessage {
    /// The summary body (without tags), fidelity additions included.
    pub body: String,
    /// Where the full transcript can be read, when the caller wants the model to know.
    pub transcript_path: Option<String>,
    /// The history tools, when the model has them: the closing line names them, since
    /// a search finds an exact earlier text where a path only says where it lies.
    pub history_tools: Option<HistoryTools>,
    /// Names of the tools used before the summary, in order of first use.
    pub tools_used: Vec<String>,
    pub kept: KeptMessages,
}

/// The text of the summary user message.
pub fn summary_message_text(message: &SummaryMessage) -> String {
    let mut out = String::new();
    out.push_str(MESSAGE_INTRO.trim_end());
    if !message.tools_used.is_empty() {
        out.push_str("\n\nTools used before this summary: ");
        out.push_str(&message.tools_used.join(", "));
        out.push('.');
    }
    out.push_str("\n\nSummary:\n");
    out.push_str(message.body.trim());
    let path = message.transcript_path.as_deref().filter(|p| !p.is_empty());
    if let Some(tools) = &message.history_tools {
        out.push_str("\n\n");
        out.push_str(&history_tools_line(tools, path));
    } else if let Some(path) = path {
        out.push_str("\n\n");
        out.push_str(&MESSAGE_TRANSCRIPT.trim_end().replace("{path}", path));
    }
    out.push_str("\n\n");
    out.push_str(MESSAGE_CONTINUE.trim_end());
    match message.kept {
        KeptMessages::None => {}
        KeptMessages::After => {
            out.push_str("\n\n");
            out.push_str(MESSAGE_KEPT_AFTER.trim_end());
        }
        KeptMessages::Before => {
            out.push_str("\n\n");
            out.push_str(MESSAGE_KEPT_BEFORE.trim_end());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::summary::SECTION_TITLES;

    #[test]
    fn every_form_names_the_nine_sections_in_order() {
        let forms =
            [PromptForm::Full, PromptForm::Short { max_words: 900 }, PromptForm::RecentOnly { start_hint: None }];
        for form in forms {
            let text =
                summary_instruction(&PromptSpec { form: form.clone(), additional: None, newer_messages_kept: false });
            let mut at = 0;
            for (i, title) in SECTION_TITLES.iter().enumerate() {
                let heading = format!("{}. {title}:", i + 1);
                let found = text[at..].find(&heading);
                assert!(found.is_some(), "{form:?}: {heading} missing or out of order");
                at += found.unwrap_or(0) + heading.len();
            }
            assert!(text.contains("<summary>"), "{form:?}");
        }
    }

    #[test]
    fn full_form() {
        let text = summary_instruction(&PromptSpec::full());
        expect![[r#"
            This conversation is about to be replaced by a written summary, because the context window is nearly full. Write that summary now. Whoever picks up the work will see your summary and nothing else of what came before, so it has to carry everything needed to continue without asking the user again: what was asked, what was decided, the code, the errors, and where the work stopped.

            Do not call any tools. Answer with text only.

            First write a draft inside <analysis> tags. Walk through the conversation from the start and note, part by part: what the user asked, what was done in response, which files and code were involved, which errors came up and how they were settled, and what feedback the user gave. Use the draft to make sure nothing is left out; it is thrown away afterwards.

            Then write the summary inside <summary> tags, with these nine numbered sections, in this order:

            1. Primary Request and Intent: what the user wants, in their own terms: every explicit requirement, constraint and preference, and how the goal shifted during the session.
            2. Key Technical Concepts: the languages, frameworks, libraries, tools, protocols and patterns the work depends on.
            3. Files and Code Sections: every file that was read, changed or created, and why it matters to the task. For changes, show the relevant code as short exact excerpts and say what changed and why.
            4. Errors and Fixes: every error or failure that came up, what caused it and how it was resolved. Include any correction the user made to your approach.
            5. Problem Solving: what was figured out, the reasoning that still matters, and any investigation that is still open.
            6. All User Messages: every message the user wrote (not tool results), in order, as close to their words as you can. They record the user's feedback and every change of mind.
            7. Pending Tasks: work the user asked for that is not done yet.
            8. Current Work: exactly what was being worked on just before this summary: the files, the code, the step.
            9. Optional Next Step: the next step, but only if it follows directly from the user's latest request and the current work. Quote the latest request and the point where the work stopped word for word, so the next step stays exactly on what was asked. If the last task is finished and nothing else was asked for, say there is no next step.

            Reply in this shape:

            <analysis>
            [your draft]
            </analysis>

            <summary>
            1. Primary Request and Intent:
               [...]

            2. Key Technical Concepts:
               - [...]

            3. Files and Code Sections:
               - [path]
                 [why it matters, what changed, short code excerpt]

            4. Errors and Fixes:
               - [...]

            5. Problem Solving:
               [...]

            6. All User Messages:
               - [...]

            7. Pending Tasks:
               - [...]

            8. Current Work:
               [...]

            9. Optional Next Step:
               [...]
            </summary>"#]]
        .assert_eq(&text);
    }

    #[test]
    fn short_form_with_a_word_cap_and_additional_instructions() {
        let text = summary_instruction(&PromptSpec {
            form: PromptForm::Short { max_words: 1500 },
            additional: merge_instructions(Some("focus on the auth bug"), &["Keep the migration plan.".to_owned()]),
            newer_messages_kept: true,
        });
        expect![[r#"
            This conversation is about to be replaced by a written summary, because the context window is nearly full. Write that summary now, in 1500 words or fewer. Whoever picks up the work will see your summary and nothing else of what came before, so spend the words on what is needed to continue without asking the user again: the requests, the decisions, the files, and where the work stopped.

            Do not call any tools. Answer with text only. Skip any draft: reply with the summary inside <summary> tags and nothing else.

            Use these nine numbered sections, in this order, and keep each one brief:

            1. Primary Request and Intent: what the user wants, in their own terms: every explicit requirement, constraint and preference, and how the goal shifted during the session.
            2. Key Technical Concepts: the languages, frameworks, libraries, tools, protocols and patterns the work depends on.
            3. Files and Code Sections: every file that was read, changed or created, and why it matters to the task. For changes, show the relevant code as short exact excerpts and say what changed and why.
            4. Errors and Fixes: every error or failure that came up, what caused it and how it was resolved. Include any correction the user made to your approach.
            5. Problem Solving: what was figured out, the reasoning that still matters, and any investigation that is still open.
            6. All User Messages: every message the user wrote (not tool results), in order, as close to their words as you can. They record the user's feedback and every change of mind.
            7. Pending Tasks: work the user asked for that is not done yet.
            8. Current Work: exactly what was being worked on just before this summary: the files, the code, the step.
            9. Optional Next Step: the next step, but only if it follows directly from the user's latest request and the current work. Quote the latest request and the point where the work stopped word for word, so the next step stays exactly on what was asked. If the last task is finished and nothing else was asked for, say there is no next step.

            The newest messages are not shown here: they will stay in the context word for word right after your summary. Write the summary so that it leads up to them.

            Reply in this shape:

            <summary>
            1. Primary Request and Intent:
               [...]
            ...
            9. Optional Next Step:
               [...]
            </summary>

            Additional instructions:
            focus on the auth bug

            Keep the migration plan."#]]
        .assert_eq(&text);
        assert!(!text.contains("<analysis>"));
    }

    #[test]
    fn recent_only_form_names_where_the_recent_part_begins() {
        let text = summary_instruction(&PromptSpec {
            form: PromptForm::RecentOnly { start_hint: Some("now add retries".to_owned()) },
            additional: None,
            newer_messages_kept: false,
        });
        let head: String = text.lines().take(3).collect::<Vec<_>>().join("\n");
        expect![[r#"
            Only the recent part of this conversation is to be summarized now, because the context window is nearly full. The earlier part stays where it is (kept as it was, or already covered by an earlier summary), so do not summarize it again: use it only to understand the recent messages. The recent part begins with this message: "now add retries"

            Whoever picks up the work will see the earlier part and your summary of the recent part, so the summary has to carry everything from the recent messages that is needed to continue without asking the user again."#]]
        .assert_eq(&head);
        assert!(text.contains("<analysis>"));
        let no_hint = summary_instruction(&PromptSpec {
            form: PromptForm::RecentOnly { start_hint: Some("  ".to_owned()) },
            additional: None,
            newer_messages_kept: false,
        });
        assert!(!no_hint.contains("begins with this message"));
    }

    #[test]
    fn merging_instructions_drops_empty_and_repeated_parts() {
        assert_eq!(merge_instructions(None, &[]), None);
        assert_eq!(merge_instructions(Some("  "), &[" ".to_owned()]), None);
        assert_eq!(
            merge_instructions(
                Some(" keep the API notes "),
                &["keep the API notes".to_owned(), "".to_owned(), "mention tests".to_owned()]
            ),
            Some("keep the API notes\n\nmention tests".to_owned())
        );
        assert_eq!(merge_instructions(None, &["from a hook".to_owned()]), Some("from a hook".to_owned()));
    }

    #[test]
    fn reask_note_names_the_tags() {
        expect![[r#"Your previous reply had no <summary> block, so it could not be used. Reply again, this time with the whole summary inside <summary> and </summary> tags."#]]
            .assert_eq(reask_note());
    }

    #[test]
    fn summary_message_with_kept_messages_after_it() {
        let text = summary_message_text(&SummaryMessage {
            body: "1. Primary Request and Intent:\n   Fix the parser.".to_owned(),
            transcript_path: Some("/state/sessions/s1.jsonl".to_owned()),
            history_tools: None,
            tools_used: vec!["Read".to_owned(), "Edit".to_owned()],
            kept: KeptMessages::After,
        });
        expect![[r#"
            This session picks up where an earlier conversation left off when it ran out of context; the summary below takes the place of that conversation.

            Tools used before this summary: Read, Edit.

            Summary:
            1. Primary Request and Intent:
               Fix the parser.

            The complete record of the earlier conversation is the file /state/sessions/s1.jsonl. Search it when the summary is not precise enough, for example for the exact text of code or of an error.

            Keep working on the task that was in progress. Ask the user nothing further, and do not recap, acknowledge or announce anything about this summary: your next message simply takes the next step of that task.

            Below this summary come the last messages from before compaction, unchanged. The summary was not written from them, so where the two disagree (a step it lists as pending may already be done there), the messages are right."#]]
        .assert_eq(&text);
    }

    #[test]
    fn summary_message_without_path_or_kept_messages() {
        let text = summary_message_text(&SummaryMessage {
            body: "  body  ".to_owned(),
            transcript_path: None,
            history_tools: None,
            tools_used: Vec::new(),
            kept: KeptMessages::None,
        });
        assert!(text.contains("\n\nSummary:\nbody\n\n"));
        assert!(!text.contains("complete record"));
        assert!(!text.contains("Tools used"));
        assert!(!text.contains("unchanged"));
        assert!(text.ends_with("takes the next step of that task."));
        let before = summary_message_text(&SummaryMessage {
            kept: KeptMessages::Before,
            body: "b".to_owned(),
            transcript_path: Some(String::new()),
            history_tools: None,
            tools_used: Vec::new(),
        });
        assert!(before.ends_with("The summary covers only what came after them."));
        assert!(!before.contains("complete record"));
    }

    #[test]
    fn the_closing_line_names_the_history_tools_when_the_model_has_them() {
        let message = |path: Option<&str>, tools: bool| {
            summary_message_text(&SummaryMessage {
                body: "body".to_owned(),
                transcript_path: path.map(str::to_owned),
                history_tools: tools.then(|| HistoryTools {
                    search: "mcp__ctxd__search_history".to_owned(),
                    read: "mcp__ctxd__read_history".to_owned(),
                }),
                tools_used: Vec::new(),
                kept: KeptMessages::None,
            })
        };
        let closing = |text: &str| text.split("\n\n").nth(2).unwrap_or_default().to_owned();
        expect![[r#"The complete record of the earlier conversation can be searched with the mcp__ctxd__search_history tool, and a record it finds read in full with mcp__ctxd__read_history (it is the file /p/s.jsonl). Use them when the summary is not precise enough, for example for the exact text of code, of an error or of something the user said."#]]
        .assert_eq(&closing(&message(Some("/p/s.jsonl"), true)));
        // Without a path the tools are named all the same.
        let tools_only = closing(&message(None, true));
        assert!(
            tools_only.contains("mcp__ctxd__search_history tool") && !tools_only.contains("the file"),
            "{tools_only}"
        );
        // Without them, the path alone, as before.
        let path_only = closing(&message(Some("/p/s.jsonl"), false));
        assert!(path_only.starts_with("The complete record of the earlier conversation is the file /p/s.jsonl."));
        assert!(!message(Some("/p/s.jsonl"), false).contains("mcp__"));
        assert!(!message(None, false).contains("complete record"));
    }
}
