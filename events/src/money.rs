//! Money and the prices events capture. Amounts are `rust_decimal::Decimal`, serialized
//! as strings, never `f64`: a bill replayed in ten years must come out the same to the
//! last digit. Nothing here rounds; rounding happens once, at the export.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::vocabulary::Allocation;

pub const SECONDS_PER_HOUR: u64 = 3_600;
pub const BYTES_PER_GIB: u64 = 1 << 30;
/// Egress is priced per decimal gigabyte, as clouds publish it.
pub const BYTES_PER_GB: u64 = 1_000_000_000;

/// An ISO 4217-shaped currency code: exactly three ASCII uppercase letters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency([u8; 3]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid currency {0:?}: expected three uppercase letters such as USD")]
pub struct InvalidCurrency(pub String);

impl Currency {
    pub const USD: Currency = Currency(*b"USD");
    pub const EUR: Currency = Currency(*b"EUR");
    pub const GBP: Currency = Currency(*b"GBP");

    pub fn new(code: &str) -> Result<Currency, InvalidCurrency> {
        match code.as_bytes() {
            &[a, b, c] if [a, b, c].iter().all(u8::is_ascii_uppercase) => Ok(Currency([a, b, c])),
            _ => Err(InvalidCurrency(code.to_owned())),
        }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII uppercase letters get in (see `new`).
        std::str::from_utf8(&self.0).expect("currency codes are ASCII")
    }
}

impl FromStr for Currency {
    type Err = InvalidCurrency;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Currency::new(s)
    }
}

impl TryFrom<String> for Currency {
    type Error = InvalidCurrency;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Currency::new(&s)
    }
}

impl From<Currency> for String {
    fn from(c: Currency) -> String {
        c.as_str().to_owned()
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Currency({})", self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("cannot combine {left} with {right}")]
    CurrencyMismatch { left: Currency, right: Currency },
    #[error("amount out of the range of a decimal")]
    Overflow,
}

/// An exact amount in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Money {
    pub amount: Decimal,
    pub currency: Currency,
}

impl Money {
    pub fn new(amount: Decimal, currency: Currency) -> Money {
        Money { amount, currency }
    }

    pub fn zero(currency: Currency) -> Money {
        Money::new(Decimal::ZERO, currency)
    }

    pub fn checked_add(&self, other: &Money) -> Result<Money, MoneyError> {
        if self.currency != other.currency {
            return Err(MoneyError::CurrencyMismatch {
                left: self.currency,
                right: other.currency,
            });
        }
        let amount = self
            .amount
            .checked_add(other.amount)
            .ok_or(MoneyError::Overflow)?;
        Ok(Money::new(amount, self.currency))
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount, self.currency)
    }
}

/// Why a text is not an amount of money.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected an amount and a currency code such as \"500 USD\"; got {0:?}")]
pub struct InvalidMoney(pub String);

/// `"500 USD"`, `"99.50 EUR"`: a non-negative decimal, one space, a currency code.
impl FromStr for Money {
    type Err = InvalidMoney;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidMoney(s.to_string());
        let (amount, currency) = s.trim().split_once(' ').ok_or_else(invalid)?;
        let amount = Decimal::from_str(amount)
            .ok()
            .filter(|a| !a.is_sign_negative())
            .ok_or_else(invalid)?;
        let currency = Currency::from_str(currency.trim()).map_err(|_| invalid())?;
        Ok(Money::new(amount, currency))
    }
}

/// Seconds → hours by one decimal division (28 significant digits); no rounding to cents.
pub fn hours(seconds: Decimal) -> Decimal {
    seconds / Decimal::from(SECONDS_PER_HOUR)
}

/// The seconds from `start` to `end`, exact to the microsecond; zero when `end` is not
/// after `start` (a clock skew must not produce a credit).
pub fn seconds_between(start: DateTime<Utc>, end: DateTime<Utc>) -> Decimal {
    // `num_microseconds` only overflows beyond ±292,000 years.
    let micros = (end - start).num_microseconds().unwrap_or(i64::MAX);
    if micros <= 0 {
        Decimal::ZERO
    } else {
        Decimal::new(micros, 6)
    }
}

