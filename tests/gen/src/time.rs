//! Timestamps as Claude Code writes them (`2026-11-01T09:00:00.000Z`), from and to
//! milliseconds since the Unix epoch, without a date crate.

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d`.
fn days_from_date(y: i64, m: i64, d: i64) -> i64 {
    // Count from 0000-03-01 so that the leap day ends a year; eras are 400-year cycles.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (m + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `(y, m, d)` of day `days` after 1970-01-01.
fn date_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let d = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let m = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let y = year_of_era + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_ms(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = date_from_days(days);
    let s = in_day / 1_000;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", s / 3_600, s / 60 % 60, s % 60, in_day % 1_000)
}

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.fff]Z`; `None` for anything
/// else (offsets other than `Z` are not needed here).
pub fn parse_ms(text: &str) -> Option<i64> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (date.next()??, date.next()??, date.next()??);
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut hms = time.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (hms.next()??, hms.next()??, hms.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    let millis = match fraction {
        "" => 0,
        f if f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => format!("{f:0<3}")[..3].parse().ok()?,
        _ => return None,
    };
    Some(((days_from_date(y, m, d) * 24 + h) * 60 + min) * 60_000 + s * 1_000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        // 2026-11-01T09:00:00Z, from `date -u -d 2026-11-01T09:00:00Z +%s`.
        assert_eq!(parse_ms("2026-11-01T09:00:00Z"), Some(1_793_523_600_000));
        assert_eq!(format_ms(1_793_523_600_123), "2026-11-01T09:00:00.123Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(parse_ms("2000-03-01T00:00:00.5Z"), Some(951_868_800_500));
    }

    #[test]
    fn round_trip_over_four_centuries_of_days() {
        let mut ms = -4_000_000_000_000i64;
        while ms < 9_000_000_000_000 {
            assert_eq!(parse_ms(&format_ms(ms)), Some(ms), "{}", format_ms(ms));
            ms += 86_400_000 * 37 + 3_723_456;
        }
    }

    #[test]
    fn malformed_text_is_refused() {
        for bad in ["", "2026-11-01", "2026-11-01T09:00:00", "2026-13-01T09:00:00Z", "2026-11-01T09:00:00+01:00"] {
            assert_eq!(parse_ms(bad), None, "{bad}");
        }
    }
}
