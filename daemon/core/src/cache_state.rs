//! The prompt cache of a session: warm or cold, how long until it goes cold, and what
//! the next turn re-writes (tokens and an estimated price) once it is cold.
//!
//! A cached prefix lives for its lifetime (5 minutes, or 1 hour when the request asked
//! for it) from the last request that read or wrote it. After that the next turn pays
//! the cache-write price for the whole prefix again, which on a long session is the
//! most expensive request of the day; people want to see it coming. The inputs come
//! from whoever saw the traffic (Claude Code's own status-line `prompt_cache` object, or
//! ctxd's gateway); this module only decides, so the status line and the editors say
//! the same.
//!
//! Prices are `prices.json` beside this file: per model, dated, with their source.

use std::sync::OnceLock;

use serde::Deserialize;

/// A prompt cache's default lifetime.
pub const FIVE_MINUTES_SECS: u64 = 300;
/// The lifetime a request gets with `cache_control.ttl: "1h"`.
pub const ONE_HOUR_SECS: u64 = 3_600;

/// Seconds of a lifetime label as Claude Code and the API spell it (`"5m"`, `"1h"`).
pub fn ttl_seconds(label: &str) -> Option<u64> {
    match label {
        "5m" => Some(FIVE_MINUTES_SECS),
        "1h" => Some(ONE_HOUR_SECS),
        _ => None,
    }
}

/// The state of one session's prompt cache at a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheState {
    /// The prefix is still cached: the next turn reads it.
    pub warm: bool,
    /// Whole seconds until it goes cold (rounded up); 0 once cold.
    pub seconds_left: u64,
    /// When it goes (or went) cold, in milliseconds since the Unix epoch.
    pub expires_at_ms: i64,
    /// The lifetime in force, in seconds.
    pub ttl_seconds: u64,
    /// Tokens the next turn writes to the cache again if it is cold (the last request's
    /// input: uncached, cache read and cache write). `None` when not known, e.g. right
    /// after a compaction, when the next request is a new, smaller prefix.
    pub recache_tokens: Option<u64>,
    /// Estimated price of that re-write in US dollars, from the model's cache-write
    /// price for the lifetime; `None` for a model the price table does not know.
    pub recache_cost_usd: Option<f64>,
}

/// Decides the cache state of a session.
///
/// `last_request_ms` is when the cache was last used (the answer to the last request);
/// the cache is warm for `ttl_seconds` after it. A `last_request_ms` in the future (a
/// clock that moved back) counts as now, so the time left never exceeds the lifetime.
/// `recache_tokens` is what the last request carried; `prices` the model's, if known.
pub fn cache_state(
    now_ms: i64,
    last_request_ms: i64,
    ttl_seconds: u64,
    recache_tokens: Option<u64>,
    prices: Option<&ModelPrices>,
) -> CacheState {
    let ttl_ms = i64::try_from(ttl_seconds.saturating_mul(1_000)).unwrap_or(i64::MAX);
    let last = last_request_ms.min(now_ms);
    let expires_at_ms = last.saturating_add(ttl_ms);
    let left_ms = expires_at_ms.saturating_sub(now_ms);
    let warm = left_ms > 0;
    let seconds_left = if warm { u64::try_from(left_ms).unwrap_or(0).div_ceil(1_000) } else { 0 };
    let recache_cost_usd = match (recache_tokens, prices) {
        (Some(tokens), Some(prices)) => Some(prices.cache_write_cost_usd(tokens, ttl_seconds)),
        _ => None,
    };
    CacheState { warm, seconds_left, expires_at_ms, ttl_seconds, recache_tokens, recache_cost_usd }
}

/// One model's list prices, in US dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelPrices {
    /// The model's id in the table.
    pub model: String,
    /// Ids the API takes for it (without a date suffix).
    pub ids: Vec<String>,
    #[serde(flatten)]
    pub standard: Rates,
    /// Rates for prompts above a size, when the model has them.
    #[serde(default)]
    pub long_prompt: Option<LongPrompt>,
}

/// Per-million-token rates.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rates {
    pub input: f64,
    pub output: f64,
    pub cache_write5m: f64,
    pub cache_write1h: f64,
    pub cache_read: f64,
}