/// `numerator / denominator` with overflow reported instead of panicking.
fn div(numerator: Decimal, denominator: u64) -> Result<Decimal, MoneyError> {
    numerator
        .checked_div(Decimal::from(denominator))
        .ok_or(MoneyError::Overflow)
}

fn mul(a: Decimal, b: impl Into<Decimal>) -> Result<Decimal, MoneyError> {
    a.checked_mul(b.into()).ok_or(MoneyError::Overflow)
}

fn add(a: Decimal, b: Decimal) -> Result<Decimal, MoneyError> {
    a.checked_add(b).ok_or(MoneyError::Overflow)
}

/// How a compute offering is priced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "basis", rename_all = "snake_case")]
pub enum ComputePricing {
    /// Clouds: a price per instance (node) per hour, whatever is on it.
    Instance { per_instance_hour: Decimal },
    /// HPC and Kubernetes: cores, memory and GPUs each priced per hour.
    Resource {
        per_core_hour: Decimal,
        per_gib_memory_hour: Decimal,
        per_gpu_hour: Decimal,
    },
}

/// The compute price in force at a decision, captured whole so that later price changes
/// never rewrite what a run cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeRate {
    /// The site's name for what is priced: an instance type, a partition, a node class.
    pub offer: String,
    pub pricing: ComputePricing,
    pub currency: Currency,
    pub effective_from: DateTime<Utc>,
    /// Where the price came from: a URL or a short text (e.g. "grant agreement 2025-03").
    pub source: String,
}

impl ComputePricing {
    /// What `allocation` costs for `seconds` at these prices, in their currency.
    pub fn amount(&self, allocation: &Allocation, seconds: Decimal) -> Result<Decimal, MoneyError> {
        // Multiply everything first and divide once, so the only inexact step is one
        // division at 28 significant digits.
        Ok(match self {
            ComputePricing::Instance { per_instance_hour } => {
                let n = mul(mul(*per_instance_hour, allocation.nodes)?, seconds)?;
                div(n, SECONDS_PER_HOUR)?
            }
            ComputePricing::Resource {
                per_core_hour,
                per_gib_memory_hour,
                per_gpu_hour,
            } => {
                let gpus = allocation.gpus.as_ref().map_or(0, |g| g.count);
                let per_gib_units = add(
                    mul(*per_core_hour, allocation.cpus)?,
                    mul(*per_gpu_hour, gpus)?,
                )?;
                let per_hour_times_gib = add(
                    mul(per_gib_units, BYTES_PER_GIB)?,
                    mul(*per_gib_memory_hour, allocation.memory_bytes)?,
                )?;
                div(
                    mul(per_hour_times_gib, seconds)?,
                    BYTES_PER_GIB * SECONDS_PER_HOUR,
                )?
            }
        })
    }
}

impl ComputeRate {
    /// What `allocation` costs for `seconds` at this rate.
    pub fn cost(&self, allocation: &Allocation, seconds: Decimal) -> Result<Money, MoneyError> {
        Ok(Money::new(
            self.pricing.amount(allocation, seconds)?,
            self.currency,
        ))
    }

    /// What `allocation` costs from `started_at` to `ended_at` at this rate.
    pub fn cost_between(
        &self,
        allocation: &Allocation,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
    ) -> Result<Money, MoneyError> {
        self.cost(allocation, seconds_between(started_at, ended_at))
    }
}

/// Storage (volumes, caches) per GiB-hour, captured like [`ComputeRate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageRate {
    pub per_gib_hour: Decimal,
    pub currency: Currency,
    pub effective_from: DateTime<Utc>,
    pub source: String,
}

impl StorageRate {
    /// `bytes` held for `seconds`: [`gib_hours`] at the rate, as the ledger bills it and
    /// placement estimates it.
    pub fn cost(&self, bytes: u64, seconds: Decimal) -> Result<Money, MoneyError> {
        Ok(Money::new(
            mul(gib_hours(bytes, seconds)?, self.per_gib_hour)?,
            self.currency,
        ))
    }
}

