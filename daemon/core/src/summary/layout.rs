//! Laying the nine sections out under an output cap.
//!
//! Sections are lists of entries; each entry has a fixed lead ("- First request: ") and
//! a body that may be cut. When everything fits, everything is written in full. When it
//! does not, room is shared out so that the longest sections give up the most
//! (water-filling: no section is cut below what a shorter one keeps), and inside a
//! section the longest bodies are cut first, down to a per-entry minimum. When the
//! minimums do not fit, entries fall back to a brief form (a few words), lowest rank
//! first; only when even the brief forms do not fit are whole entries dropped, lowest
//! rank first, behind one visible marker. Entries marked `keep` are never dropped, and
//! headings are always written. Entries marked `named` (the files touched since the
//! previous compaction) keep at least their brief form before any other section gives
//! up its floor, and are dropped only after every other entry of their section. Their
//! paths have room of their own on top of the cap (the file list's allowance, bounded
//! by the caller): what they need of it, up to its bound, is added to the budget and
//! held for them, so they do not take the user messages' room; only past that bound do
//! they compete for the cap as before, the newest first, the oldest counted in a marker
//! that says where to find them.
//! Entries that match the caller's focus keep twice the room of the others, count
//! towards their section's floor and are dropped last. If even the kept entries do not
//! fit at their minimums, every minimum shrinks in steps (the "squeeze") before the
//! layout settles for headings alone.

use std::borrow::Cow;

use super::reply::SECTION_TITLES;
use super::text::{BYTES_PER_TOKEN, CutStyle, cut, estimate_tokens, push_indented, thousands};

/// One entry of a section.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// Written before the body and never cut ("- Latest request: ").
    pub lead: String,
    /// The part that may be cut.
    pub body: String,
    /// Bytes of body kept when the cap is tight (when the body is longer).
    pub min_body: usize,
    /// Bytes of body kept when even the `min_body` forms of a section do not fit,
    /// before any entry of it is given its brief form.
    pub tiny_body: usize,
    /// Bytes of body kept when even the `tiny_body` forms do not fit, before any entry
    /// of the section is dropped.
    pub brief_body: usize,
    pub style: CutStyle,
    /// Entries with a lower rank are dropped first.
    pub rank: u32,
    /// Never dropped (may still be cut to its minimum).
    pub keep: bool,
    /// Matches the caller's focus.
    pub focus: bool,
    /// Named whatever else is cut: its brief form counts in its section's floor (up to
    /// [`NAMED_SHARE`] of the budget), and it is dropped only after every entry that is
    /// not named.
    pub named: bool,
    /// Bytes at the start of the body written whole or not at all (a file's actions,
    /// which a marker inside would make unreadable); the rest is cut as `style` says.
    pub whole_prefix: usize,
    /// How many the entry stands for in its section's marker when it is dropped (a
    /// message sent several times is one entry).
    pub stands_for: usize,
}

impl Entry {
    pub(super) fn new(lead: impl Into<String>, body: impl Into<String>) -> Entry {
        Entry {
            lead: lead.into(),
            body: body.into(),
            min_body: 120,
            tiny_body: 120,
            brief_body: 120,
            style: CutStyle::Head,
            rank: 0,
            keep: false,
            focus: false,
            named: false,
            whole_prefix: 0,
            stands_for: 1,
        }
    }
    /// Sets the minimum body (and the tiny and brief forms to the same).
    pub(super) fn min(mut self, bytes: usize) -> Entry {
        self.min_body = bytes;
        self.tiny_body = bytes;
        self.brief_body = bytes;
        self
    }
    /// Sets the tiny form (and the brief form to the same).
    pub(super) fn tiny(mut self, bytes: usize) -> Entry {
        self.tiny_body = bytes.min(self.min_body);
        self.brief_body = self.tiny_body;
        self
    }
    pub(super) fn brief(mut self, bytes: usize) -> Entry {
        self.brief_body = bytes.min(self.tiny_body);
        self
    }
    pub(super) fn rank(mut self, rank: usize) -> Entry {
        self.rank = u32::try_from(rank).unwrap_or(u32::MAX);
        self
    }
    pub(super) fn keep(mut self) -> Entry {
        self.keep = true;
        self
    }
    pub(super) fn head_tail(mut self) -> Entry {
        self.style = CutStyle::HeadTail;
        self
    }
    pub(super) fn named(mut self) -> Entry {
        self.named = true;
        self
    }
    pub(super) fn whole_prefix(mut self, bytes: usize) -> Entry {
        self.whole_prefix = bytes;
        self
    }
    pub(super) fn stands_for(mut self, count: usize) -> Entry {
        self.stands_for = count;
        self
    }
}

