//! What instant compaction costs and what it saves, per session, in tokens and dollars.
//!
//! A preparation is a model call ctxd makes on the user's account; an instant answer is
//! a model call Claude Code would have made and did not. Users should see both, and
//! the net, so that preparing is never a hidden cost. This module prices a call's
//! usage, estimates the compaction call an instant answer replaced, defines the ledger
//! line that records either (checksummed, so a damaged line is told apart and skipped),
//! and adds a session's lines up. The daemon's `gateway::costs` writes and reads the
//! ledger files.
//!
//! ## The estimate of the call avoided
//!
//! Claude Code's compaction request carries the session's conversation, unchanged, with
//! its summary instruction; its answer is the summary. So the call avoided is estimated
//! from what the gateway saw last of the session:
//!
//! - prompt: the context after the session's newest answer (that request's input,
//!   cache read and cache write, plus the answer's output, now part of the
//!   conversation). The instruction itself (a few hundred tokens) is left out, so the
//!   estimate errs low.
//! - of the prompt, the newest request's input side is the cached prefix: read at the
//!   cache-read price while the cache is warm; the rest (the newest answer) is written
//!   at the cache-write price, as Claude Code marks its last message for caching.
//! - output: the summary ctxd answered with, in tokens (`tally::estimate_tokens`).
//! - rates: the model's, for a prompt of that size (long-prompt rates above their
//!   bound), the cache-write rate of the session's cache lifetime.
//!
//! When the cache had gone cold (idle past its lifetime since its last use, the
//! preparation's fork included), the call would have written the cached prefix again
//! instead of reading it: that difference, `cached × (write − read)`, is the second
//! saving, the cold re-write avoided, kept apart from the call's warm price so the two
//! are never counted twice. When the gateway has no figures for the session (it
//! restarted), the prompt is the context the preparation was made at, taken as cached
//! and warm: again the lower figure.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache_state::{FIVE_MINUTES_SECS, ModelPrices, Rates};
use crate::record::TokenUsage;

/// The ledger line's format; a line of another version is damaged to this reader.
pub const LEDGER_VERSION: u32 = 1;

fn write_rate(rates: &Rates, ttl_seconds: u64) -> f64 {
    if ttl_seconds > FIVE_MINUTES_SECS { rates.cache_write1h } else { rates.cache_write5m }
}

/// What a call with `usage` cost on `prices`, its cache writes at the rate of
/// `ttl_seconds`.
pub fn usage_cost_usd(prices: &ModelPrices, usage: &TokenUsage, ttl_seconds: u64) -> f64 {
    let rates = prices.rates_for(usage.request_tokens());
    (usage.input_tokens as f64 * rates.input
        + usage.cache_read_input_tokens as f64 * rates.cache_read
        + usage.cache_creation_input_tokens as f64 * write_rate(&rates, ttl_seconds)
        + usage.output_tokens as f64 * rates.output)
        / 1e6
}

/// What the gateway knew of a session when it answered its compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionFacts {
    /// The conversation Claude Code's compaction request carries, in tokens.
    pub prompt_tokens: u64,
    /// Of it, the prefix the session's newest request left in the cache.
    pub cached_tokens: u64,
    /// The summary's size in tokens (the answer's output).
    pub summary_tokens: u64,
    /// The cache was still warm when the compaction was asked for.
    pub cache_warm: bool,
    pub ttl_seconds: u64,
}

/// Claude Code's compaction call, as the module docs estimate it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionEstimate {
    /// The call's usage with a warm cache.
    pub usage: TokenUsage,
    /// Its price with a warm cache.
    pub call_usd: f64,
    /// What a cold cache adds (0 while warm): the prefix written instead of read.
    pub cold_rewrite_usd: f64,
}

