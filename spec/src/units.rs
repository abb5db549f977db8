//! Quantities a workflow speaks in: sizes, durations and money. Each has exactly one canonical
//! spelling, which is what it serializes to, so a document that goes through Meridian and back
//! still parses to the same value.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

// ---------------------------------------------------------------------------------------------
// Size
// ---------------------------------------------------------------------------------------------

/// An amount of memory or storage, in whole bytes.
///
/// Written as a number and a unit with no space between: `512B`, `500MB`, `16GiB`, `1.5TiB`.
/// Decimal units (`KB`, `MB`, `GB`, `TB`, `PB`) are powers of 1000 and binary units (`KiB`,
/// `MiB`, `GiB`, `TiB`, `PiB`) powers of 1024. A fraction is allowed as long as the result is
/// a whole number of bytes. The canonical spelling (what [`Display`](fmt::Display) and
/// serialization produce) uses the largest unit that gives a whole number, binary before
/// decimal: `1.5TiB` is written back as `1536GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(u64);

/// Units by decreasing multiplier; at equal prefixes the binary one is larger, which is what
/// makes the canonical form prefer binary units.
const SIZE_UNITS: [(&str, u64); 11] = [
    ("PiB", 1 << 50),
    ("PB", 1_000_000_000_000_000),
    ("TiB", 1 << 40),
    ("TB", 1_000_000_000_000),
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("KB", 1_000),
    ("B", 1),
];

/// The accepted size units, as listed in error messages.
pub const SIZE_UNITS_TEXT: &str = "B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB";

/// The JSON Schema pattern of a size.
pub const SIZE_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(B|KB|MB|GB|TB|PB|KiB|MiB|GiB|TiB|PiB)$";

/// Longest fraction accepted in a size; more digits than this can never be needed to name a
/// whole number of bytes in a realistic quantity, and the bound keeps the arithmetic in `u128`.
const MAX_FRACTION_DIGITS: usize = 20;

/// Why a string is not a [`Size`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("a size needs a number and a unit, such as 16GiB")]
    Empty,
    #[error("a unit is required; accepted units are {SIZE_UNITS_TEXT}")]
    MissingUnit,
    #[error("write it without spaces, such as 16GiB")]
    Space,
    #[error("unknown unit {0:?}; accepted units are {SIZE_UNITS_TEXT}")]
    UnknownUnit(String),
    #[error("{0:?} is not a number; write digits with an optional fraction, such as 16 or 1.5")]
    BadNumber(String),
    #[error("it is not a whole number of bytes")]
    Fractional,
    #[error("it is larger than the maximum of {} bytes", u64::MAX)]
    TooLarge,
}

impl Size {
    pub const fn from_bytes(bytes: u64) -> Self {
        Size(bytes)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, SizeError> {
        if s.is_empty() {
            return Err(SizeError::Empty);
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        if number.is_empty() {
            return Err(SizeError::BadNumber(s.to_string()));
        }
        if unit.is_empty() {
            return Err(SizeError::MissingUnit);
        }
        if unit.starts_with(char::is_whitespace) {
            return Err(SizeError::Space);
        }
        let multiplier = SIZE_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, m)| *m)
            .ok_or_else(|| SizeError::UnknownUnit(unit.to_string()))?;
        let (int, frac) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        let bad = || SizeError::BadNumber(number.to_string());
        if int.is_empty() || (number.contains('.') && frac.is_empty()) || frac.contains('.') {
            return Err(bad());
        }
        // Exact arithmetic: int × multiplier + frac × multiplier / 10^digits, in u128.
        let int = int.trim_start_matches('0');
        if int.len() > 20 {
            return Err(SizeError::TooLarge);
        }
        let frac = frac.trim_end_matches('0');
        if frac.len() > MAX_FRACTION_DIGITS {
            return Err(SizeError::Fractional);
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let whole = int
            .checked_mul(u128::from(multiplier))
            .ok_or(SizeError::TooLarge)?;
        let part = if frac.is_empty() {
            0
        } else {
            let numerator: u128 = frac.parse().map_err(|_| bad())?;
            let scaled = numerator * u128::from(multiplier);
            let denominator = 10u128.pow(frac.len() as u32);
            if !scaled.is_multiple_of(denominator) {
                return Err(SizeError::Fractional);
            }
            scaled / denominator
        };
        let total = whole.checked_add(part).ok_or(SizeError::TooLarge)?;
        u64::try_from(total)
            .map(Size)
            .map_err(|_| SizeError::TooLarge)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0B");
        }
        // `B` divides everything, so the search always ends there at the latest.
        let (unit, multiplier) = SIZE_UNITS
            .iter()
            .find(|(_, m)| self.0.is_multiple_of(*m))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{}", self.0 / multiplier, unit)
    }
}

