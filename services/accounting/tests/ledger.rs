//! The ledger against hand-computed amounts, on SQLite and on the machine's PostgreSQL
//! (each scenario runs on both), with events appended to a real (SQLite) log.

mod common;

use std::str::FromStr;

use common::*;
use meridian_accounting::{bill, snapshot, tenant_bill, BillLine, Ledger, Period};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms, Meter};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::vocabulary::Location;
use meridian_events::{Allocation, Currency, FailureReason, SiteKind};
use meridian_store::{catch_up, Projection, Store};
use rust_decimal::Decimal;
use uuid::Uuid;

macro_rules! on_both {
    ($scenario:ident, $sqlite:ident, $postgres:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            let (db, store) = Db::sqlite().await;
            $scenario(&store).await;
            db.finish().await;
        }

        #[tokio::test]
        async fn $postgres() {
            let (db, store) = Db::postgres().await;
            $scenario(&store).await;
            db.finish().await;
        }
    };
}

fn amount(lines: &[&BillLine]) -> Decimal {
    lines.iter().map(|l| d(&l.amount)).sum()
}

/// Every line keeps FOCUS's identities exactly, before any rounding.
fn check_identities(lines: &[BillLine]) {
    for l in lines {
        assert_eq!(
            d(&l.list_cost),
            d(&l.list_unit_price) * d(&l.quantity),
            "{l:#?}"
        );
        assert_eq!(
            d(&l.contracted_cost),
            d(&l.contracted_unit_price) * d(&l.quantity),
            "{l:#?}"
        );
        assert_eq!(l.amount, l.contracted_cost);
    }
}