/// Estimates the compaction call an instant answer replaced (see the module docs).
pub fn estimate_compaction_call(prices: &ModelPrices, facts: &CompactionFacts) -> CompactionEstimate {
    let cached = facts.cached_tokens.min(facts.prompt_tokens);
    let usage = TokenUsage {
        input_tokens: 0,
        cache_read_input_tokens: cached,
        cache_creation_input_tokens: facts.prompt_tokens - cached,
        output_tokens: facts.summary_tokens,
    };
    let call_usd = usage_cost_usd(prices, &usage, facts.ttl_seconds);
    let cold_rewrite_usd = if facts.cache_warm {
        0.0
    } else {
        let rates = prices.rates_for(facts.prompt_tokens);
        cached as f64 * (write_rate(&rates, facts.ttl_seconds) - rates.cache_read) / 1e6
    };
    CompactionEstimate { usage, call_usd, cold_rewrite_usd }
}

/// What a ledger line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CostKind {
    /// A preparation's fork: its usage and what it cost.
    Preparation,
    /// A compaction answered at once: the estimated call avoided.
    InstantCompaction,
}

/// One ledger line: a preparation's cost or an instant answer's saving. Holds figures
/// and the session's id and model only; never a body, a summary or a header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CostEntry {
    /// When, as RFC 3339.
    pub at: String,
    pub session_id: String,
    pub model: String,
    pub kind: CostKind,
    /// A preparation's usage, or the avoided call's estimated usage (warm).
    pub usage: TokenUsage,
    /// A preparation's cost, or the avoided call's estimated price (warm).
    pub usd: f64,
    /// An instant answer's cold re-write avoided (0 for a preparation or a warm cache).
    #[serde(default)]
    pub cold_rewrite_usd: f64,
}

/// How a ledger line of this version starts; the entry's JSON follows, then the check.
fn line_opening() -> String {
    format!("{{\"v\":{LEDGER_VERSION},\"entry\":")
}

/// `,"check":"` + 16 hex digits + `"}`.
const CHECK_TAIL_BYTES: usize = 10 + 16 + 2;

