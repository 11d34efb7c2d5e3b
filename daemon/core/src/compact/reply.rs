//! Reading the summary out of the model's reply, and deciding what happens when it is
//! not there.
//!
//! The parsing itself is [`crate::summary::parse_summary_reply`], shared with the
//! offline summarizer so both paths accept exactly the same replies. This file adds the
//! policy around it: a reply without a `<summary>` gets one more chance (the same
//! request with [`super::reask_note`] added to the instruction); a second such reply,
//! an empty summary, or no text at all ends the attempt with a reason the driver can act
//! on.

use crate::summary::{SummaryParseError, parse_summary_reply};

use super::prompt::reask_note;

/// Which reply this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyAttempt {
    /// The answer to the summary instruction.
    First,
    /// The answer after asking again with the note.
    Reasked,
}

/// What to do with a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyVerdict {
    /// The summary body, analysis removed, trimmed.
    Summary(String),
    /// Send the same request again with `instruction` in place of the old one (the old
    /// instruction with the note appended).
    AskAgain { instruction: String },
}

/// Why a reply cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply has no text at all (only a refused tool call, or nothing). From the
    /// fork: use the streaming fallback. From the fallback: the compaction failed.
    #[error("the reply has no text")]
    NoText,
    /// Asked twice, no `<summary>` either time: the compaction failed.
    #[error("the reply has no <summary> block, and the reply to asking again had none either")]
    MissingSummaryTwice,
    /// A `<summary>` with nothing in it: the compaction failed.
    #[error("the reply's <summary> block is empty")]
    EmptySummary,
}

/// Reads a reply to the summary instruction `instruction` (needed to build the second
/// request).
pub fn read_summary_reply(reply: &str, attempt: ReplyAttempt, instruction: &str) -> Result<ReplyVerdict, ReplyError> {
    if reply.trim().is_empty() {
        return Err(ReplyError::NoText);
    }
    match parse_summary_reply(reply) {
        Ok(body) => Ok(ReplyVerdict::Summary(body)),
        Err(SummaryParseError::EmptySummary) => Err(ReplyError::EmptySummary),
        Err(SummaryParseError::MissingSummary) => match attempt {
            ReplyAttempt::First => {
                Ok(ReplyVerdict::AskAgain { instruction: format!("{}\n\n{}", instruction.trim_end(), reask_note()) })
            }
            ReplyAttempt::Reasked => Err(ReplyError::MissingSummaryTwice),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_is_removed() {
        let reply = "<analysis>draft with <summary> inside</analysis>\n<summary>\n1. Primary Request and Intent:\n   Fix it.\n</summary>";
        assert_eq!(
            read_summary_reply(reply, ReplyAttempt::First, "summarize"),
            Ok(ReplyVerdict::Summary("1. Primary Request and Intent:\n   Fix it.".to_owned()))
        );
    }

    #[test]
    fn missing_summary_once_asks_again_with_the_note() {
        let verdict = read_summary_reply("Sure, here it is: all good.", ReplyAttempt::First, "Summarize.\n");
        let Ok(ReplyVerdict::AskAgain { instruction }) = verdict else {
            panic!("expected AskAgain, got {verdict:?}");
        };
        assert!(instruction.starts_with("Summarize.\n\n"));
        assert!(instruction.ends_with(reask_note()));
    }

    #[test]
    fn missing_summary_twice_fails() {
        assert_eq!(
            read_summary_reply("<analysis>only a draft</analysis>", ReplyAttempt::Reasked, "x"),
            Err(ReplyError::MissingSummaryTwice)
        );
        // A good second reply is accepted.
        assert_eq!(
            read_summary_reply("<summary>ok</summary>", ReplyAttempt::Reasked, "x"),
            Ok(ReplyVerdict::Summary("ok".to_owned()))
        );
    }

    #[test]
    fn empty_summary_and_empty_reply_fail() {
        assert_eq!(
            read_summary_reply("<summary> \n </summary>", ReplyAttempt::First, "x"),
            Err(ReplyError::EmptySummary)
        );
        assert_eq!(read_summary_reply("  \n", ReplyAttempt::First, "x"), Err(ReplyError::NoText));
        assert_eq!(
            ReplyError::MissingSummaryTwice.to_string(),
            "the reply has no <summary> block, and the reply to asking again had none either"
        );
    }
}
