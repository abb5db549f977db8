//! Sizes, durations and money: what parses, to what, and that the canonical spelling parses
//! back to the same value.

use meridian_spec::{Money, MoneyError, Size, SizeError, Walltime, WalltimeError};
use rust_decimal::Decimal;

const KIB: u64 = 1024;
const MIB: u64 = KIB * 1024;
const GIB: u64 = MIB * 1024;
const TIB: u64 = GIB * 1024;

fn size(s: &str) -> u64 {
    s.parse::<Size>()
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .bytes()
}

fn secs(s: &str) -> u64 {
    s.parse::<Walltime>()
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .secs()
}

#[test]
fn sizes_parse() {
    assert_eq!(size("512B"), 512);
    assert_eq!(size("16GiB"), 16 * GIB);
    assert_eq!(size("500MB"), 500_000_000);
    assert_eq!(size("1.5TiB"), 3 * TIB / 2);
    assert_eq!(size("2KB"), 2_000);
    assert_eq!(size("2KiB"), 2_048);
    assert_eq!(size("1PB"), 1_000_000_000_000_000);
    assert_eq!(size("1PiB"), 1 << 50);
    assert_eq!(size("0.5KiB"), 512);
    assert_eq!(size("1.250KB"), 1_250);
    assert_eq!(size("007MiB"), 7 * MIB);
    assert_eq!(size("0B"), 0);
    assert_eq!(size("16PiB"), 16 << 50);
    assert_eq!(size("18446744073709551615B"), u64::MAX);
}

#[test]
fn sizes_reject() {
    let err = |s: &str| s.parse::<Size>().unwrap_err();
    assert_eq!(err(""), SizeError::Empty);
    assert_eq!(err("16"), SizeError::MissingUnit);
    assert_eq!(err("16gb"), SizeError::UnknownUnit("gb".into()));
    assert_eq!(err("16 GiB"), SizeError::Space);
    assert_eq!(err("GiB"), SizeError::BadNumber("GiB".into()));
    assert_eq!(err("-1GiB"), SizeError::BadNumber("-1GiB".into()));
    assert_eq!(err("1.GiB"), SizeError::BadNumber("1.".into()));
    assert_eq!(err(".5GiB"), SizeError::BadNumber(".5".into()));
    assert_eq!(err("1.2.3GiB"), SizeError::BadNumber("1.2.3".into()));
    assert_eq!(err("0.3B"), SizeError::Fractional);
    assert_eq!(err("1.0001KB"), SizeError::Fractional);
    assert_eq!(err("18446744073709551616B"), SizeError::TooLarge);
    assert_eq!(err("16385PiB"), SizeError::TooLarge);
    assert_eq!(err("99999999999999999999999999PiB"), SizeError::TooLarge);
    assert_eq!(err("1.000000000000000000000001B"), SizeError::Fractional);
}

#[test]
fn sizes_are_written_canonically() {
    let cases = [
        (16 * GIB, "16GiB"),
        (500_000_000, "500MB"),
        (123, "123B"),
        (0, "0B"),
        (3 * TIB / 2, "1536GiB"),
        (1_024_000, "1000KiB"),
        (1_000_000_000_000, "1TB"),
        (2 * (1 << 50), "2PiB"),
        (u64::MAX, "18446744073709551615B"),
    ];
    for (bytes, text) in cases {
        assert_eq!(Size::from_bytes(bytes).to_string(), text);
        assert_eq!(size(text), bytes);
    }
    assert_eq!(
        serde_json::to_string(&Size::from_bytes(16 * GIB)).unwrap(),
        "\"16GiB\""
    );
    let back: Size = serde_json::from_str("\"1.5TiB\"").unwrap();
    assert_eq!(back.bytes(), 3 * TIB / 2);
    assert!(serde_json::from_str::<Size>("\"16\"").is_err());
}

/// A small deterministic generator, so the property loops need no extra crates.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }
}

#[test]
fn size_round_trip_property() {
    let mut rng = Lcg(7);
    let multipliers = [
        1,
        1_000,
        1_024,
        1_000_000,
        MIB,
        1_000_000_000,
        GIB,
        TIB,
        1 << 50,
    ];
    for _ in 0..20_000 {
        let m = multipliers[(rng.next() % multipliers.len() as u64) as usize];
        let bytes = match rng.next() % 3 {
            0 => rng.next(),
            1 => (rng.next() % 100_000).saturating_mul(m),
            _ => rng.next() % 5_000,
        };
        let text = Size::from_bytes(bytes).to_string();
        assert_eq!(size(&text), bytes, "{text}");
        // The canonical form is a fixed point.
        assert_eq!(Size::from_bytes(size(&text)).to_string(), text);
        // The number part is an integer: the unit is one that divides exactly.
        let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{text}");
    }
}