/// The check of an entry: the first 16 hex digits of the SHA-256 of its JSON text as
/// written. Over the text, not a value read back: a float need not read back to the
/// same bits, so re-serializing it could differ from what was written.
fn check_of(entry_text: &str) -> String {
    Sha256::digest(entry_text.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The entry as one ledger line (no newline): `{"v":1,"entry":{…},"check":"…"}`.
pub fn ledger_line(entry: &CostEntry) -> String {
    let text = serde_json::to_string(entry).unwrap_or_default();
    format!("{}{text},\"check\":\"{}\"}}", line_opening(), check_of(&text))
}

/// A ledger line read back; `None` when it is not one whole line of this version with a
/// matching check (cut, edited, another format).
pub fn parse_ledger_line(text: &str) -> Option<CostEntry> {
    let rest = text.trim_end_matches(['\n', '\r']).strip_prefix(&line_opening())?;
    let cut = rest.len().checked_sub(CHECK_TAIL_BYTES)?;
    let (entry_text, tail) = (rest.get(..cut)?, rest.get(cut..)?);
    let check = tail.strip_prefix(",\"check\":\"")?.strip_suffix("\"}")?;
    (check == check_of(entry_text)).then(|| serde_json::from_str(entry_text).ok()).flatten()
}

/// A session's costs and savings added up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CostSummary {
    pub session_id: String,
    /// The model of the newest line.
    pub model: String,
    /// When the newest line was written.
    pub last_at: String,
    pub preparations: u64,
    /// The preparations' usage, added up.
    pub preparation_usage: TokenUsage,
    pub preparation_usd: f64,
    pub instant_compactions: u64,
    /// The compaction calls avoided, priced warm.
    pub saved_call_usd: f64,
    /// The cold re-writes avoided.
    pub saved_cold_rewrite_usd: f64,
}

impl CostSummary {
    pub fn saved_usd(&self) -> f64 {
        self.saved_call_usd + self.saved_cold_rewrite_usd
    }

    /// Savings less the preparations' cost (negative: preparing cost more than it saved).
    pub fn net_usd(&self) -> f64 {
        self.saved_usd() - self.preparation_usd
    }

    /// Adds one line of the session.
    pub fn add(&mut self, entry: &CostEntry) {
        if self.session_id.is_empty() {
            self.session_id.clone_from(&entry.session_id);
        }
        self.model.clone_from(&entry.model);
        self.last_at.clone_from(&entry.at);
        match entry.kind {
            CostKind::Preparation => {
                self.preparations += 1;
                let (sum, u) = (&mut self.preparation_usage, &entry.usage);
                sum.input_tokens = sum.input_tokens.saturating_add(u.input_tokens);
                sum.cache_read_input_tokens = sum.cache_read_input_tokens.saturating_add(u.cache_read_input_tokens);
                sum.cache_creation_input_tokens =
                    sum.cache_creation_input_tokens.saturating_add(u.cache_creation_input_tokens);
                sum.output_tokens = sum.output_tokens.saturating_add(u.output_tokens);
                self.preparation_usd += entry.usd;
            }
            CostKind::InstantCompaction => {
                self.instant_compactions += 1;
                self.saved_call_usd += entry.usd;
                self.saved_cold_rewrite_usd += entry.cold_rewrite_usd;
            }
        }
    }
}

/// Dollars as a person reads them: `$1.20`, `<$0.01` for a cost under half a cent,
/// `$0.00`. Whole cents, rounded half up the way the editors round them
/// (`editor-clients/fixtures/render-cases.json`), so every place shows the same figure.
pub fn format_usd(usd: f64) -> String {
    if usd > 0.0 && usd < 0.005 {
        return "<$0.01".to_owned();
    }
    let cents = (usd.max(0.0) * 100.0 + 0.5).floor() as u64;
    format!("${}.{:02}", cents / 100, cents % 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_state::{ONE_HOUR_SECS, prices_for};

    fn opus() -> &'static ModelPrices {
        // $4 input, $20 output, $5 5-minute write, $8 1-hour write, $0.20 read (per M).
        prices_for("claude-opus-5-5").unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn usage(input: u64, read: u64, write: u64, output: u64) -> TokenUsage {
        TokenUsage {
            input_tokens: input,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: write,
            output_tokens: output,
        }
    }

    #[test]
    fn a_calls_usage_is_priced_per_kind_of_token() {
        // The stub's usage: 12,305 input, 98,304 read, 4,096 written, 321 output.
        let u = usage(12_305, 98_304, 4_096, 321);
        let want = (12_305.0 * 4.0 + 98_304.0 * 0.2 + 4_096.0 * 5.0 + 321.0 * 20.0) / 1e6;
        assert!(close(usage_cost_usd(opus(), &u, FIVE_MINUTES_SECS), want));
        let hour = (12_305.0 * 4.0 + 98_304.0 * 0.2 + 4_096.0 * 8.0 + 321.0 * 20.0) / 1e6;
        assert!(close(usage_cost_usd(opus(), &u, ONE_HOUR_SECS), hour), "1-hour writes");
        // A long prompt takes the model's long-prompt rates.
        let haiku = prices_for("claude-haiku-5-5").unwrap();
        assert!(close(usage_cost_usd(haiku, &usage(200_000, 0, 0, 0), FIVE_MINUTES_SECS), 0.1));
        assert!(close(usage_cost_usd(haiku, &usage(100_000, 0, 0, 0), FIVE_MINUTES_SECS), 0.01));
    }

    #[test]
    fn the_avoided_call_reads_the_cached_prefix_and_writes_the_rest() {
        // 600k of context, 590k of it the newest request's (cached), a 20k summary.
        let facts = CompactionFacts {
            prompt_tokens: 600_000,
            cached_tokens: 590_000,
            summary_tokens: 20_000,
            cache_warm: true,
            ttl_seconds: FIVE_MINUTES_SECS,
        };
        let warm = estimate_compaction_call(opus(), &facts);
        assert_eq!(warm.usage, usage(0, 590_000, 10_000, 20_000));
        assert!(close(warm.call_usd, 590_000.0 * 0.2 / 1e6 + 10_000.0 * 5.0 / 1e6 + 20_000.0 * 20.0 / 1e6));
        assert!(close(warm.cold_rewrite_usd, 0.0));
        // Cold: the same call, plus the prefix written instead of read.
        let cold = estimate_compaction_call(opus(), &CompactionFacts { cache_warm: false, ..facts });
        assert!(close(cold.call_usd, warm.call_usd));
        assert!(close(cold.cold_rewrite_usd, 590_000.0 * (5.0 - 0.2) / 1e6), "{cold:?}");
        // An hour's lifetime writes at the hour's rate.
        let hour = estimate_compaction_call(
            opus(),
            &CompactionFacts { cache_warm: false, ttl_seconds: ONE_HOUR_SECS, ..facts },
        );
        assert!(close(hour.cold_rewrite_usd, 590_000.0 * (8.0 - 0.2) / 1e6));
        // A cached figure past the prompt is held to it.
        let odd = estimate_compaction_call(opus(), &CompactionFacts { cached_tokens: 700_000, ..facts });
        assert_eq!(odd.usage.cache_read_input_tokens, 600_000);
        assert_eq!(odd.usage.cache_creation_input_tokens, 0);
    }

    fn entry(kind: CostKind, usd: f64, cold: f64) -> CostEntry {
        CostEntry {
            at: "2026-12-06T07:00:00.000Z".into(),
            session_id: "s-1".into(),
            model: "claude-opus-5-5".into(),
            kind,
            usage: usage(12_305, 98_304, 4_096, 321),
            usd,
            cold_rewrite_usd: cold,
        }
    }

    #[test]
    fn a_ledger_line_round_trips_and_a_damaged_one_does_not_read() {
        // A figure whose JSON does not read back to the same bits (seen in a real run).
        let e = entry(CostKind::InstantCompaction, 0.009_021_399_999_999_999, 2.0 / 3.0);
        let line = ledger_line(&e);
        assert!(!line.contains('\n'));
        // It reads back (its float to within a bit of what was written).
        let back = parse_ledger_line(&line).unwrap();
        assert!((back.usd - e.usd).abs() < 1e-15, "{back:?}");
        assert_eq!(CostEntry { usd: e.usd, ..back }, e);
        assert!(parse_ledger_line(&format!("{line}\n")).is_some(), "its newline");
        assert_eq!(parse_ledger_line(&line[..line.len() - 5]), None, "cut");
        assert_eq!(parse_ledger_line(&line.replace("12305", "12306")), None, "a figure edited");
        assert_eq!(parse_ledger_line(&line.replace("\"v\":1", "\"v\":2")), None, "another version");
        assert_eq!(parse_ledger_line(&line.replace("\"check\":\"", "\"check\":\"0")), None, "a check too long");
        assert_eq!(parse_ledger_line("not json"), None);
        assert_eq!(parse_ledger_line(""), None);
    }

    #[test]
    fn a_sessions_lines_add_up_to_its_costs_savings_and_net() {
        let mut sum = CostSummary::default();
        sum.add(&entry(CostKind::Preparation, 0.25, 0.0));
        sum.add(&entry(CostKind::Preparation, 0.5, 0.0));
        sum.add(&entry(CostKind::InstantCompaction, 1.0, 0.75));
        assert_eq!((sum.session_id.as_str(), sum.preparations, sum.instant_compactions), ("s-1", 2, 1));
        assert_eq!(sum.preparation_usage, usage(24_610, 196_608, 8_192, 642));
        assert!(close(sum.preparation_usd, 0.75));
        assert!(close(sum.saved_usd(), 1.75));
        assert!(close(sum.net_usd(), 1.0));
    }

    #[test]
    fn dollars_read_as_cents() {
        assert_eq!(format_usd(1.2), "$1.20");
        assert_eq!(format_usd(0.004), "<$0.01");
        assert_eq!(format_usd(0.005), "$0.01");
        assert_eq!(format_usd(0.0), "$0.00");
        assert_eq!(format_usd(0.125), "$0.13", "half a cent up, as the editors round");
        assert_eq!(format_usd(12.346), "$12.35");
    }
}
