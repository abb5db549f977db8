//! Billing periods: calendar months in UTC, `[first instant, first instant of the next
//! month)`, written `YYYY-MM`. Charges that span a month's end are split at it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use meridian_events::money::seconds_between;
use meridian_events::MoneyError;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// One calendar month in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Period {
    year: i32,
    /// 1 to 12.
    month: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid period {0:?}: expected a month as YYYY-MM, e.g. 2026-11")]
pub struct InvalidPeriod(pub String);

impl Period {
    pub fn new(year: i32, month: u32) -> Result<Period, InvalidPeriod> {
        if !(1..=12).contains(&month) || !(1970..=9999).contains(&year) {
            return Err(InvalidPeriod(format!("{year:04}-{month:02}")));
        }
        Ok(Period { year, month })
    }

    /// The month `at` falls in.
    pub fn of(at: DateTime<Utc>) -> Period {
        Period {
            year: at.year(),
            month: at.month(),
        }
    }

    /// Its first instant (inclusive).
    pub fn start(self) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(self.year, self.month, 1, 0, 0, 0)
            .single()
            .expect("the first of a month exists")
    }

    /// The first instant of the next month (exclusive end).
    pub fn end(self) -> DateTime<Utc> {
        self.next().start()
    }

    pub fn next(self) -> Period {
        if self.month == 12 {
            Period {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Period {
                year: self.year,
                month: self.month + 1,
            }
        }
    }
}

impl FromStr for Period {
    type Err = InvalidPeriod;
    fn from_str(s: &str) -> Result<Period, InvalidPeriod> {
        let bad = || InvalidPeriod(s.to_owned());
        let b = s.as_bytes();
        if b.len() != 7
            || b[4] != b'-'
            || !b
                .iter()
                .enumerate()
                .all(|(i, c)| i == 4 || c.is_ascii_digit())
        {
            return Err(bad());
        }
        let year: i32 = s[..4].parse().map_err(|_| bad())?;
        let month: u32 = s[5..].parse().map_err(|_| bad())?;
        Period::new(year, month).map_err(|_| bad())
    }
}

impl TryFrom<String> for Period {
    type Error = InvalidPeriod;
    fn try_from(s: String) -> Result<Period, InvalidPeriod> {
        s.parse()
    }
}

impl From<Period> for String {
    fn from(p: Period) -> String {
        p.to_string()
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

/// A stretch of time inside one billing period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub period: Period,
    pub start: DateTime<Utc>,
    /// Exclusive.
    pub end: DateTime<Utc>,
}

/// `[start, end)` cut at every month boundary inside it, in order. An empty stretch
/// (`end <= start`) is one empty piece in `start`'s month, so that an instantaneous
/// charge (a transfer timed at one instant) still has a period.
pub fn split(start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut from = start;
    loop {
        let period = Period::of(from);
        let boundary = period.end();
        if end <= boundary {
            out.push(Piece {
                period,
                start: from,
                end: end.max(from),
            });
            return out;
        }
        out.push(Piece {
            period,
            start: from,
            end: boundary,
        });
        from = boundary;
    }
}

/// `total` (GB of a copy) shared between the pieces of `[start, end)` in proportion to
/// the time in each; the last piece takes the remainder, so the shares add up to `total`
/// exactly. The ledger bills egress this way, and placement counts a tenant's month so
/// far the same way.
pub fn share_by_time(
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    total: Decimal,
) -> Result<Vec<(Piece, Decimal)>, MoneyError> {
    let pieces = split(start, end);
    let total_seconds = seconds_between(start, end);
    let mut out = Vec::with_capacity(pieces.len());
    let mut assigned = Decimal::ZERO;
    for (i, piece) in pieces.iter().enumerate() {
        let share = if i + 1 == pieces.len() {
            total - assigned
        } else {
            total
                .checked_mul(seconds_between(piece.start, piece.end))
                .and_then(|n| n.checked_div(total_seconds))
                .ok_or(MoneyError::Overflow)?
        };
        assigned += share;
        out.push((*piece, share));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn periods_parse_and_print() {
        let p: Period = "2026-11".parse().unwrap();
        assert_eq!(p.to_string(), "2026-11");
        assert_eq!(p.start(), t("2026-11-01T00:00:00Z"));
        assert_eq!(p.end(), t("2026-12-01T00:00:00Z"));
        assert_eq!(
            "2026-12".parse::<Period>().unwrap().end(),
            t("2027-01-01T00:00:00Z")
        );
        for bad in [
            "2026-13",
            "2026-00",
            "2026-1",
            "26-11",
            "2026/11",
            "2026-11-01",
            "",
            "２０２６-11",
        ] {
            assert!(bad.parse::<Period>().is_err(), "{bad}");
        }
    }

    #[test]
    fn split_cuts_at_month_ends() {
        let pieces = split(t("2026-10-31T23:00:00Z"), t("2026-11-01T01:30:00Z"));
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].period.to_string(), "2026-10");
        assert_eq!(pieces[0].end, t("2026-11-01T00:00:00Z"));
        assert_eq!(pieces[1].start, t("2026-11-01T00:00:00Z"));
        assert_eq!(pieces[1].end, t("2026-11-01T01:30:00Z"));
        // Ending exactly at the boundary stays in one month.
        assert_eq!(
            split(t("2026-10-31T23:00:00Z"), t("2026-11-01T00:00:00Z")).len(),
            1
        );
        // Across three months.
        assert_eq!(
            split(t("2026-10-31T23:00:00Z"), t("2026-12-02T00:00:00Z")).len(),
            3
        );
        // An instant.
        let one = split(t("2026-11-01T00:00:00Z"), t("2026-11-01T00:00:00Z"));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].period.to_string(), "2026-11");
    }
}