/// The rates that apply once a prompt is longer than `above_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LongPrompt {
    pub above_tokens: u64,
    #[serde(flatten)]
    pub rates: Rates,
}

impl ModelPrices {
    /// The rates for a prompt of `prompt_tokens`.
    pub fn rates_for(&self, prompt_tokens: u64) -> Rates {
        match &self.long_prompt {
            Some(long) if prompt_tokens > long.above_tokens => long.rates,
            _ => self.standard,
        }
    }

    /// What writing `tokens` to the cache costs with a lifetime of `ttl_seconds` (the
    /// 1-hour rate for lifetimes over 5 minutes).
    pub fn cache_write_cost_usd(&self, tokens: u64, ttl_seconds: u64) -> f64 {
        let rates = self.rates_for(tokens);
        let per_million = if ttl_seconds > FIVE_MINUTES_SECS { rates.cache_write1h } else { rates.cache_write5m };
        tokens as f64 / 1e6 * per_million
    }
}

/// The price table (`prices.json`) with where it comes from.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriceTable {
    /// Where the figures were read.
    pub source: String,
    /// The date they were current on (YYYY-MM-DD).
    pub date: String,
    pub unit: String,
    pub models: Vec<ModelPrices>,
}

const PRICES_JSON: &str = include_str!("prices.json");

/// The table compiled into ctxd (parsed once). A unit test proves the file parses; were
/// it ever not to, the table is empty and every price unknown, never a failure.
pub fn price_table() -> &'static PriceTable {
    static TABLE: OnceLock<PriceTable> = OnceLock::new();
    TABLE.get_or_init(|| serde_json::from_str(PRICES_JSON).unwrap_or_default())
}

/// The prices of `model_id`, if the table lists it.
///
/// Ids match exactly once the spellings around them are set aside: letter case, a
/// cloud provider's wrapping (`us.anthropic.…`, `anthropic/…`), a `[1m]` suffix, a
/// `-latest` alias, and a date with whatever follows it (`-20250514`, `@20250514`,
/// `-20250514-v1:0`). No family guess: a model the table does not list has no price,
/// since a newer model of a family is often priced differently.
pub fn prices_for(model_id: &str) -> Option<&'static ModelPrices> {
    let id = base_id(model_id)?;
    price_table().models.iter().find(|row| row.ids.contains(&id))
}

