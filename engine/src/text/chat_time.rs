//! The clock of a chat template render: `strftime_now(format)` as transformers provides it
//! (`datetime.now().strftime(format)`, local time), from a time the caller hands the render, so
//! a test can pin the date that Llama 3.x and SmolLM3 templates write into the prompt.

use serde::{Deserialize, Serialize};

/// The moment a render sees as "now": a Unix time and the local offset from UTC at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderTime {
    pub unix_secs: i64,
    /// Seconds east of UTC (what `datetime.now()` would add to UTC here).
    pub utc_offset_secs: i32,
}

impl RenderTime {
    /// Now, in this machine's local time zone (as `datetime.now()` is).
    pub fn now() -> Self {
        let unix_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Self {
            unix_secs,
            utc_offset_secs: local_offset(unix_secs),
        }
    }

    /// A fixed moment in UTC.
    pub fn utc(unix_secs: i64) -> Self {
        Self {
            unix_secs,
            utc_offset_secs: 0,
        }
    }

    /// `strftime(format)` of this moment in its own offset: %a %A %b %B %d %e %H %I %j %m %M %p
    /// %S %y %Y %z %%, and glibc's `%-d`-style unpadded forms (Python passes the format to the C
    /// library). Anything else is written as it stands.
    pub fn strftime(&self, format: &str) -> String {
        let local = self
            .unix_secs
            .saturating_add(i64::from(self.utc_offset_secs));
        let days = local.div_euclid(86_400);
        let rem = local.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let is_leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let month_index = usize::try_from(m - 1).unwrap_or(0).min(11);
        let yday = cumulative[month_index] + d + i64::from(is_leap && m > 2);
        // 1970-01-01 was a Thursday (weekday 4, Sunday = 0).
        let weekday = usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0);
        let (hour, minute, second) = (rem / 3600, rem / 60 % 60, rem % 60);
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
        let mut out = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let unpadded = chars.peek() == Some(&'-');
            if unpadded {
                chars.next();
            }
            let num = |out: &mut String, v: i64, width: usize| {
                if unpadded {
                    out.push_str(&v.to_string());
                } else {
                    out.push_str(&format!("{v:0width$}"));
                }
            };
            match chars.next() {
                Some('a') => out.push_str(&DAYS[weekday][..3]),
                Some('A') => out.push_str(DAYS[weekday]),
                Some('b') => out.push_str(&MONTHS[month_index][..3]),
                Some('B') => out.push_str(MONTHS[month_index]),
                Some('d') => num(&mut out, d, 2),
                Some('e') if unpadded => num(&mut out, d, 1),
                Some('e') => out.push_str(&format!("{d:>2}")),
                Some('H') => num(&mut out, hour, 2),
                Some('I') => num(&mut out, hour12, 2),
                Some('j') => num(&mut out, yday, 3),
                Some('m') => num(&mut out, m, 2),
                Some('M') => num(&mut out, minute, 2),
                Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
                Some('S') => num(&mut out, second, 2),
                Some('y') => num(&mut out, y.rem_euclid(100), 2),
                Some('Y') => out.push_str(&y.to_string()),
                Some('z') => {
                    let off = self.utc_offset_secs;
                    let sign = if off < 0 { '-' } else { '+' };
                    let a = off.unsigned_abs();
                    out.push_str(&format!("{sign}{:02}{:02}", a / 3600, a / 60 % 60));
                }
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    if unpadded {
                        out.push('-');
                    }
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// Formats a Unix time (UTC) with [`RenderTime::strftime`]'s directives.
pub fn strftime_utc(format: &str, unix_secs: u64) -> String {
    RenderTime::utc(i64::try_from(unix_secs).unwrap_or(i64::MAX)).strftime(format)
}

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// This machine's offset from UTC at `unix_secs` (0 where it cannot be told).
fn local_offset(unix_secs: i64) -> i32 {
    #[cfg(unix)]
    {
        let t: libc::time_t = unix_secs as libc::time_t;
        // SAFETY: an all-zero `tm` is a valid value for localtime_r to overwrite.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe form.
        let ok = unsafe { !libc::localtime_r(&raw const t, &raw mut tm).is_null() };
        if ok {
            return i32::try_from(tm.tm_gmtoff).unwrap_or(0);
        }
        0
    }
    #[cfg(not(unix))]
    {
        let _ = unix_secs;
        0
    }
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = RenderTime::utc(1_709_211_909);
        assert_eq!(
            t.strftime("%d %b %Y %H:%M:%S %j %a %A"),
            "29 Feb 2024 13:05:09 060 Thu Thursday"
        );
        assert_eq!(
            t.strftime("%B %d, %Y %I %p %-d/%-m %e"),
            "February 29, 2024 01 PM 29/2 29"
        );
        assert_eq!(
            RenderTime::utc(0).strftime("%Y-%m-%d %B %z"),
            "1970-01-01 January +0000"
        );
        // One hour east of UTC moves 23:30 on 31 Dec past midnight.
        let east = RenderTime {
            unix_secs: 1_704_065_400,
            utc_offset_secs: 3600,
        };
        assert_eq!(east.strftime("%Y-%m-%d %H:%M %z"), "2024-01-01 00:30 +0100");
        assert_eq!(east.strftime("100%% %Q"), "100% %Q");
    }
}