/// One of the nine sections.
#[derive(Debug, Clone)]
pub(super) struct Section {
    /// 1 to 9.
    pub number: usize,
    pub entries: Vec<Entry>,
    /// Written when there are no entries.
    pub empty: &'static str,
    /// What the entries are (singular, plural), for the "N more … cut" marker.
    pub noun: (&'static str, &'static str),
    /// Entries an earlier summary already left out, counted in this section's marker.
    pub folded: usize,
    /// Said after the marker: which entries went and where to find them (" (…)"), or
    /// nothing.
    pub marker_hint: &'static str,
}

const ENTRY_INDENT: &str = "   ";
/// Continuation lines line up under the text after "- ", and can never start a
/// heading.
const CONTINUATION_INDENT: &str = "     ";
const OPEN: &str = "<summary>\n";
const CLOSE: &str = "</summary>";

fn heading(number: usize) -> String {
    let title = SECTION_TITLES.get(number.wrapping_sub(1)).copied().unwrap_or("Notes");
    format!("{number}. {title}:\n")
}

/// The body as written for a byte limit: whole, cut with a marker, or left out when the
/// limit is zero.
fn body_at<'e>(entry: &'e Entry, limit: usize) -> Cow<'e, str> {
    let prefix = entry.whole_prefix.min(entry.body.len());
    if entry.body.len() <= limit {
        Cow::Borrowed(&entry.body)
    } else if limit == 0 || limit < prefix || !entry.body.is_char_boundary(prefix) {
        Cow::Borrowed("")
    } else if limit == prefix {
        Cow::Borrowed(&entry.body[..prefix])
    } else {
        let (head, rest) = entry.body.split_at(prefix);
        Cow::Owned(format!("{head}{}", cut(rest, limit - prefix, entry.style)))
    }
}

fn write_entry(out: &mut String, entry: &Entry, limit: usize) {
    out.push_str(ENTRY_INDENT);
    push_indented(out, &entry.lead, CONTINUATION_INDENT);
    let body = body_at(entry, limit);
    if entry.lead.ends_with('\n') && !body.is_empty() {
        // A lead that ends its line puts the body on the next, indented.
        out.push_str(CONTINUATION_INDENT);
    }
    push_indented(out, &body, CONTINUATION_INDENT);
    out.push('\n');
}

fn entry_len(entry: &Entry, limit: usize, scratch: &mut String) -> usize {
    scratch.clear();
    write_entry(scratch, entry, limit);
    scratch.len()
}

fn dropped_line(count: usize, section: &Section) -> String {
    let noun = if count == 1 { section.noun.0 } else { section.noun.1 };
    format!("{ENTRY_INDENT}- [… {} more {noun} cut …]{}\n", thousands(count), section.marker_hint)
}

/// Per-entry body limits (`None` = dropped) for one section.
type Limits = Vec<Option<usize>>;

fn write_section(section: &Section, limits: &Limits) -> String {
    let mut out = heading(section.number);
    if section.entries.is_empty() && section.folded == 0 {
        out.push_str(ENTRY_INDENT);
        out.push_str(section.empty);
        out.push('\n');
        return out;
    }
    let dropped: usize =
        section.entries.iter().zip(limits).filter(|(_, l)| l.is_none()).map(|(e, _)| e.stands_for).sum::<usize>()
            + section.folded;
    // With nothing dropped now, what earlier summaries left out is marked after the
    // first entry (the oldest are left out first, and the first entry is kept).
    let mut marker_written = dropped == 0;
    let fold_at = if limits.iter().any(Option::is_none) { usize::MAX } else { 1.min(section.entries.len()) };
    for (i, (entry, limit)) in section.entries.iter().zip(limits).enumerate() {
        if i == fold_at && !marker_written {
            out.push_str(&dropped_line(dropped, section));
            marker_written = true;
        }
        match limit {
            Some(limit) => write_entry(&mut out, entry, *limit),
            None if !marker_written => {
                out.push_str(&dropped_line(dropped, section));
                marker_written = true;
            }
            None => {}
        }
    }
    if !marker_written {
        out.push_str(&dropped_line(dropped, section));
    }
    out
}