async fn compute_is_billed_per_dimension(store: &Store) {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    log.site("aws-us-east-1", SiteKind::Aws, "us-east-1").await;
    let w = Uuid::now_v7();
    let hpc = hpc_rate(Currency::EUR);
    let t0 = t("2026-11-02T09:00:00Z");
    let minutes = |m: i64| t0 + chrono::Duration::minutes(m);

    // 90 minutes of 8 cores, 32 GiB and 2 GPUs: 12 core-hours × 0.05 = 0.60,
    // 48 GiB-hours × 0.01 = 0.48, 3 GPU-hours × 2.00 = 6.00; 7.08 EUR.
    let finished = log
        .run(
            "physics",
            w,
            "hpc-eu",
            "train",
            1,
            &hpc,
            &gpu_node(),
            t0,
            minutes(90),
            End::Finished,
        )
        .await;
    // Failed after 10 minutes: billed for the 10 minutes.
    let failed = log
        .run(
            "physics",
            w,
            "hpc-eu",
            "eval",
            1,
            &hpc,
            &gpu_node(),
            t0,
            minutes(10),
            End::Failed(FailureReason::ExitCode { code: 3 }),
        )
        .await;
    // Refused before it started: nothing.
    log.run(
        "physics",
        w,
        "hpc-eu",
        "x",
        1,
        &hpc,
        &gpu_node(),
        t0,
        t0,
        End::Refused,
    )
    .await;
    // Cancelled after 30 minutes, no GPU: two lines.
    let cpu_only = Allocation {
        gpus: None,
        ..gpu_node()
    };
    log.run(
        "physics",
        w,
        "hpc-eu",
        "prep",
        1,
        &hpc,
        &cpu_only,
        t0,
        minutes(30),
        End::Cancelled,
    )
    .await;
    // A cloud run: 2 instances × 1.5 h × 98.32 = 294.96 USD, one line.
    let two_nodes = Allocation {
        nodes: 2,
        ..gpu_node()
    };
    log.run(
        "physics",
        w,
        "aws-us-east-1",
        "serve",
        1,
        &cloud_rate(),
        &two_nodes,
        t0,
        minutes(90),
        End::Finished,
    )
    .await;

    // Started and ended at one instant: its lines are there, at zero.
    let instant = log
        .run(
            "physics",
            w,
            "hpc-eu",
            "instant",
            1,
            &hpc,
            &gpu_node(),
            t0,
            t0,
            End::Finished,
        )
        .await;

    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    check_identities(&b.lines);
    let lines_of = |job: Uuid| -> Vec<&BillLine> {
        b.lines
            .iter()
            .filter(|l| l.job_id.as_deref() == Some(&job.to_string()))
            .collect()
    };
    let train = lines_of(finished);
    assert_eq!(train.len(), 3, "{:#?}", b.lines);
    let q: Vec<(&str, Decimal, Decimal, &str)> = train
        .iter()
        .map(|l| {
            (
                l.meter.as_str(),
                d(&l.quantity),
                d(&l.amount),
                l.unit.as_str(),
            )
        })
        .collect();
    assert!(
        q.contains(&("core_hours", d("12"), d("0.60"), "Core-Hours")),
        "{q:?}"
    );
    assert!(
        q.contains(&("memory_gib_hours", d("48"), d("0.48"), "GiB-Hours")),
        "{q:?}"
    );
    assert!(
        q.contains(&("gpu_hours", d("3"), d("6.00"), "GPU-Hours")),
        "{q:?}"
    );
    assert_eq!(amount(&train), d("7.08"));
    for l in &train {
        assert_eq!(l.currency, "EUR");
        assert_eq!(l.job.as_deref(), Some("train"));
        assert_eq!(l.attempt, Some(1));
        assert_eq!(l.region.as_deref(), Some("eu-central"));
        assert_eq!(l.site_kind.as_deref(), Some("slurm"));
        assert_eq!(l.price_source, "hpc-eu sheet 2026");
        assert_eq!(l.started_at, "2026-11-02T09:00:00.000000Z");
        assert_eq!(l.ended_at, "2026-11-02T10:30:00.000000Z");
        assert_eq!(l.period, "2026-11");
        assert_eq!(l.list_cost, l.contracted_cost, "no adjustments here");
    }
    // Ten minutes: 4.72 per hour / 6, summed over its three lines.
    let eval = lines_of(failed);
    assert_eq!(eval.len(), 3);
    let ten_minutes = amount(&eval);
    assert!(
        (ten_minutes - d("4.72") / d("6")).abs() < d("1e-25"),
        "{ten_minutes}"
    );
    assert!(
        eval[0].description.contains("failed"),
        "{}",
        eval[0].description
    );
    // Cancelled without GPUs: cores and memory only, 30 minutes → 4 × 0.05 + 16 × 0.01.
    let prep: Vec<&BillLine> = b
        .lines
        .iter()
        .filter(|l| l.job.as_deref() == Some("prep"))
        .collect();
    assert_eq!(prep.len(), 2);
    assert_eq!(amount(&prep), d("0.36"));
    // The cloud run: instance-hours.
    let serve: Vec<&BillLine> = b
        .lines
        .iter()
        .filter(|l| l.job.as_deref() == Some("serve"))
        .collect();
    assert_eq!(serve.len(), 1);
    assert_eq!(serve[0].meter, "instance_hours");
    assert_eq!(serve[0].unit, "Hours");
    assert_eq!(d(&serve[0].quantity), d("3"));
    assert_eq!(d(&serve[0].amount), d("294.96"));
    assert_eq!(serve[0].offer, "p5.48xlarge");
    let zero = lines_of(instant);
    assert_eq!(zero.len(), 3);
    assert!(zero
        .iter()
        .all(|l| d(&l.quantity).is_zero() && d(&l.amount).is_zero()));
    // The refused run left nothing.
    assert!(b.lines.iter().all(|l| l.job.as_deref() != Some("x")));

    // Two currencies, two totals: never summed.
    assert_eq!(b.totals.len(), 2, "{:#?}", b.totals);
    let eur = b.totals.iter().find(|t| t.currency == "EUR").unwrap();
    let usd = b.totals.iter().find(|t| t.currency == "USD").unwrap();
    assert_eq!(d(&eur.amount), d("7.08") + ten_minutes + d("0.36"));
    assert_eq!(d(&usd.amount), d("294.96"));
    assert_eq!(b.by_category.len(), 2);
    assert!(b.by_category.iter().all(|c| c.category == "compute"));
    let sites: Vec<(&str, &str)> = b
        .by_site
        .iter()
        .map(|s| (s.site.as_str(), s.currency.as_str()))
        .collect();
    assert_eq!(sites, vec![("aws-us-east-1", "USD"), ("hpc-eu", "EUR")]);
}
on_both!(
    compute_is_billed_per_dimension,
    sqlite_compute_is_billed_per_dimension,
    postgres_compute_is_billed_per_dimension
);

