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
/// The one definition in ctxd: the request view, the memory files, the summaries and
/// the compaction planner all estimate with it, so their budgets agree.
pub const BYTES_PER_TOKEN: u64 = 4;

/// Estimated tokens of a text: its UTF-8 length divided by [`BYTES_PER_TOKEN`], rounded
/// up.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(BYTES_PER_TOKEN)
}

/// The estimate's rate is kept in tokens per KiB of content, a fixed-point number so the
/// tally stays `Eq` and replays to the same figure on every resume.
const KIB: u64 = 1024;
const DEFAULT_TOKENS_PER_KIB: u64 = KIB / BYTES_PER_TOKEN;
/// A sample needs this much content between two reports: a short user message says
/// more about the host's per-turn overhead than about the tokenizer.
const MIN_SAMPLE_BYTES: u64 = 2048;
/// Samples outside this range (16 to 2 bytes per token) are noise: a system prompt
/// that changed between requests, a tool list that grew.
const SAMPLE_RANGE: std::ops::RangeInclusive<u64> = 64..=512;

/// The session's learned rate of tokens per byte of appended content.
///
/// Between two reported usages the provider counted the previous context plus what was
/// appended since; the difference over the appended bytes is one sample of the
/// tokenizer's rate on this session's content (code, prose, another language). Samples
/// are smoothed (each counts a quarter), so one odd turn moves the estimate little.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    pub tokens_per_kib: u64,
    pub samples: u32,
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration { tokens_per_kib: DEFAULT_TOKENS_PER_KIB, samples: 0 }
    }
}

impl Calibration {
    /// Estimated tokens of `bytes` bytes of content.
    pub fn tokens(&self, bytes: u64) -> u64 {
        (bytes.saturating_mul(self.tokens_per_kib)).div_ceil(KIB)
    }

    /// Tokens a collapse frees: the span's content (`span_bytes`) less the summary that
    /// replaces it, both at this rate.
    pub fn collapse_freed(&self, span_bytes: u64, summary: &str) -> u64 {
        self.tokens(span_bytes).saturating_sub(self.tokens(summary.len() as u64))
    }

    fn sample(&mut self, tokens: u64, bytes: u64) {
        let rate = tokens.saturating_mul(KIB) / bytes.max(1);
        if !SAMPLE_RANGE.contains(&rate) {
            return;
        }
        self.tokens_per_kib = (3 * self.tokens_per_kib + rate).div_ceil(4);
        self.samples += 1;
    }
}

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
    /// Tokens snips, collapses and cold-cache clearing removed from the view since that
    /// response: the reported figure still counts them until the next response reports
    /// anew.
    pub freed_since_report: u64,
    /// The part of [`Tally::freed_since_report`] that snips and collapses freed. The
    /// request pipeline's own check takes those off the provider's figure itself (it
    /// reads the snip and collapse records since the response), so it is given the
    /// figure without them.
    pub reduced_since_report: u64,
    /// The rate estimates use, learned from the reports.
    pub calibration: Calibration,
    /// Right after a compaction, before any report: the installed view's tokens as the
    /// next request counts them ([`Tally::anchor_install`]); records after the install
    /// are estimated at the learned rate as usual. The first report replaces it.
    pub estimated_base: u64,
    /// Records of that install still to come (the base already counts them).
    pub base_covers: u64,
}

impl Tally {
    /// Folds one record into the tally, its content counted as stored.
    pub fn observe(&mut self, record: &Record) {
        self.observe_sized(record, u64::from(record.head().content_bytes));
    }