fn full_limits(section: &Section) -> Limits {
    section.entries.iter().map(|e| Some(e.body.len())).collect()
}

/// An entry's minimum body under a squeeze (percent of the configured minimum).
fn squeezed(bytes: usize, squeeze: usize) -> usize {
    bytes.saturating_mul(squeeze) / 100
}

/// Fits one section into `allowance` bytes (heading included) as well as it can, with
/// the entries' minimums scaled to `squeeze` percent. The result may be longer when
/// the kept entries' minimums alone do not fit.
fn fit_section(section: &Section, allowance: usize, squeeze: usize) -> String {
    let full = write_section(section, &full_limits(section));
    if full.len() <= allowance || section.entries.is_empty() {
        return full;
    }
    let mut scratch = String::new();
    let entries = &section.entries;
    let heading_len = heading(section.number).len();
    let mut mins: Vec<usize> = entries.iter().map(|e| squeezed(e.min_body, squeeze).min(e.body.len())).collect();
    let mut min_lens: Vec<usize> = entries.iter().zip(&mins).map(|(e, m)| entry_len(e, *m, &mut scratch)).collect();
    if heading_len + min_lens.iter().sum::<usize>() > allowance {
        // Shorter forms for every entry before dropping any.
        mins = entries.iter().map(|e| squeezed(e.tiny_body, squeeze).min(e.body.len())).collect();
        min_lens = entries.iter().zip(&mins).map(|(e, m)| entry_len(e, *m, &mut scratch)).collect();
    }

    let mut total = heading_len + min_lens.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..entries.len()).filter(|&i| !entries[i].keep).collect();
    order.sort_by_key(|&i| (entries[i].focus, entries[i].rank, i));
    // Brief forms, lowest rank first, until the minimums fit: every entry stays named
    // for as long as the room allows.
    for &i in &order {
        if total <= allowance {
            break;
        }
        let brief = squeezed(entries[i].brief_body, squeeze).min(mins[i]);
        if brief < mins[i] {
            let len = entry_len(&entries[i], brief, &mut scratch);
            total = total - min_lens[i] + len;
            (mins[i], min_lens[i]) = (brief, len);
        }
    }

    // Drop entries until the minimums fit: lowest rank first, focus matches last, named
    // entries after all others.
    let mut alive = vec![true; entries.len()];
    let mut dropped = section.folded;
    order.sort_by_key(|&i| entries[i].named);
    for i in order {
        let marker = if dropped > 0 { dropped_line(dropped, section).len() } else { 0 };
        if total + marker <= allowance {
            break;
        }
        alive[i] = false;
        total -= min_lens[i];
        dropped += entries[i].stands_for;
    }
    let marker = if dropped > 0 { dropped_line(dropped, section).len() } else { 0 };

    // Largest common level that fits: each body keeps min(len, max(min, weight × level)).
    let limit_at = |i: usize, level: usize| -> usize {
        let weight = if entries[i].focus { 2 } else { 1 };
        level.saturating_mul(weight).max(mins[i]).min(entries[i].body.len())
    };
    let mut size_at = |level: usize| -> usize {
        heading_len
            + marker
            + (0..entries.len())
                .filter(|&i| alive[i])
                .map(|i| entry_len(&entries[i], limit_at(i, level), &mut scratch))
                .sum::<usize>()
    };
    let max_body = entries.iter().map(|e| e.body.len()).max().unwrap_or(0);
    let (mut lo, mut hi) = (0usize, max_body);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if size_at(mid) <= allowance {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let limits: Limits = (0..entries.len()).map(|i| alive[i].then(|| limit_at(i, lo))).collect();
    write_section(section, &limits)
}

