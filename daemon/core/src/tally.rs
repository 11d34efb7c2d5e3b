//! Running token tally of a session: the last reported usage plus an estimate of what
//! came after it.
//!
//! The number that matters is what the next request will carry. The provider reports it
//! exactly once per response (`message.usage`); everything appended after that response
//! is estimated from its size. The tally is updated record by record, so keeping it
//! current costs O(appended records), never a walk of the session.

use crate::record::{Kind, Record};

/// Bytes of JSON per estimated token before calibration. JSON escapes and structure
/// make the text a little longer than the prose it carries; 4 is the usual figure.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The tally: reported tokens of the last main-chain assistant response and the
/// estimated tokens of the records after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Context tokens the provider reported for the last main-chain response.
    pub reported: u64,
    /// `message.id` of that response; the lines of a split response repeat its usage.
    pub reported_message_id: Option<Box<str>>,
    /// Bytes of message content appended since that response.
    pub bytes_after: u64,
    /// Tokens snips and collapses removed from the view since that response: the
    /// reported figure still counts them until the next response reports anew.
    pub freed_since_report: u64,
}

impl Tally {
    /// Folds one record into the tally.
    pub fn observe(&mut self, record: &Record) {
        let head = record.head();
        // Sidechains (subagents) have their own context; API error stand-ins carry no
        // real usage.
        if head.is_sidechain || head.is_api_error {
            return;
        }
        match head.kind {
            Kind::Assistant => match head.usage {
                Some(usage) if head.model.as_deref() != Some("<synthetic>") => {
                    // A response split over several lines repeats the same usage on each:
                    // counted once, and its own content is part of `output_tokens`.
                    self.reported = usage.context_tokens();
                    self.reported_message_id = head.message_id.clone();
                    self.bytes_after = 0;
                    self.freed_since_report = 0;
                }
                _ => self.bytes_after += u64::from(head.content_bytes),
            },
            Kind::User | Kind::Attachment => self.bytes_after += u64::from(head.content_bytes),
            // System records, summaries and host bookkeeping never reach the model.
            Kind::System | Kind::Summary | Kind::Other => {}
        }
    }

    /// Tokens estimated for the records after the last reported usage.
    pub fn estimated(&self) -> u64 {
        self.bytes_after.div_ceil(BYTES_PER_TOKEN)
    }

    /// Reported plus estimated tokens, less what was freed since the report.
    pub fn total(&self) -> u64 {
        (self.reported + self.estimated()).saturating_sub(self.freed_since_report)
    }

    /// A snip or collapse removed `tokens` from what the next request carries.
    pub fn freed(&mut self, tokens: u64) {
        self.freed_since_report += tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(line: &str) -> Record {
        Record::parse(line).unwrap()
    }

    fn assistant(id: &str, input: u64, output: u64) -> Record {
        rec(&format!(
            r#"{{"type":"assistant","uuid":"u-{id}-{input}","message":{{"id":"{id}","role":"assistant","model":"m","content":[{{"type":"text","text":"x"}}],"usage":{{"input_tokens":{input},"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":{output}}}}}}}"#
        ))
    }

    fn user(text: &str) -> Record {
        rec(&format!(r#"{{"type":"user","message":{{"role":"user","content":"{text}"}}}}"#))
    }

    #[test]
    fn reported_usage_then_estimate_for_what_follows() {
        let mut t = Tally::default();
        t.observe(&user("hello"));
        assert_eq!(t.reported, 0);
        assert_eq!(t.estimated(), 2); // "\"hello\"" = 7 bytes
        t.observe(&assistant("msg_1", 1000, 50));
        assert_eq!(t.total(), 1050);
        t.observe(&user(&"a".repeat(398)));
        assert_eq!(t.total(), 1050 + 100);
    }

    #[test]
    fn freed_tokens_count_until_the_next_report() {
        let mut t = Tally::default();
        t.observe(&assistant("msg_1", 1000, 50));
        t.freed(300);
        assert_eq!(t.total(), 750);
        t.observe(&assistant("msg_2", 900, 50));
        assert_eq!(t.total(), 950, "the new report already reflects the snip");
    }

    #[test]
    fn split_response_counted_once() {
        let mut t = Tally::default();
        t.observe(&assistant("msg_1", 1000, 50));
        t.observe(&assistant("msg_1", 1000, 50));
        t.observe(&assistant("msg_1", 1000, 50));
        assert_eq!(t.total(), 1050);
    }

    #[test]
    fn sidechain_error_and_system_records_do_not_count() {
        let mut t = Tally::default();
        t.observe(&assistant("msg_1", 1000, 50));
        t.observe(&rec(r#"{"type":"assistant","isSidechain":true,"message":{"id":"s","model":"m","content":"zzzz","usage":{"input_tokens":99999,"output_tokens":1}}}"#));
        t.observe(&rec(r#"{"type":"assistant","isApiErrorMessage":true,"message":{"id":"e","model":"<synthetic>","content":"zzzz","usage":{"input_tokens":0,"output_tokens":0}}}"#));
        t.observe(&rec(r#"{"type":"system","subtype":"informational","content":"zzzzzzzz"}"#));
        t.observe(&rec(r#"{"type":"progress","data":{"x":"zzzzzzzzzzzzzzzz"}}"#));
        assert_eq!(t.total(), 1050);
    }
}