// ---------------------------------------------------------------------------------------------
// Walltime
// ---------------------------------------------------------------------------------------------

/// A duration in whole seconds, such as a job's walltime limit.
///
/// Written with the units `d`, `h`, `m` and `s`, each at most once and in that order: `90s`,
/// `30m`, `2h30m`, `1d`, `1d12h`. A component may exceed its natural range (`90m` is fine).
/// The canonical spelling splits the total into days, hours, minutes and seconds and leaves
/// out the zeros: `90s` is written back as `1m30s`, and zero as `0s`.
///
/// The parser accepts zero; the workflow validator is what insists on a positive walltime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Walltime(u64);

const WALLTIME_UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];

/// The accepted duration units, as listed in error messages.
pub const WALLTIME_UNITS_TEXT: &str = "d, h, m, s";

/// The JSON Schema pattern of a duration: at least one component, units in order.
pub const WALLTIME_PATTERN: &str = "^(?:[0-9]+d(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?|[0-9]+h(?:[0-9]+m)?(?:[0-9]+s)?|[0-9]+m(?:[0-9]+s)?|[0-9]+s)$";

/// Why a string is not a [`Walltime`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalltimeError {
    #[error("a duration needs a number and a unit, such as 30m")]
    Empty,
    #[error("a unit is required; accepted units are {WALLTIME_UNITS_TEXT}, as in 2h30m")]
    MissingUnit,
    #[error("unknown unit {0:?}; accepted units are {WALLTIME_UNITS_TEXT}, as in 2h30m")]
    UnknownUnit(String),
    #[error("durations take whole numbers; write 1h30m rather than 1.5h")]
    Fractional,
    #[error("write it without spaces, such as 1h30m")]
    Space,
    #[error("write whole numbers with units {WALLTIME_UNITS_TEXT}, such as 2h30m")]
    Malformed,
    #[error("units must appear at most once each, in the order d, h, m, s, as in 1d12h")]
    Order,
    #[error("it is longer than the maximum of {} seconds", u64::MAX)]
    TooLarge,
}

impl Walltime {
    pub const fn from_secs(secs: u64) -> Self {
        Walltime(secs)
    }

    pub const fn secs(self) -> u64 {
        self.0
    }
}

impl FromStr for Walltime {
    type Err = WalltimeError;

    fn from_str(s: &str) -> Result<Self, WalltimeError> {
        if s.is_empty() {
            return Err(WalltimeError::Empty);
        }
        let mut rest = s;
        let mut total: u64 = 0;
        // Index into WALLTIME_UNITS of the next unit allowed; enforces order and uniqueness.
        let mut next_unit = 0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(WalltimeError::Malformed);
            }
            let (number, tail) = rest.split_at(digits);
            if tail.starts_with('.') {
                return Err(WalltimeError::Fractional);
            }
            if tail.starts_with(char::is_whitespace) {
                return Err(WalltimeError::Space);
            }
            let letters = tail
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(letters);
            if unit.is_empty() {
                return Err(if tail.is_empty() {
                    WalltimeError::MissingUnit
                } else {
                    WalltimeError::Malformed
                });
            }
            let position = WALLTIME_UNITS
                .iter()
                .position(|(c, _)| unit.len() == 1 && unit.starts_with(*c))
                .ok_or_else(|| WalltimeError::UnknownUnit(unit.to_string()))?;
            if position < next_unit {
                return Err(WalltimeError::Order);
            }
            next_unit = position + 1;
            let number: u64 = number.parse().map_err(|_| WalltimeError::TooLarge)?;
            total = number
                .checked_mul(WALLTIME_UNITS[position].1)
                .and_then(|secs| total.checked_add(secs))
                .ok_or(WalltimeError::TooLarge)?;
            rest = tail;
        }
        Ok(Walltime(total))
    }
}