/// Length of a section with every entry at its (squeezed) minimum.
fn min_len_of(section: &Section, squeeze: usize) -> usize {
    section_len_at(section, squeeze, |e| Some(e.min_body))
}

/// Length of a section with only the entries that must stay: the kept ones and focus
/// matches at their (squeezed) minimum, the named ones at their brief form, plus the
/// marker for the others; and the named entries' part of it.
fn kept_len_of(section: &Section, squeeze: usize) -> (usize, usize) {
    let must = |e: &Entry| e.keep || e.focus;
    let all = section_len_at(section, squeeze, |e| match (must(e), e.named) {
        (true, _) => Some(e.min_body),
        (false, true) => Some(e.brief_body),
        (false, false) => None,
    });
    if !section.entries.iter().any(|e| e.named && !must(e)) {
        return (all, 0);
    }
    let without = section_len_at(section, squeeze, |e| must(e).then_some(e.min_body));
    (all, all.saturating_sub(without))
}

/// Length of a section with every entry at its (squeezed) brief form, the kept ones at
/// their minimum.
fn brief_len_of(section: &Section, squeeze: usize) -> usize {
    section_len_at(section, squeeze, |e| Some(if e.keep { e.min_body } else { e.brief_body }))
}

/// Length of a section with each entry at the body `form` gives it (squeezed), or left
/// out (`None`) and counted in the marker.
fn section_len_at(section: &Section, squeeze: usize, form: impl Fn(&Entry) -> Option<usize>) -> usize {
    if section.entries.is_empty() {
        return write_section(section, &Vec::new()).len();
    }
    let mut scratch = String::new();
    let mut left_out = section.folded;
    let mut mins = 0;
    for e in &section.entries {
        match form(e) {
            Some(body) => mins += entry_len(e, squeezed(body, squeeze).min(e.body.len()), &mut scratch),
            None => left_out += e.stands_for,
        }
    }
    let marker = if left_out > 0 { dropped_line(left_out, section).len() } else { 0 };
    heading(section.number).len() + mins + marker
}

/// What each section is given before the rest of the budget is shared out.
/// - The protected section: every entry at its minimum, within its share.
/// - The others: their kept and focus-matching entries at their minimum, and some room
///   beyond the heading so the newest entries survive; that extra room is the first
///   thing given up when the floors do not fit.
/// - Named entries at their brief form: first in `reserve`, the part of `budget` held
///   for them (the file list's allowance), then in the room the protected section's
///   brief forms and the others' kept entries leave of the rest (at most
///   [`NAMED_SHARE`] of it), paid for by the others' extra room.
fn floors(sections: &[Section], full_lens: &[usize], budget: usize, reserve: usize, squeeze: usize) -> Vec<usize> {
    let is_protected = |i: usize| sections[i].number == PROTECTED_SECTION;
    let lens: Vec<(usize, usize)> = sections.iter().map(|s| kept_len_of(s, squeeze)).collect();
    let reserve = reserve.min(budget);
    // Shares are of the budget the sections have in common, the reserve aside.
    let shared = budget - reserve;
    // The protected section's floor: every entry at its minimum, within its share of
    // the budget. Past the share the oldest are counted in the marker rather than
    // squeezing files and current work out; the share is larger when that holds every
    // entry in its tiny form, or else in its brief form.
    let protected_floor = |s: &Section, full: usize, kept: usize| -> usize {
        let (large, small) = (shared * PROTECTED_BRIEF_SHARE / 100, shared * PROTECTED_SHARE / 100);
        let tiny = section_len_at(s, squeeze, |e| Some(if e.keep { e.min_body } else { e.tiny_body }));
        let brief = brief_len_of(s, squeeze);
        let share = if tiny <= large {
            tiny.max(small)
        } else if brief <= large {
            brief.max(small)
        } else {
            small
        };
        min_len_of(s, squeeze).min(full).min(share.max(kept))
    };
    // That promise comes before the named entries; these come before anything else
    // beyond the kept entries.
    let promised: usize = (0..sections.len())
        .filter(|&i| is_protected(i))
        .map(|i| protected_floor(&sections[i], full_lens[i], lens[i].0))
        .sum();
    let kept_alone: usize = (0..sections.len()).filter(|&i| !is_protected(i)).map(|i| lens[i].0 - lens[i].1).sum();
    let mut named_room = reserve + (shared * NAMED_SHARE / 100).min(shared.saturating_sub(promised + kept_alone));
    let mut named_total = 0;
    let kept: Vec<usize> = lens
        .iter()
        .zip(full_lens)
        .map(|(&(kept, named), &full)| {
            let room = named.min(named_room);
            named_room -= room;
            named_total += room;
            (kept - (named - room)).min(full)
        })
        .collect();
    let mut floors: Vec<usize> = sections
        .iter()
        .zip(full_lens)
        .zip(&kept)
        .map(|((s, &full), &kept)| {
            if s.number == PROTECTED_SECTION {
                protected_floor(s, full, kept)
            } else {
                kept.max(heading(s.number).len() + FLOOR_BYTES).min(full)
            }
        })
        .collect();
    // Beyond the reserve, the named entries are paid for by the room the other sections
    // keep beyond their kept entries.
    let unprotected: Vec<usize> = (0..sections.len()).filter(|&i| !is_protected(i)).collect();
    let extra = |i: usize, floors: &[usize]| floors[i].saturating_sub(kept[i]);
    let extras: usize = unprotected.iter().map(|&i| extra(i, &floors)).sum();
    let paid = named_total.saturating_sub(reserve).min(extras);
    if paid > 0 {
        for &i in &unprotected {
            floors[i] -= extra(i, &floors) * paid / extras;
        }
    }
    if floors.iter().sum::<usize>() <= budget {
        return floors;
    }
    let others = |floors: &[usize]| -> usize { unprotected.iter().map(|&i| floors[i]).sum() };
    // Not even the floors fit. The protected section takes what the others leave; if
    // they would leave it less than half of the shared budget, or less than its
    // promise, they keep only their kept (and named) entries.
    let left = budget.saturating_sub(others(&floors));
    if others(&floors).saturating_sub(reserve) > shared / 2 || left < promised {
        for &i in &unprotected {
            floors[i] = kept[i];
        }
    }
    let others = others(&floors);
    for (i, s) in sections.iter().enumerate() {
        if s.number == PROTECTED_SECTION {
            floors[i] = floors[i].min(budget.saturating_sub(others)).max(kept[i]);
        }
    }
    floors
}