    /// Folds one record into the tally, its content counted as `bytes` (what the next
    /// request carries of it: [`crate::view::budget::carried_bytes`]).
    pub fn observe_sized(&mut self, record: &Record, bytes: u64) {
        if self.base_covers > 0 {
            self.base_covers -= 1;
            return;
        }
        let head = record.head();
        // Sidechains (subagents) have their own context; API error stand-ins carry no
        // real usage.
        if head.is_sidechain || head.is_api_error {
            return;
        }
        match head.kind {
            Kind::Assistant => match head.usage {
                Some(usage) if head.model.as_deref() != Some("<synthetic>") => {
                    // What this request read beyond the previous context is what was
                    // appended in between: one sample of the rate. Not across a snip or
                    // collapse (the request read less than was appended), nor from the
                    // first report (it also holds the system prompt and tools).
                    let read = usage.context_tokens() - usage.output_tokens;
                    if self.reported > 0
                        && self.freed_since_report == 0
                        && self.bytes_after >= MIN_SAMPLE_BYTES
                        && read > self.reported
                    {
                        self.calibration.sample(read - self.reported, self.bytes_after);
                    }
                    // A response split over several lines repeats the same usage on each:
                    // counted once, and its own content is part of `output_tokens`.
                    self.reported = usage.context_tokens();
                    self.reported_message_id = head.message_id.clone();
                    self.bytes_after = 0;
                    self.freed_since_report = 0;
                    self.reduced_since_report = 0;
                    self.estimated_base = 0;
                    self.base_covers = 0;
                }
                _ => self.bytes_after += bytes,
            },
            Kind::User | Kind::Attachment => self.bytes_after += bytes,
            // System records, summaries and host bookkeeping never reach the model.
            Kind::System | Kind::Summary | Kind::Other => {}
        }
    }

    /// Tokens estimated for the records after the last reported usage.
    pub fn estimated(&self) -> u64 {
        self.calibration.tokens(self.bytes_after)
    }

    /// Starts afresh after a compact boundary; the learned rate stays (it describes the
    /// session's content, not its length).
    pub fn restart(&mut self) {
        *self = Tally { calibration: self.calibration, ..Tally::default() };
    }

    /// Reported (or the estimated base) plus estimated tokens, less what was freed
    /// since the report.
    pub fn total(&self) -> u64 {
        (self.reported + self.estimated_base + self.estimated()).saturating_sub(self.freed_since_report)
    }

    /// Whether the total stands on a whole-request figure (a report, or the estimated
    /// base after a compaction) that already holds the system prompt, tools and memory.
    pub fn anchored(&self) -> bool {
        self.reported > 0 || self.estimated_base > 0
    }

    /// At a compaction's boundary: the whole next request, as the request pipeline
    /// counted it over the installed view (`tokens`), stands for the records so far
    /// until the first report; the `batch` records of the install, the boundary
    /// included, are already in it. Counting the summary, the kept messages and the
    /// restored files at the learned rate instead (a rate learned over turns, message
    /// wrappers included) overstated a small view by up to 1.4 %. The learned rate is
    /// kept for what follows.
    pub fn anchor_install(&mut self, tokens: u64, batch: u64) {
        self.reported = 0;
        self.reported_message_id = None;
        self.estimated_base = tokens;
        self.base_covers = batch;
        self.bytes_after = 0;
        self.freed_since_report = 0;
        self.reduced_since_report = 0;
    }

    /// A snip or collapse removed `tokens` from what the next request carries.
    pub fn freed(&mut self, tokens: u64) {
        self.freed_since_report += tokens;
        self.reduced_since_report += tokens;
    }