impl fmt::Display for Walltime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0s");
        }
        let mut left = self.0;
        for (unit, secs) in WALLTIME_UNITS {
            let n = left / secs;
            if n > 0 {
                write!(f, "{n}{unit}")?;
                left %= secs;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Money
// ---------------------------------------------------------------------------------------------

/// An exact amount of money in one currency, written `500 USD` or `99.50 EUR`.
///
/// The amount is a [`Decimal`] — never a float — and must be greater than zero; the currency
/// is three capital letters, shaped like an ISO 4217 code. The amount keeps the scale it was
/// written with (`99.50` stays `99.50`), and equality compares the value (`500 USD` equals
/// `500.00 USD`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Money {
    pub amount: Decimal,
    pub currency: String,
}

/// The JSON Schema pattern of an amount of money.
pub const MONEY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)? [A-Z]{3}$";

/// Why a string is not [`Money`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("write an amount, one space and a currency code, such as \"500 USD\"")]
    Format,
    #[error("a currency code is required, such as USD")]
    MissingCurrency,
    #[error(
        "{0:?} is not an amount; write digits with an optional fraction, such as 500 or 99.50"
    )]
    BadAmount(String),
    #[error("the amount must be greater than zero")]
    NotPositive,
    #[error("the amount has too many digits")]
    TooLarge,
    #[error("{0:?} is not a currency code; use three capital letters such as USD, EUR or GBP")]
    BadCurrency(String),
}

impl Money {
    pub fn new(amount: Decimal, currency: impl Into<String>) -> Self {
        Money {
            amount,
            currency: currency.into(),
        }
    }
}

impl FromStr for Money {
    type Err = MoneyError;

    fn from_str(s: &str) -> Result<Self, MoneyError> {
        let Some((amount, currency)) = s.split_once(' ') else {
            let is_amount = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            return Err(if is_amount {
                MoneyError::MissingCurrency
            } else {
                MoneyError::Format
            });
        };
        if amount.is_empty() || currency.is_empty() {
            return Err(MoneyError::Format);
        }
        // Checked by hand because Decimal's parser also takes signs, underscores and exponents.
        let (int, frac) = amount.split_once('.').unwrap_or((amount, "0"));
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(int) || !digits(frac) {
            return Err(MoneyError::BadAmount(amount.to_string()));
        }
        let value = Decimal::from_str_exact(amount).map_err(|_| MoneyError::TooLarge)?;
        if value <= Decimal::ZERO {
            return Err(MoneyError::NotPositive);
        }
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(MoneyError::BadCurrency(currency.to_string()));
        }
        Ok(Money::new(value, currency))
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount, self.currency)
    }
}

// ---------------------------------------------------------------------------------------------
// Serde and JSON Schema: all three travel as their canonical strings.
// ---------------------------------------------------------------------------------------------

macro_rules! string_form {
    ($ty:ident, $pattern:expr, $description:expr, [$($example:expr),*]) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = Cow::<str>::deserialize(deserializer)?;
                text.parse().map_err(de::Error::custom)
            }
        }

        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "type": "string",
                    "pattern": $pattern,
                    "description": $description,
                    "examples": [$($example),*],
                })
            }
        }
    };
}

string_form!(
    Size,
    SIZE_PATTERN,
    "A size in whole bytes: a number and a unit, B, KB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024).",
    ["16GiB", "500MB", "1.5TiB"]
);
string_form!(
    Walltime,
    WALLTIME_PATTERN,
    "A duration in whole seconds, with units d, h, m, s, each at most once and in that order.",
    ["30m", "2h30m", "1d12h"]
);
string_form!(
    Money,
    MONEY_PATTERN,
    "An amount greater than zero and a three-letter currency code.",
    ["500 USD", "99.50 EUR"]
);