/// Room every section keeps beyond its heading while others still have more to give.
const FLOOR_BYTES: usize = 240;

/// The section whose entries all keep their short form if at all possible.
const PROTECTED_SECTION: usize = 6;
/// Percent of the budget the protected section's floor may take.
const PROTECTED_SHARE: usize = 60;
/// Percent it may take when that is enough for all its entries in brief form.
const PROTECTED_BRIEF_SHARE: usize = 80;
/// Percent of the shared budget (the reserve aside) the named entries' brief forms may
/// take in their section's floor beyond the reserve.
const NAMED_SHARE: usize = 40;

/// Bytes of the named entries' brief forms (their paths), over all sections.
fn named_len(sections: &[Section]) -> usize {
    sections.iter().map(|s| kept_len_of(s, 100).1).sum()
}

/// Lays the sections out as the `<summary>` text within `cap_tokens` (estimated as
/// bytes / 4, rounded up), plus what the named entries' paths need of
/// `allowance_tokens`. Returns the text and whether anything was cut to fit.
///
/// A cap too small for the nine headings still yields the nine headings: the text is
/// then over the cap, which the caller sees in the token count.
pub(super) fn layout(sections: &[Section], cap_tokens: u64, allowance_tokens: u64) -> (String, bool) {
    let to_bytes = |tokens: u64| usize::try_from(tokens.saturating_mul(BYTES_PER_TOKEN)).unwrap_or(usize::MAX);
    let paths = u64::try_from(named_len(sections)).unwrap_or(u64::MAX).div_ceil(BYTES_PER_TOKEN);
    let reserve_tokens = paths.min(allowance_tokens);
    let cap_tokens = cap_tokens.saturating_add(reserve_tokens);
    let (cap_bytes, reserve) = (to_bytes(cap_tokens), to_bytes(reserve_tokens));
    let full: Vec<String> = sections.iter().map(|s| write_section(s, &full_limits(s))).collect();
    let text = join(&full);
    if text.len() <= cap_bytes {
        return (text, false);
    }
    let fixed = OPEN.len() + CLOSE.len() + sections.len().saturating_sub(1);
    let full_lens: Vec<usize> = full.iter().map(String::len).collect();
    // When even the entries that must stay do not fit at their minimums, the minimums
    // shrink step by step before giving up on entries' bodies altogether.
    for squeeze in SQUEEZE_STEPS {
        let mut budget = cap_bytes.saturating_sub(fixed);
        // Cutting is not exact (markers, word boundaries): retry with the overshoot
        // taken off the budget.
        for _ in 0..4 {
            let floors = floors(sections, &full_lens, budget, reserve, squeeze);
            let fitted = fit_all(sections, &full_lens, &floors, budget, squeeze);
            let text = join(&fitted);
            if estimate_tokens(&text) <= cap_tokens {
                return (text, true);
            }
            let over = text.len().saturating_sub(cap_bytes);
            budget = budget.saturating_sub(over.max(16));
        }
    }
    // Nothing fits: headings only.
    let bare: Vec<String> = sections.iter().map(|s| heading(s.number)).collect();
    (join(&bare), true)
}