async fn storage_is_billed_from_allocation_to_release(store: &Store) {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    let w = Uuid::now_v7();
    let rate = storage_rate(Currency::EUR);
    // 200 GiB for 3 hours: 600 GiB-hours × 0.0001 = 0.06.
    log.volume(
        "physics",
        w,
        "data",
        StorageClass::Volume,
        "hpc-eu",
        200 * GIB,
        &rate,
        t("2026-11-02T09:00:00Z"),
        t("2026-11-02T12:00:00Z"),
    )
    .await;
    // A 10 GiB cache for 30 minutes: 5 GiB-hours → 0.0005.
    log.volume(
        "physics",
        w,
        "sha256:9f86",
        StorageClass::Cache,
        "hpc-eu",
        10 * GIB,
        &rate,
        t("2026-11-02T09:00:00Z"),
        t("2026-11-02T09:30:00Z"),
    )
    .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    check_identities(&b.lines);
    assert_eq!(b.lines.len(), 2);
    let volume = b
        .lines
        .iter()
        .find(|l| l.resource_type == "Volume")
        .unwrap();
    assert_eq!(volume.category, "storage");
    assert_eq!(volume.unit, "GiB-Hours");
    assert_eq!(d(&volume.quantity), d("600"));
    assert_eq!(d(&volume.amount), d("0.06"));
    assert_eq!(volume.resource_name, "data");
    let cache = b.lines.iter().find(|l| l.resource_type == "Cache").unwrap();
    assert_eq!(d(&cache.quantity), d("5"));
    assert_eq!(d(&cache.amount), d("0.0005"));
    assert_eq!(b.totals.len(), 1);
    assert_eq!(d(&b.totals[0].amount), d("0.0605"));
    assert_eq!(b.by_category[0].category, "storage");
}
on_both!(
    storage_is_billed_from_allocation_to_release,
    sqlite_storage_is_billed_from_allocation_to_release,
    postgres_storage_is_billed_from_allocation_to_release
);

