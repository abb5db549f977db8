//! Exact money: currencies, sums, and the price of a run, storage and egress.

mod common;

use chrono::Duration;
use common::*;
use meridian_events::money::{
    hours, seconds_between, ComputePricing, ComputeRate, EgressBand, EgressTariff, EgressTier,
    MoneyError,
};
use meridian_events::vocabulary::Allocation;
use meridian_events::{Currency, Money};

#[test]
fn currency_is_three_uppercase_letters() {
    assert_eq!("USD".parse::<Currency>().unwrap(), Currency::USD);
    for bad in ["usd", "US", "USDT", "U$D", ""] {
        assert!(bad.parse::<Currency>().is_err(), "{bad}");
    }
    assert_eq!(serde_json::to_string(&Currency::EUR).unwrap(), "\"EUR\"");
    assert!(serde_json::from_str::<Currency>("\"eur\"").is_err());
}

#[test]
fn sums_refuse_mixed_currencies() {
    let a = Money::new(dec("0.10"), Currency::USD);
    let b = Money::new(dec("0.20"), Currency::USD);
    assert_eq!(
        a.checked_add(&b).unwrap(),
        Money::new(dec("0.30"), Currency::USD)
    );
    assert_eq!(
        a.checked_add(&Money::zero(Currency::EUR)),
        Err(MoneyError::CurrencyMismatch {
            left: Currency::USD,
            right: Currency::EUR
        })
    );
}

#[test]
fn time_is_exact_to_the_microsecond_and_never_negative() {
    let start = at(1, 0);
    assert_eq!(
        seconds_between(start, start + Duration::milliseconds(1500)),
        dec("1.5")
    );
    assert_eq!(
        seconds_between(start + Duration::seconds(1), start),
        dec("0")
    );
    assert_eq!(hours(dec("5400")), dec("1.5"));
}

#[test]
fn instance_pricing_bills_nodes_by_the_hour() {
    let rate = ComputeRate {
        offer: "p5.48xlarge".into(),
        pricing: ComputePricing::Instance {
            per_instance_hour: dec("98.32"),
        },
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://aws.amazon.com/ec2/pricing/on-demand/".into(),
    };
    let two_nodes = Allocation {
        nodes: 2,
        ..gpu_allocation()
    };
    // 2 nodes × 98.32 × 90 min = 294.96
    let cost = rate.cost_between(&two_nodes, at(1, 0), at(2, 30)).unwrap();
    assert_eq!(cost, Money::new(dec("294.96"), usd()));
    // One second is an exact 3600th, to 28 digits, and not rounded to cents.
    let one_second = rate.cost(&gpu_allocation(), dec("1")).unwrap();
    assert_eq!(one_second.amount, dec("0.0273111111111111111111111111"));
}

#[test]
fn resource_pricing_adds_cores_memory_and_gpus() {
    let cpu_only = Allocation {
        nodes: 1,
        cpus: 4,
        memory_bytes: 16 << 30,
        gpus: None,
    };
    // 30 min × (4 × 0.01 + 16 × 0.002) = 0.5 × 0.072 = 0.036
    let cost = hpc_rate()
        .cost_between(&cpu_only, at(1, 0), at(1, 30))
        .unwrap();
    assert_eq!(cost, Money::new(dec("0.036"), usd()));
    // Half a GiB is priced as half.
    let half_gib = Allocation {
        cpus: 0,
        memory_bytes: 1 << 29,
        ..cpu_only
    };
    let cost = hpc_rate().cost(&half_gib, dec("3600")).unwrap();
    assert_eq!(cost.amount, dec("0.001"));
}

#[test]
fn storage_and_egress() {
    // 200 GiB for a day at 0.0001 per GiB-hour = 0.48
    let cost = storage_rate().cost(200 << 30, dec("86400")).unwrap();
    assert_eq!(cost, Money::new(dec("0.48"), usd()));
    let egress = EgressTariff {
        per_gb: dec("0.09"),
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://aws.amazon.com/s3/pricing/".into(),
        tiers: vec![],
    };
    assert_eq!(egress.cost(1_500_000_000).unwrap().amount, dec("0.135"));
}

fn tiered() -> EgressTariff {
    // First 100 GB free, then 0.09 up to 10 TB, then 0.085: the AWS shape.
    EgressTariff {
        per_gb: dec("0"),
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://aws.amazon.com/ec2/pricing/on-demand/".into(),
        tiers: vec![
            EgressTier {
                from_gb: dec("100"),
                per_gb: dec("0.09"),
            },
            EgressTier {
                from_gb: dec("10100"),
                per_gb: dec("0.085"),
            },
        ],
    }
}

#[test]
fn egress_bands_follow_the_months_cumulative_volume() {
    let t = tiered();
    t.validate().unwrap();
    // 30 GB after 80 GB this month: 20 GB free, 10 GB at 0.09.
    let bands = t.bands(dec("80"), dec("30")).unwrap();
    assert_eq!(
        bands,
        vec![
            EgressBand {
                band: 0,
                gb: dec("20"),
                per_gb: dec("0")
            },
            EgressBand {
                band: 1,
                gb: dec("10"),
                per_gb: dec("0.09")
            },
        ]
    );
    // Crossing two tier starts at once.
    let bands = t.bands(dec("50"), dec("10100")).unwrap();
    let gb: Vec<_> = bands.iter().map(|b| (b.band, b.gb)).collect();
    assert_eq!(gb, vec![(0, dec("50")), (1, dec("10000")), (2, dec("50"))]);
    // Well inside one band.
    assert_eq!(t.bands(dec("200"), dec("1.5")).unwrap().len(), 1);
    // A flat tariff is one band.
    let flat = EgressTariff::flat(dec("0.02"), usd(), at(0, 0), "x");
    assert_eq!(
        flat.bands(dec("1000000"), dec("3")).unwrap(),
        vec![EgressBand {
            band: 0,
            gb: dec("3"),
            per_gb: dec("0.02")
        }]
    );
}

#[test]
fn egress_tiers_are_validated() {
    let mut t = tiered();
    t.tiers[1].from_gb = dec("100");
    assert!(t.validate().is_err());
    let mut t = tiered();
    t.tiers[0].from_gb = dec("0");
    assert!(t.validate().is_err());
    let mut t = tiered();
    t.tiers[0].per_gb = dec("-0.01");
    assert!(t.validate().is_err());
}

#[test]
fn money_reads_from_an_amount_and_a_currency_code() {
    let m: meridian_events::Money = "99.50 EUR".parse().unwrap();
    assert_eq!(m.amount.to_string(), "99.50");
    assert_eq!(m.currency.to_string(), "EUR");
    for bad in ["99.50", "-5 USD", "5 usd", "five USD", ""] {
        let e = bad.parse::<meridian_events::Money>().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("expected an amount and a currency code such as \"500 USD\"; got {bad:?}")
        );
    }
}