    /// A cold-cache microcompact cleared `tokens` of old tool results from what the next
    /// request carries.
    pub fn cleared(&mut self, tokens: u64) {
        self.freed_since_report += tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collapse_frees_its_span_less_its_summary_at_the_learned_rate() {
        let default = Calibration::default();
        assert_eq!(default.collapse_freed(40_960, &"s".repeat(4_096)), 10_240 - 1_024);
        let dense = Calibration { tokens_per_kib: 512, samples: 3 };
        assert_eq!(dense.collapse_freed(40_960, &"s".repeat(4_096)), 20_480 - 2_048);
        assert_eq!(default.collapse_freed(100, &"s".repeat(4_096)), 0, "a summary longer than its span frees nothing");
    }

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

    fn assistant_reading(id: &str, read: u64) -> Record {
        assistant(id, read, 0)
    }

    #[test]
    fn the_estimate_learns_the_rate_from_reports() {
        let mut t = Tally::default();
        t.observe(&assistant_reading("m0", 10_000));
        let chunk = "x".repeat(2998); // 3,000 bytes of JSON string
        let mut read = 10_000;
        // The provider counts one token per 3 bytes of this session's content.
        for turn in 1..=12 {
            t.observe(&user(&chunk));
            read += 1_000;
            t.observe(&assistant_reading(&format!("m{turn}"), read));
        }
        assert_eq!(t.calibration.samples, 12);
        t.observe(&user(&chunk));
        let estimate = t.estimated();
        assert!((960..=1_010).contains(&estimate), "3,000 bytes at 3 bytes a token, learned: {estimate}");
        // A compact boundary restarts the count but keeps the rate.
        t.restart();
        assert_eq!(t.total(), 0);
        t.observe(&user(&chunk));
        assert_eq!(t.estimated(), estimate);
    }

    #[test]
    fn odd_turns_do_not_calibrate() {
        let mut t = Tally::default();
        // The first report holds the system prompt and tools: no sample.
        t.observe(&user(&"y".repeat(4_000)));
        t.observe(&assistant_reading("m0", 50_000));
        // Too little content between two reports.
        t.observe(&user("short"));
        t.observe(&assistant_reading("m1", 50_400));
        // A snip in between: the request read less than was appended.
        t.observe(&user(&"y".repeat(4_000)));
        t.freed(500);
        t.observe(&assistant_reading("m2", 51_000));
        // A rate out of range (the host changed its tools): 20,000 tokens for 4 KB.
        t.observe(&user(&"y".repeat(4_000)));
        t.observe(&assistant_reading("m3", 71_000));
        assert_eq!(t.calibration, Calibration::default());
        t.observe(&user(&"y".repeat(3_998)));
        assert_eq!(t.estimated(), 1_000, "still 4 bytes a token");
    }

    #[test]
    fn freed_tokens_count_until_the_next_report() {
        let mut t = Tally::default();
        t.observe(&assistant("msg_1", 1000, 50));
        t.freed(300);
        assert_eq!(t.total(), 750);
        // A cold-cache clearing frees as much, but is not a snip or collapse the
        // pipeline's own check takes off again.
        t.cleared(100);
        assert_eq!(t.total(), 650);
        assert_eq!((t.freed_since_report, t.reduced_since_report), (400, 300));
        t.observe(&assistant("msg_2", 900, 50));
        assert_eq!(t.total(), 950, "the new report already reflects the snip");
        assert_eq!((t.freed_since_report, t.reduced_since_report), (0, 0));
    }

    #[test]
    fn an_install_anchor_stands_until_the_first_report() {
        let mut t = Tally { calibration: Calibration { tokens_per_kib: 300, samples: 4 }, ..Tally::default() };
        t.restart();
        t.observe(&user(&"k".repeat(4_000)));
        assert!(!t.anchored());
        // The boundary: the next request is 10,000 tokens (prefix and the kept message
        // included); its batch of three (boundary, summary, one restored file) follows.
        t.anchor_install(10_000, 3);
        for _ in 0..3 {
            t.observe(&user(&"s".repeat(40_000)));
        }
        assert!(t.anchored());
        assert_eq!(t.total(), 10_000);
        // What follows is estimated at the learned rate on top of it.
        t.observe(&user(&"a".repeat(1_022)));
        assert_eq!(t.total(), 10_000 + 300);
        // The first report replaces it, and is no calibration sample.
        t.observe(&assistant("msg_1", 10_500, 50));
        assert_eq!((t.total(), t.estimated_base, t.calibration.samples), (10_550, 0, 4));
        assert!(t.anchored());
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