async fn egress_is_tiered_by_the_months_volume(store: &Store) {
    let mut log = Log::new().await;
    log.site("aws-us-east-1", SiteKind::Aws, "us-east-1").await;
    let w = Uuid::now_v7();
    let aws = || Location::Site {
        site: "aws-us-east-1".into(),
    };
    let out = || Location::Region {
        region: "internet".into(),
    };
    let at = |s: &str| t(s);
    let tariff = Some(tiered_tariff());
    // 80 GB: inside the free 100.
    let first = log
        .transfer(
            "physics",
            w,
            80 * GB,
            aws(),
            out(),
            at("2026-11-03T10:00:00Z"),
            at("2026-11-03T10:05:00Z"),
            tariff.clone(),
        )
        .await;
    // 30 GB more: crosses the first tier, 20 GB free and 10 GB at 0.09 = 0.90.
    let second = log
        .transfer(
            "physics",
            w,
            30 * GB,
            aws(),
            out(),
            at("2026-11-04T10:00:00Z"),
            at("2026-11-04T10:05:00Z"),
            tariff.clone(),
        )
        .await;
    // 10,000 GB more (from 110 GB): 9,990 GB at 0.09 = 899.10, and past 10,100 GB,
    // 10 GB at 0.085 = 0.85.
    let third = log
        .transfer(
            "physics",
            w,
            10_000 * GB,
            aws(),
            out(),
            at("2026-11-05T10:00:00Z"),
            at("2026-11-05T12:00:00Z"),
            tariff.clone(),
        )
        .await;
    // Another tenant has its own volume: free.
    let other = log
        .transfer(
            "chemistry",
            w,
            30 * GB,
            aws(),
            out(),
            at("2026-11-05T10:00:00Z"),
            at("2026-11-05T10:01:00Z"),
            tariff.clone(),
        )
        .await;
    // A new month starts again at 0: free.
    let december = log
        .transfer(
            "physics",
            w,
            5 * GB,
            aws(),
            out(),
            at("2026-12-01T10:00:00Z"),
            at("2026-12-01T10:01:00Z"),
            tariff.clone(),
        )
        .await;
    // A copy that crossed no billable boundary carries no tariff: nothing.
    log.transfer(
        "physics",
        w,
        5 * GB,
        aws(),
        aws(),
        at("2026-11-06T10:00:00Z"),
        at("2026-11-06T10:01:00Z"),
        None,
    )
    .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    check_identities(&b.lines);
    let of_transfer = |id: Uuid| -> Vec<(i64, Decimal, Decimal, Decimal)> {
        let mut v: Vec<_> = b
            .lines
            .iter()
            .filter(|l| l.resource_id == id.to_string())
            .map(|l| {
                (
                    l.band.unwrap(),
                    d(&l.quantity),
                    d(&l.list_unit_price),
                    d(&l.amount),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(of_transfer(first), vec![(0, d("80"), d("0"), d("0"))]);
    assert_eq!(
        of_transfer(second),
        vec![
            (0, d("20"), d("0"), d("0")),
            (1, d("10"), d("0.09"), d("0.90"))
        ]
    );
    assert_eq!(
        of_transfer(third),
        vec![
            (1, d("9990"), d("0.09"), d("899.10")),
            (2, d("10"), d("0.085"), d("0.85"))
        ]
    );
    assert_eq!(of_transfer(other), vec![(0, d("30"), d("0"), d("0"))]);
    assert_eq!(of_transfer(december), vec![(0, d("5"), d("0"), d("0"))]);
    let egress: Vec<&BillLine> = b.lines.iter().collect();
    assert!(egress
        .iter()
        .all(|l| l.category == "egress" && l.unit == "GB"));
    assert!(egress.iter().all(|l| l.site == "aws-us-east-1"));
    let tier = b.lines.iter().find(|l| l.band == Some(2)).unwrap();
    assert!(
        tier.description.ends_with("(tier 2)"),
        "{}",
        tier.description
    );
    assert_eq!(d(&b.totals[0].amount), d("900.85"));
}
on_both!(
    egress_is_tiered_by_the_months_volume,
    sqlite_egress_is_tiered_by_the_months_volume,
    postgres_egress_is_tiered_by_the_months_volume
);

async fn charges_are_split_at_the_month_end(store: &Store) {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    let w = Uuid::now_v7();
    // 23:00 on 31 October to 01:30 on 1 November: 1 h in October (4.72), 1.5 h in
    // November (7.08).
    log.run(
        "physics",
        w,
        "hpc-eu",
        "train",
        1,
        &hpc_rate(Currency::EUR),
        &gpu_node(),
        t("2026-10-31T23:00:00Z"),
        t("2026-11-01T01:30:00Z"),
        End::Finished,
    )
    .await;
    // 100 GiB from 22:00 to 02:00: 200 GiB-hours in each month.
    log.volume(
        "physics",
        w,
        "data",
        StorageClass::Volume,
        "hpc-eu",
        100 * GIB,
        &storage_rate(Currency::EUR),
        t("2026-10-31T22:00:00Z"),
        t("2026-11-01T02:00:00Z"),
    )
    .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    check_identities(&b.lines);
    assert_eq!(b.lines.len(), 8, "{:#?}", b.lines);
    let october: Vec<&BillLine> = b.lines.iter().filter(|l| l.period == "2026-10").collect();
    let november: Vec<&BillLine> = b.lines.iter().filter(|l| l.period == "2026-11").collect();
    assert_eq!(october.len(), 4);
    assert_eq!(november.len(), 4);
    for l in &october {
        assert_eq!(l.ended_at, "2026-11-01T00:00:00.000000Z", "{l:#?}");
    }
    for l in &november {
        assert_eq!(l.started_at, "2026-11-01T00:00:00.000000Z", "{l:#?}");
    }
    let compute = |ls: &[&BillLine]| -> Decimal {
        ls.iter()
            .filter(|l| l.category == "compute")
            .map(|l| d(&l.amount))
            .sum()
    };
    assert_eq!(compute(&october), d("4.72"));
    assert_eq!(compute(&november), d("7.08"));
    let storage = |ls: &[&BillLine]| {
        ls.iter()
            .find(|l| l.category == "storage")
            .map(|l| d(&l.quantity))
    };
    assert_eq!(storage(&october), Some(d("200")));
    assert_eq!(storage(&november), Some(d("200")));
    // The tenant's monthly bills each hold their part.
    let oct = tenant_bill(store, "physics", Period::from_str("2026-10").unwrap())
        .await
        .unwrap();
    assert_eq!(oct.lines, 4);
    assert_eq!(d(&oct.totals[0].amount), d("4.72") + d("0.02"));
    assert_eq!(oct.billing_period_start, "2026-10-01T00:00:00.000000Z");
    assert_eq!(oct.billing_period_end, "2026-11-01T00:00:00.000000Z");
    let nov = tenant_bill(store, "physics", Period::from_str("2026-11").unwrap())
        .await
        .unwrap();
    assert_eq!(d(&nov.totals[0].amount), d("7.08") + d("0.02"));
    assert_eq!(nov.workflows.len(), 1);
    assert_eq!(nov.workflows[0].workflow_id, w.to_string());
    let empty = tenant_bill(store, "nobody", Period::from_str("2026-11").unwrap())
        .await
        .unwrap();
    assert_eq!(empty.lines, 0);
    assert!(empty.totals.is_empty());
}
on_both!(
    charges_are_split_at_the_month_end,
    sqlite_charges_are_split_at_the_month_end,
    postgres_charges_are_split_at_the_month_end
);

async fn adjustments_set_the_contracted_price(store: &Store) {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    log.site("hpc-us", SiteKind::Slurm, "us-east").await;
    let hpc = hpc_rate(Currency::EUR);
    let site_scope = || AdjustmentScope {
        site: Some("hpc-eu".into()),
        ..AdjustmentScope::default()
    };
    // 10 % off at hpc-eu from 10 November; from 20 November GPU-hours there at a
    // committed 1.50 EUR (a committed rate beats a discount of the same scope).
    let discount = log
        .grant(
            "physics",
            site_scope(),
            AdjustmentTerms::PercentDiscount { percent: d("10") },
            t("2026-11-10T00:00:00Z"),
            None,
        )
        .await;
    let committed = log
        .grant(
            "physics",
            site_scope(),
            AdjustmentTerms::CommittedRate {
                meter: Meter::GpuHours,
                unit_price: d("1.50"),
                currency: Currency::EUR,
            },
            t("2026-11-20T00:00:00Z"),
            None,
        )
        .await;
    let w = Uuid::now_v7();
    let hour = |day: u32| {
        let s = t(&format!("2026-11-{day:02}T09:00:00Z"));
        (s, s + chrono::Duration::hours(1))
    };
    for (tenant, site, day) in [
        ("physics", "hpc-eu", 5),
        ("physics", "hpc-eu", 12),
        ("physics", "hpc-us", 12),
        ("chemistry", "hpc-eu", 12),
        ("physics", "hpc-eu", 21),
    ] {
        let (s, e) = hour(day);
        let name = format!("d{day}-{site}-{tenant}");
        log.run(
            tenant,
            w,
            site,
            &name,
            1,
            &hpc,
            &gpu_node(),
            s,
            e,
            End::Finished,
        )
        .await;
    }
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    check_identities(&b.lines);
    let run_lines = |name: &str| -> Vec<&BillLine> {
        b.lines
            .iter()
            .filter(|l| l.job.as_deref() == Some(name))
            .collect()
    };
    // Before the discount: list price.
    let before = run_lines("d5-hpc-eu-physics");
    assert_eq!(amount(&before), d("4.72"));
    assert!(before.iter().all(|l| l.adjustment_id.is_none()));
    // With it: 10 % off every dimension, list kept on the line.
    let discounted = run_lines("d12-hpc-eu-physics");
    assert_eq!(amount(&discounted), d("4.248"));
    let list: Decimal = discounted.iter().map(|l| d(&l.list_cost)).sum();
    assert_eq!(list, d("4.72"));
    assert!(discounted
        .iter()
        .all(|l| l.adjustment_id.as_deref() == Some(&discount.to_string())));
    let gpu = discounted.iter().find(|l| l.meter == "gpu_hours").unwrap();
    assert_eq!(d(&gpu.list_unit_price), d("2.00"));
    assert_eq!(d(&gpu.contracted_unit_price), d("1.80"));
    // Another site, another tenant: untouched.
    assert_eq!(amount(&run_lines("d12-hpc-us-physics")), d("4.72"));
    assert_eq!(amount(&run_lines("d12-hpc-eu-chemistry")), d("4.72"));
    // After the committed rate: GPUs at 1.50 (2 GPU-hours = 3.00), the rest 10 % off
    // (0.40 × 0.9 + 0.32 × 0.9 = 0.648).
    let late = run_lines("d21-hpc-eu-physics");
    let gpu = late.iter().find(|l| l.meter == "gpu_hours").unwrap();
    assert_eq!(
        gpu.adjustment_id.as_deref(),
        Some(committed.to_string().as_str())
    );
    assert_eq!(d(&gpu.contracted_cost), d("3.00"));
    assert_eq!(amount(&late), d("3.648"));
    // The bill's totals keep list and contracted apart.
    let total = &b.totals[0];
    assert_eq!(d(&total.list_amount), d("4.72") * d("5"));
    assert_eq!(
        d(&total.amount),
        d("4.72") * d("3") + d("4.248") + d("3.648")
    );
}
on_both!(
    adjustments_set_the_contracted_price,
    sqlite_adjustments_set_the_contracted_price,
    postgres_adjustments_set_the_contracted_price
);

async fn a_replaced_workflow_shows_every_attempt(store: &Store) {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    log.site("aws-us-east-1", SiteKind::Aws, "us-east-1").await;
    let w = Uuid::now_v7();
    let t0 = t("2026-11-02T09:00:00Z");
    // The first attempt ran 20 minutes at hpc-eu before its node died; the work was
    // re-placed on AWS, where it ran an hour.
    let first = log
        .run(
            "physics",
            w,
            "hpc-eu",
            "train",
            1,
            &hpc_rate(Currency::USD),
            &gpu_node(),
            t0,
            t0 + chrono::Duration::minutes(20),
            End::Failed(FailureReason::NodeFailure),
        )
        .await;
    let second = log
        .run(
            "physics",
            w,
            "aws-us-east-1",
            "train",
            2,
            &cloud_rate(),
            &gpu_node(),
            t0 + chrono::Duration::minutes(30),
            t0 + chrono::Duration::minutes(90),
            End::Finished,
        )
        .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    let attempts: Vec<(Option<i64>, &str, String)> = b
        .lines
        .iter()
        .map(|l| (l.attempt, l.site.as_str(), l.job_id.clone().unwrap()))
        .collect();
    assert!(attempts.contains(&(Some(1), "hpc-eu", first.to_string())));
    assert!(attempts.contains(&(Some(2), "aws-us-east-1", second.to_string())));
    let second_line = b.lines.iter().find(|l| l.site == "aws-us-east-1").unwrap();
    assert!(
        second_line.description.contains("attempt 2"),
        "{}",
        second_line.description
    );
    assert_eq!(b.by_site.len(), 2);
    let hpc = b.by_site.iter().find(|s| s.site == "hpc-eu").unwrap();
    // 20 minutes: a third of 4.72, to the 28th digit.
    assert!((d(&hpc.amount) - d("4.72") / d("3")).abs() < d("1e-25"));
    let aws = b
        .by_site
        .iter()
        .find(|s| s.site == "aws-us-east-1")
        .unwrap();
    assert_eq!(d(&aws.amount), d("98.32"));
    // One currency: the two attempts add up.
    assert_eq!(b.totals.len(), 1);
    assert!((d(&b.totals[0].amount) - d("4.72") / d("3") - d("98.32")).abs() < d("1e-25"));
}
on_both!(
    a_replaced_workflow_shows_every_attempt,
    sqlite_a_replaced_workflow_shows_every_attempt,
    postgres_a_replaced_workflow_shows_every_attempt
);

async fn redelivery_never_bills_twice(store: &Store) {
    let mut log = Log::new().await;
    log.site("aws-us-east-1", SiteKind::Aws, "us-east-1").await;
    let w = Uuid::now_v7();
    let aws = || Location::Site {
        site: "aws-us-east-1".into(),
    };
    let out = || Location::Region {
        region: "internet".into(),
    };
    log.run(
        "physics",
        w,
        "aws-us-east-1",
        "a",
        1,
        &cloud_rate(),
        &gpu_node(),
        t("2026-11-02T09:00:00Z"),
        t("2026-11-02T10:00:00Z"),
        End::Finished,
    )
    .await;
    // Tiered egress is the one charge that depends on what came before: a second
    // application must not count the first copy's volume again.
    log.transfer(
        "physics",
        w,
        90 * GB,
        aws(),
        out(),
        t("2026-11-03T10:00:00Z"),
        t("2026-11-03T10:05:00Z"),
        Some(tiered_tariff()),
    )
    .await;
    log.transfer(
        "physics",
        w,
        20 * GB,
        aws(),
        out(),
        t("2026-11-03T11:00:00Z"),
        t("2026-11-03T11:05:00Z"),
        Some(tiered_tariff()),
    )
    .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let before = snapshot(store).await.unwrap();
    let b = bill(store, w).await.unwrap();
    assert_eq!(d(&b.totals[0].amount), d("98.32") + d("0.9"));

    // The same commits applied again, as after a crash before the position was saved
    // or by a second replica: nothing changes.
    let commits = log.log.read_from(0, 1000).await.unwrap();
    for _ in 0..2 {
        let mut tx = store.begin().await.unwrap();
        for commit in &commits {
            Ledger.apply(&mut tx, commit).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(snapshot(store).await.unwrap(), before);
    assert_eq!(bill(store, w).await.unwrap(), b);
    // And catching up again finds nothing new.
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    assert_eq!(snapshot(store).await.unwrap(), before);
}
on_both!(
    redelivery_never_bills_twice,
    sqlite_redelivery_never_bills_twice,
    postgres_redelivery_never_bills_twice
);

/// A cloud instance billed from launch to termination: compute is charged for that
/// stretch, not the shorter run inside it.
async fn the_billed_stretch_is_charged_when_the_site_gives_one(store: &Store) {
    let mut log = Log::new().await;
    log.site("aws-us-east-1", SiteKind::Aws, "us-east-1").await;
    let w = Uuid::now_v7();
    let t0 = t("2026-11-02T09:00:00Z");
    let minutes = |m: i64| t0 + chrono::Duration::minutes(m);
    // The task ran 09:05 to 09:35; the instance lived 09:00 to 10:00: one instance-hour.
    let job = log
        .run(
            "physics",
            w,
            "aws-us-east-1",
            "serve",
            1,
            &cloud_rate(),
            &gpu_node(),
            minutes(5),
            minutes(35),
            End::FinishedBilled(meridian_events::vocabulary::BilledInterval {
                from: t0,
                to: minutes(60),
            }),
        )
        .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    let lines: Vec<&BillLine> = b
        .lines
        .iter()
        .filter(|l| l.job_id.as_deref() == Some(job.to_string().as_str()))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(d(&lines[0].quantity), d("1"));
    assert_eq!(d(&lines[0].amount), d("98.32"));
    assert_eq!(lines[0].started_at, "2026-11-02T09:00:00.000000Z");
    assert_eq!(lines[0].ended_at, "2026-11-02T10:00:00.000000Z");

    // An instance that booted for half an hour and was cancelled before its job started:
    // AWS bills it, so the bill does; a run refused before launch costs nothing.
    let booted = log
        .run(
            "physics",
            w,
            "aws-us-east-1",
            "serve",
            2,
            &cloud_rate(),
            &gpu_node(),
            minutes(60),
            minutes(90),
            End::CancelledBilledBeforeStart(meridian_events::vocabulary::BilledInterval {
                from: minutes(60),
                to: minutes(90),
            }),
        )
        .await;
    let refused = log
        .run(
            "physics",
            w,
            "aws-us-east-1",
            "serve",
            3,
            &cloud_rate(),
            &gpu_node(),
            minutes(90),
            minutes(91),
            End::Refused,
        )
        .await;
    catch_up(store, &*log.log, &Ledger).await.unwrap();
    let b = bill(store, w).await.unwrap();
    let of = |job: Uuid| -> Vec<BillLine> {
        b.lines
            .iter()
            .filter(|l| l.job_id.as_deref() == Some(job.to_string().as_str()))
            .cloned()
            .collect()
    };
    let booted_lines = of(booted);
    assert_eq!(booted_lines.len(), 1, "{booted_lines:#?}");
    assert_eq!(d(&booted_lines[0].quantity), d("0.5"));
    assert_eq!(d(&booted_lines[0].amount), d("49.16"));
    assert!(of(refused).is_empty());
}
on_both!(
    the_billed_stretch_is_charged_when_the_site_gives_one,
    sqlite_the_billed_stretch_is_charged,
    postgres_the_billed_stretch_is_charged
);
