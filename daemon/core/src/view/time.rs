//! Transcript timestamps as milliseconds since the Unix epoch.
//!
//! Time-based microcompact compares "now" with the time of the last response, and records
//! carry RFC 3339 text (`2026-11-29T21:19:51.104Z`). This small parser covers what
//! transcripts contain (date, time, optional fraction, `Z` or a numeric offset) so the
//! core needs no date crate. [`format_rfc3339_ms`] is its inverse, for the timestamps
//! ctxd writes on its own records.

/// Milliseconds since 1970-01-01T00:00:00Z for an RFC 3339 timestamp, or `None` when the
/// text is not one.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            // Only the first three digits count; the rest is below a millisecond.
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        for _ in (i - start)..3 {
            millis *= 10;
        }
    }
    let offset_minutes = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let hours = digits(b, i + 1, 2)?;
            let minutes = digits(b, i + 4, 2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let total = hours * 60 + minutes;
            if *sign == b'-' { -total } else { total }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1_000 + millis)
}

fn digits(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let slice = b.get(at..at + len)?;
    let mut value = 0i64;
    for &c in slice {
        if !c.is_ascii_digit() {
            return None;
        }
        value = value * 10 + i64::from(c - b'0');
    }
    Some(value)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// RFC 3339 UTC text with milliseconds (`2026-11-29T21:19:51.104Z`), the form transcript
/// timestamps take, for `ms` milliseconds since the Unix epoch.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let secs = in_day / 1_000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60,
        in_day % 1_000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (the inverse of
/// [`days_from_civil`], from the same algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::{format_rfc3339_ms, parse_rfc3339_ms};

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(1_795_987_191_104), "2026-11-29T21:19:51.104Z");
        assert_eq!(format_rfc3339_ms(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(-1_000), "1969-12-31T23:59:59.000Z");
    }

    #[test]
    fn formatting_is_the_inverse_of_parsing() {
        // Every few days over four centuries, with odd hours and milliseconds.
        let mut ms: i64 = -2_208_988_800_000; // 1900-01-01
        while ms < 10_413_792_000_000 {
            // 2300-01-01
            let text = format_rfc3339_ms(ms);
            assert_eq!(parse_rfc3339_ms(&text), Some(ms), "{text}");
            ms += 3 * 86_400_000 + 7_777_777;
        }
    }

    #[test]
    fn known_instants() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1_500));
        // date -u -d 2026-11-29T21:19:51.104Z +%s%3N
        assert_eq!(parse_rfc3339_ms("2026-11-29T21:19:51.104Z"), Some(1_795_987_191_104));
        assert_eq!(parse_rfc3339_ms("2026-11-29T22:19:51.104+01:00"), Some(1_795_987_191_104));
        assert_eq!(parse_rfc3339_ms("2026-11-29T20:19:51.104123-01:00"), Some(1_795_987_191_104));
        assert_eq!(parse_rfc3339_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59Z"), Some(-1_000));
    }

    #[test]
    fn rejects_what_is_not_a_timestamp() {
        for bad in [
            "",
            "2026-11-29",
            "2026-11-29T21:19:51",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T21:19:51.Z",
            "2026-11-29T21:19:51Zjunk",
            "2026-11-29T21:19:51+0100",
            "yesterday, around noon",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