/// `model_id` without the spellings [`prices_for`] sets aside.
fn base_id(model_id: &str) -> Option<String> {
    let lower = model_id.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix("[1m]").unwrap_or(&lower);
    let start = lower.find("claude-")?;
    let id = &lower[start..];
    let id = id.strip_suffix("-latest").unwrap_or(id);
    // A date: eight digits after `-` or `@`; it and everything after go.
    let bytes = id.as_bytes();
    let date_at = (0..bytes.len()).find(|&i| {
        matches!(bytes[i], b'-' | b'@')
            && bytes.len() >= i + 9
            && bytes[i + 1..i + 9].iter().all(u8::is_ascii_digit)
            && bytes.get(i + 9).is_none_or(|c| !c.is_ascii_digit())
    });
    Some(date_at.map_or(id, |i| &id[..i]).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn opus() -> &'static ModelPrices {
        prices_for("claude-opus-5-5").unwrap()
    }

    #[test]
    fn the_table_parses_and_says_where_it_comes_from() {
        let table = price_table();
        assert!(table.source.contains("Claude Code 2.1.332"), "{}", table.source);
        assert_eq!(table.date, "2026-11-24");
        assert!(table.models.len() >= 20, "{}", table.models.len());
        for row in &table.models {
            let r = row.standard;
            // The API's ratios: 5-minute writes 1.25x input, 1-hour writes 2x.
            assert!((r.cache_write5m - r.input * 1.25).abs() < 1e-9, "{}", row.model);
            assert!((r.cache_write1h - r.input * 2.0).abs() < 1e-9, "{}", row.model);
            assert!(row.ids.contains(&row.model), "{}", row.model);
        }
    }

    #[test]
    fn model_ids_in_their_spellings() {
        let cases: &[(&str, Option<&str>)] = &[
            ("claude-opus-5-5", Some("claude-opus-5-5")),
            ("claude-opus-5-5[1m]", Some("claude-opus-5-5")),
            ("Claude-Opus-4-6", Some("claude-opus-4-6")),
            ("claude-sonnet-4-20250514", Some("claude-sonnet-4-0")),
            ("claude-sonnet-4-5-20250929", Some("claude-sonnet-4-5")),
            ("claude-3-5-haiku-latest", Some("claude-3-5-haiku")),
            ("us.anthropic.claude-opus-4-1-20250805-v1:0", Some("claude-opus-4-1")),
            ("claude-opus-4-1@20250805", Some("claude-opus-4-1")),
            ("anthropic/claude-haiku-4-5", Some("claude-haiku-4-5")),
            // No family guess: unknown ids have no price.
            ("claude-opus-4-9", None),
            ("claude-opus-5-55", None),
            ("gpt-5", None),
            ("", None),
        ];
        for &(id, want) in cases {
            assert_eq!(prices_for(id).map(|p| p.model.as_str()), want, "{id}");
        }
    }

    #[test]
    fn warm_until_the_lifetime_ends_then_cold() {
        let last = 1_000 * MIN;
        // (minutes after the last request, warm, seconds left)
        let cases: &[(i64, bool, u64)] =
            &[(0, true, 300), (1, true, 240), (4, true, 60), (5, false, 0), (60, false, 0)];
        for &(after, warm, left) in cases {
            let state = cache_state(last + after * MIN, last, FIVE_MINUTES_SECS, Some(1_000), None);
            assert_eq!((state.warm, state.seconds_left), (warm, left), "{after} min");
            assert_eq!(state.expires_at_ms, last + 5 * MIN);
        }
        // Part of a second left is a second left.
        let state = cache_state(last + 5 * MIN - 1, last, FIVE_MINUTES_SECS, None, None);
        assert_eq!((state.warm, state.seconds_left), (true, 1));
        // An hour's lifetime.
        let state = cache_state(last + 30 * MIN, last, ONE_HOUR_SECS, None, None);
        assert_eq!((state.warm, state.seconds_left), (true, 1_800));
    }

    #[test]
    fn a_last_request_in_the_future_counts_as_now() {
        let now = 1_000 * MIN;
        let state = cache_state(now, now + 10 * MIN, FIVE_MINUTES_SECS, None, None);
        assert_eq!((state.warm, state.seconds_left, state.expires_at_ms), (true, 300, now + 5 * MIN));
    }

    #[test]
    fn the_re_write_priced_at_the_lifetimes_write_rate() {
        // 612,000 tokens on claude-opus-5-5: $5 per million for 5-minute writes, $8 for 1 hour.
        let five = cache_state(0, 0, FIVE_MINUTES_SECS, Some(612_000), Some(opus()));
        assert_eq!(five.recache_tokens, Some(612_000));
        assert!((five.recache_cost_usd.unwrap() - 3.06).abs() < 1e-9, "{five:?}");
        let hour = cache_state(0, 0, ONE_HOUR_SECS, Some(612_000), Some(opus()));
        assert!((hour.recache_cost_usd.unwrap() - 4.896).abs() < 1e-9, "{hour:?}");
        // Unknown tokens or an unknown model: no price.
        assert_eq!(cache_state(0, 0, FIVE_MINUTES_SECS, None, Some(opus())).recache_cost_usd, None);
        assert_eq!(cache_state(0, 0, FIVE_MINUTES_SECS, Some(1), None).recache_cost_usd, None);
    }

    #[test]
    fn long_prompts_take_their_own_rates() {
        let haiku = prices_for("claude-haiku-5-5").unwrap();
        assert!((haiku.cache_write_cost_usd(100_000, FIVE_MINUTES_SECS) - 0.0125).abs() < 1e-12);
        assert!((haiku.cache_write_cost_usd(200_000, FIVE_MINUTES_SECS) - 0.125).abs() < 1e-12);
    }

    #[test]
    fn lifetime_labels() {
        assert_eq!(ttl_seconds("5m"), Some(300));
        assert_eq!(ttl_seconds("1h"), Some(3_600));
        assert_eq!(ttl_seconds("2h"), None);
    }
}