#[test]
fn walltimes_parse() {
    assert_eq!(secs("90s"), 90);
    assert_eq!(secs("30m"), 1_800);
    assert_eq!(secs("2h30m"), 9_000);
    assert_eq!(secs("1d"), 86_400);
    assert_eq!(secs("1d12h"), 129_600);
    assert_eq!(secs("1d2h3m4s"), 93_784);
    assert_eq!(secs("90m"), 5_400);
    assert_eq!(secs("0s"), 0);
}

#[test]
fn walltimes_reject() {
    let err = |s: &str| s.parse::<Walltime>().unwrap_err();
    assert_eq!(err(""), WalltimeError::Empty);
    assert_eq!(err("90"), WalltimeError::MissingUnit);
    assert_eq!(err("30m2h"), WalltimeError::Order);
    assert_eq!(err("1h1h"), WalltimeError::Order);
    assert_eq!(err("1.5h"), WalltimeError::Fractional);
    assert_eq!(err("90 minutes"), WalltimeError::Space);
    assert_eq!(err("2hours"), WalltimeError::UnknownUnit("hours".into()));
    assert_eq!(err("1w"), WalltimeError::UnknownUnit("w".into()));
    assert_eq!(err("h"), WalltimeError::Malformed);
    assert_eq!(err("-1h"), WalltimeError::Malformed);
    assert_eq!(err("1h-"), WalltimeError::Malformed);
    assert_eq!(err("99999999999999999999s"), WalltimeError::TooLarge);
    assert_eq!(err("999999999999999999d"), WalltimeError::TooLarge);
}

#[test]
fn walltimes_are_written_canonically() {
    let cases = [
        (90, "1m30s"),
        (9_000, "2h30m"),
        (86_400, "1d"),
        (129_600, "1d12h"),
        (0, "0s"),
        (59, "59s"),
        (86_401, "1d1s"),
    ];
    for (s, text) in cases {
        assert_eq!(Walltime::from_secs(s).to_string(), text);
        assert_eq!(secs(text), s);
    }
    let mut rng = Lcg(11);
    for _ in 0..20_000 {
        let s = match rng.next() % 2 {
            0 => rng.next(),
            _ => rng.next() % 1_000_000,
        };
        let text = Walltime::from_secs(s).to_string();
        assert_eq!(secs(&text), s, "{text}");
    }
    assert_eq!(
        serde_json::to_string(&Walltime::from_secs(90)).unwrap(),
        "\"1m30s\""
    );
}

#[test]
fn money() {
    let m: Money = "500 USD".parse().unwrap();
    assert_eq!(m.amount, Decimal::from(500));
    assert_eq!(m.currency, "USD");
    assert_eq!(m.to_string(), "500 USD");
    let m: Money = "99.50 EUR".parse().unwrap();
    assert_eq!(m.to_string(), "99.50 EUR");
    assert_eq!(m.amount, Decimal::new(995, 1));
    // Equal by value, whatever the scale it was written with.
    assert_eq!(
        "500 USD".parse::<Money>().unwrap(),
        "500.00 USD".parse::<Money>().unwrap()
    );
    // Exact: no float ever sees the amount.
    let m: Money = "0.1 USD".parse().unwrap();
    assert_eq!(m.amount + m.amount + m.amount, Decimal::new(3, 1));

    let err = |s: &str| s.parse::<Money>().unwrap_err();
    assert_eq!(err("500"), MoneyError::MissingCurrency);
    assert_eq!(err("USD"), MoneyError::Format);
    assert_eq!(err("500USD"), MoneyError::Format);
    // Split at the first space, so the currency is " USD", which is what is wrong.
    assert_eq!(err("500  USD"), MoneyError::BadCurrency(" USD".into()));
    assert_eq!(err("0 USD"), MoneyError::NotPositive);
    assert_eq!(err("0.00 USD"), MoneyError::NotPositive);
    assert_eq!(err("-5 USD"), MoneyError::BadAmount("-5".into()));
    assert_eq!(err("1e3 USD"), MoneyError::BadAmount("1e3".into()));
    assert_eq!(err("1_000 USD"), MoneyError::BadAmount("1_000".into()));
    assert_eq!(err("5. USD"), MoneyError::BadAmount("5.".into()));
    assert_eq!(err("500 usd"), MoneyError::BadCurrency("usd".into()));
    assert_eq!(
        err("500 DOLLARS"),
        MoneyError::BadCurrency("DOLLARS".into())
    );
    assert_eq!(
        err("99999999999999999999999999999999999 USD"),
        MoneyError::TooLarge
    );
    assert_eq!(
        serde_json::to_string(&"12.5 GBP".parse::<Money>().unwrap()).unwrap(),
        "\"12.5 GBP\""
    );
}