/// GiB-hours of `bytes` held for `seconds`: the one storage quantity every bill line and
/// estimate is priced on (one division, by 2^30 × 3600).
pub fn gib_hours(bytes: u64, seconds: Decimal) -> Result<Decimal, MoneyError> {
    div(
        mul(Decimal::from(bytes), seconds)?,
        BYTES_PER_GIB * SECONDS_PER_HOUR,
    )
}

/// Egress per decimal GB (10^9 bytes) leaving a site or region, at the source's tariff.
///
/// Without `tiers` every GB costs `per_gb`. With tiers, `per_gb` is the price of the
/// first band (from 0 GB) and each tier sets the price from its `from_gb` on, counted in
/// the tenant's cumulative volume out of that source in the calendar month (UTC):
/// AWS's "first 100 GB free, then 0.09" is `per_gb: 0` and one tier
/// `{from_gb: 100, per_gb: 0.09}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressTariff {
    pub per_gb: Decimal,
    pub currency: Currency,
    pub effective_from: DateTime<Utc>,
    pub source: String,
    /// Volume tiers, `from_gb` strictly increasing and positive; empty: a flat price.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<EgressTier>,
}

/// From `from_gb` GB of the month's cumulative volume on, each GB costs `per_gb`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressTier {
    pub from_gb: Decimal,
    pub per_gb: Decimal,
}

/// One price band of an egress charge: `gb` GB at `per_gb`, band 0 being `per_gb` of
/// the tariff itself and band `n` its tier `n - 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressBand {
    pub band: usize,
    pub gb: Decimal,
    pub per_gb: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid egress tiers: {0}")]
pub struct InvalidTiers(pub String);

impl EgressTariff {
    /// A flat tariff: `per_gb` for every GB.
    pub fn flat(
        per_gb: Decimal,
        currency: Currency,
        effective_from: DateTime<Utc>,
        source: impl Into<String>,
    ) -> EgressTariff {
        EgressTariff {
            per_gb,
            currency,
            effective_from,
            source: source.into(),
            tiers: Vec::new(),
        }
    }

    /// The flat cost of `bytes` at `per_gb`, ignoring tiers (what one transfer costs
    /// when it is the month's first).
    pub fn cost(&self, bytes: u64) -> Result<Money, MoneyError> {
        Ok(Money::new(
            div(mul(self.per_gb, bytes)?, BYTES_PER_GB)?,
            self.currency,
        ))
    }

    /// Prices must not be negative, and tiers must start above 0 GB and grow strictly.
    pub fn validate(&self) -> Result<(), InvalidTiers> {
        if self.per_gb.is_sign_negative() {
            return Err(InvalidTiers(format!("per_gb {} is negative", self.per_gb)));
        }
        let mut last = Decimal::ZERO;
        for (i, tier) in self.tiers.iter().enumerate() {
            if tier.from_gb <= last {
                return Err(InvalidTiers(format!(
                    "tier {i} starts at {} GB, not above {last} GB",
                    tier.from_gb
                )));
            }
            if tier.per_gb.is_sign_negative() {
                return Err(InvalidTiers(format!(
                    "tier {i} costs {} per GB, a negative price",
                    tier.per_gb
                )));
            }
            last = tier.from_gb;
        }
        Ok(())
    }

    /// What `gb` GB cost when `already_gb` GB had left the same source this month: the
    /// sum over the bands they fall in.
    pub fn cost_after(&self, already_gb: Decimal, gb: Decimal) -> Result<Decimal, MoneyError> {
        self.bands(already_gb, gb)?
            .iter()
            .try_fold(Decimal::ZERO, |sum, b| add(sum, mul(b.gb, b.per_gb)?))
    }