/// Percentages of the entries' minimums tried in turn.
const SQUEEZE_STEPS: [usize; 5] = [100, 60, 35, 20, 0];

/// Shares `budget` bytes between the sections and fits each into its share.
fn fit_all(sections: &[Section], full_lens: &[usize], floors: &[usize], budget: usize, squeeze: usize) -> Vec<String> {
    let n = sections.len();
    let mut remaining = budget.saturating_sub(floors.iter().sum());
    // Smallest need first, so what a short section does not use flows to longer ones.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (full_lens[i].saturating_sub(floors[i]), i));
    let mut out = vec![String::new(); n];
    for (k, &i) in order.iter().enumerate() {
        let share = remaining / (n - k);
        let extra = full_lens[i].saturating_sub(floors[i]).min(share);
        let text = fit_section(&sections[i], floors[i] + extra, squeeze);
        remaining = remaining.saturating_sub(text.len().saturating_sub(floors[i]));
        out[i] = text;
    }
    out
}

fn join(sections: &[String]) -> String {
    let mut text =
        String::with_capacity(OPEN.len() + CLOSE.len() + sections.iter().map(|s| s.len() + 1).sum::<usize>());
    text.push_str(OPEN);
    for (i, s) in sections.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        text.push_str(s);
    }
    text.push_str(CLOSE);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(number: usize, bodies: &[&str]) -> Section {
        Section {
            number,
            entries: bodies.iter().enumerate().map(|(i, b)| Entry::new("- ", *b).min(60).rank(i)).collect(),
            empty: "- none",
            noun: ("entry", "entries"),
            folded: 0,
            marker_hint: "",
        }
    }

    #[test]
    fn everything_fits_uncut() {
        let (text, trimmed) = layout(&[section(1, &["a", "b"]), section(2, &[])], 1000, 0);
        assert!(!trimmed);
        assert_eq!(
            text,
            "<summary>\n1. Primary Request and Intent:\n   - a\n   - b\n\n2. Key Technical Concepts:\n   - none\n</summary>"
        );
    }

    #[test]
    fn the_longest_section_gives_up_the_most() {
        let long = "x".repeat(4000);
        let sections = [section(1, &["short entry"]), section(2, &[&long])];
        let (text, trimmed) = layout(&sections, 300, 0);
        assert!(trimmed);
        assert!(estimate_tokens(&text) <= 300, "{}", text.len());
        assert!(text.contains("- short entry\n"));
        assert!(text.contains("characters cut …]"));
    }

    #[test]
    fn entries_drop_lowest_rank_first_behind_a_marker() {
        let bodies: Vec<String> = (0..40).map(|i| format!("entry number {i} {}", "y".repeat(60))).collect();
        let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
        let mut s = section(3, &refs);
        s.entries[0].keep = true;
        let (text, _) = layout(&[s], 200, 0);
        assert!(estimate_tokens(&text) <= 200);
        assert!(text.contains("entry number 0 "), "kept entry survives");
        assert!(text.contains("entry number 39"), "highest rank survives");
        assert!(!text.contains("entry number 1 "), "lowest unkept rank goes first");
        assert!(text.contains("more entries cut …]"));
    }

    #[test]
    fn brief_forms_come_before_any_entry_is_dropped() {
        let bodies: Vec<String> =
            (0..40).map(|i| format!("Request {i:02} names its task first. {}", "detail ".repeat(30))).collect();
        let entries = bodies.iter().enumerate().map(|(i, b)| Entry::new("- ", b.as_str()).min(160).brief(40).rank(i));
        let mut s = Section {
            number: PROTECTED_SECTION,
            entries: entries.collect(),
            empty: "- none",
            noun: ("message", "messages"),
            folded: 0,
            marker_hint: "",
        };
        s.entries[39].keep = true;
        // Room for every entry's first words, not for their minimums.
        let (text, trimmed) = layout(std::slice::from_ref(&s), 700, 0);
        assert!(trimmed && estimate_tokens(&text) <= 700);
        for i in 0..40 {
            assert!(text.contains(&format!("Request {i:02} names")), "{i} missing:\n{text}");
        }
        assert!(!text.contains("more messages cut"), "{text}");
        assert!(text.contains("Request 39 names its task first. detail detail"), "the kept entry keeps its minimum");
        // Less room: the oldest go, counted; the newest stay.
        let (text, _) = layout(&[s], 250, 0);
        assert!(estimate_tokens(&text) <= 250);
        assert!(
            text.contains("more messages cut …]") && text.contains("Request 38 names") && !text.contains("Request 00")
        );
    }

    #[test]
    fn focus_entries_keep_more() {
        let body = "z".repeat(1000);
        let mut s = section(5, &[&body, &body]);
        s.entries[1].focus = true;
        let out = fit_section(&s, 600, 100);
        let lines: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].len() > lines[0].len() + 50, "{} vs {}", lines[1].len(), lines[0].len());
    }

    #[test]
    fn a_cap_below_the_headings_leaves_the_headings() {
        let sections: Vec<Section> = (1..=9).map(|n| section(n, &["some body text here"])).collect();
        let (text, trimmed) = layout(&sections, 5, 0);
        assert!(trimmed);
        for n in 1..=9 {
            assert!(text.contains(&heading(n)), "{n}");
        }
        assert!(!text.contains("some body"));
    }

    #[test]
    fn named_entries_keep_their_path_before_other_sections_keep_their_room() {
        // Twenty files, each "- path: actions"; a long section beside them; a cap that
        // holds every path but not every action.
        let files: Vec<Entry> = (0..20)
            .map(|i| {
                let actions = format!(": read lines 1–{i}0 of 900; edited ×{i}");
                Entry::new(format!("- /p/src/file_{i:02}.rs"), format!("{actions}. Last edit: `a` → `b`"))
                    .min(actions.len())
                    .brief(0)
                    .whole_prefix(actions.len())
                    .named()
                    .rank(i + 1)
            })
            .collect();
        let files =
            Section { number: 3, entries: files, empty: "- none", noun: ("file", "files"), folded: 0, marker_hint: "" };
        let long = "w".repeat(3000);
        let sections = [section(2, &[&long, &long]), files, section(5, &[&long])];
        let (text, trimmed) = layout(&sections, 400, 0);
        assert!(trimmed && estimate_tokens(&text) <= 400, "{}", text.len());
        for i in 0..20 {
            assert!(text.contains(&format!("- /p/src/file_{i:02}.rs")), "file {i}:\n{text}");
        }
        // A file's actions are whole or absent: no marker inside them.
        for line in text.lines().filter(|l| l.contains("/p/src/")) {
            assert!(!line.contains("cut …]") || line.contains("Last edit"), "{line}");
            assert!(line.ends_with(".rs") || line.contains("; edited ×"), "{line}");
        }
        // With less room than the paths need, the oldest files go first, counted.
        let (text, _) = layout(&sections, 150, 0);
        assert!(estimate_tokens(&text) <= 150);
        assert!(text.contains("- /p/src/file_19.rs") && !text.contains("- /p/src/file_00.rs"), "{text}");
        assert!(text.contains("more files cut …]"), "{text}");
    }
}