    /// Splits `gb` GB moved when `already_gb` GB had left the same source this month
    /// into the bands it falls in, lowest first; bands with nothing in them are left out.
    pub fn bands(&self, already_gb: Decimal, gb: Decimal) -> Result<Vec<EgressBand>, MoneyError> {
        let end = add(already_gb, gb)?;
        let mut out = Vec::new();
        let starts = std::iter::once((Decimal::ZERO, self.per_gb))
            .chain(self.tiers.iter().map(|t| (t.from_gb, t.per_gb)));
        let mut bands: Vec<(Decimal, Decimal)> = starts.collect();
        bands.sort_by_key(|b| b.0);
        for (i, (from, per_gb)) in bands.iter().enumerate() {
            let to = bands.get(i + 1).map(|b| b.0);
            let lo = (*from).max(already_gb);
            let hi = to.map_or(end, |t| t.min(end));
            if hi > lo {
                out.push(EgressBand {
                    band: i,
                    gb: hi - lo,
                    per_gb: *per_gb,
                });
            }
        }
        Ok(out)
    }
}

/// One priced compute offering of a site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeOffer {
    pub offer: String,
    pub pricing: ComputePricing,
}

/// A site's whole price list at one moment: the one catalogue rates are taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceSheet {
    pub currency: Currency,
    pub effective_from: DateTime<Utc>,
    pub source: String,
    pub compute: Vec<ComputeOffer>,
    pub storage_per_gib_hour: Decimal,
    /// Data leaving the site, per decimal GB: to the internet, and to any destination
    /// when `egress_by_destination` is absent.
    pub egress_per_gb: Decimal,
    /// Cheaper prices within the site's region or provider, where the site has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_by_destination: Option<EgressByDestination>,
    /// Internet egress by monthly volume: from each tier's `from_gb` of the tenant's
    /// month so far on, `egress_per_gb` gives way to the tier's price.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_tiers: Vec<EgressTier>,
}

/// Egress prices per decimal GB by where the bytes go inside the provider; these are flat
/// (providers tier only internet egress by volume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressByDestination {
    /// Another site in the same region.
    pub same_region: Decimal,
    /// The same provider (site kind) in another region.
    pub other_region: Decimal,
}

/// Where copied bytes go, as egress prices tell destinations apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    SameRegion,
    OtherRegion,
    Internet,
}

impl PriceSheet {
    /// The price per GB of bytes leaving the site for `destination`.
    pub fn egress_per_gb_to(&self, destination: Destination) -> Decimal {
        match (&self.egress_by_destination, destination) {
            (Some(by), Destination::SameRegion) => by.same_region,
            (Some(by), Destination::OtherRegion) => by.other_region,
            _ => self.egress_per_gb,
        }
    }

    /// The rate of offer `offer`, stamped with this sheet's currency, date and source.
    pub fn compute_rate(&self, offer: &str) -> Option<ComputeRate> {
        self.compute
            .iter()
            .find(|o| o.offer == offer)
            .map(|o| ComputeRate {
                offer: o.offer.clone(),
                pricing: o.pricing.clone(),
                currency: self.currency,
                effective_from: self.effective_from,
                source: self.source.clone(),
            })
    }

    pub fn storage_rate(&self) -> StorageRate {
        StorageRate {
            per_gib_hour: self.storage_per_gib_hour,
            currency: self.currency,
            effective_from: self.effective_from,
            source: self.source.clone(),
        }
    }

    /// The tariff for bytes leaving the site to the internet, with its volume tiers.
    pub fn egress_tariff(&self) -> EgressTariff {
        self.egress_tariff_to(Destination::Internet)
    }

    /// The tariff for bytes leaving the site for `destination`: internet egress carries
    /// the sheet's volume tiers, the provider's own classes are flat.
    pub fn egress_tariff_to(&self, destination: Destination) -> EgressTariff {
        let mut tariff = EgressTariff::flat(
            self.egress_per_gb_to(destination),
            self.currency,
            self.effective_from,
            self.source.clone(),
        );
        let internet = !matches!(
            (&self.egress_by_destination, destination),
            (Some(_), Destination::SameRegion | Destination::OtherRegion)
        );
        if internet {
            tariff.tiers = self.egress_tiers.clone();
        }
        tariff
    }
}
