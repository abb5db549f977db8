//! The FOCUS 1.2 export, checked row by row against the specification's rules (a rule
//! check written here from the spec's column and attribute definitions), and for
//! determinism: the same log gives the same bytes, on SQLite and on PostgreSQL, before
//! and after a rebuild.

mod common;

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, Datelike, Utc};
use common::*;
use meridian_accounting::focus::{self, COLUMNS};
use meridian_accounting::{rebuild, Ledger, Period};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms};
use meridian_events::{Currency, SiteKind};
use meridian_store::{catch_up, Store};
use rust_decimal::Decimal;
use serde_json::Value;
use uuid::Uuid;

const MANDATORY: [&str; 21] = [
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "PricingQuantity",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "InvoiceIssuerName",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
    "PricingUnit",
];
const NULLABLE_MANDATORY: [&str; 5] = [
    "BillingAccountName",
    "ChargeClass",
    "ChargeDescription",
    "PricingQuantity",
    "PricingUnit",
];
/// Asked for on top of the mandatory ones.
const WANTED: [&str; 10] = [
    "ResourceId",
    "ResourceName",
    "RegionId",
    "SkuId",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "ChargeFrequency",
    "Tags",
];
const DATETIMES: [&str; 4] = [
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
];
const DECIMALS: [&str; 8] = [
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "PricingQuantity",
    "ConsumedQuantity",
];
const SERVICE_CATEGORIES: [&str; 19] = [
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
];

/// RFC 4180 CSV, quotes and doubled quotes included.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => {
                assert!(field.is_empty(), "a quote inside an unquoted field");
                quoted = true;
            }
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, '\r') => panic!("lines end with \\n"),
            (false, c) => field.push(c),
        }
    }
    assert!(!quoted, "unterminated quote");
    assert!(
        field.is_empty() && row.is_empty(),
        "the last line ends with \\n"
    );
    rows
}

fn is_focus_time(s: &str) -> Option<DateTime<Utc>> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.clone().all(|i| b[i].is_ascii_digit());
    let shape = b.len() == 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'Z';
    if shape {
        s.parse().ok()
    } else {
        None
    }
}

/// FOCUS numeric format: digits, one optional decimal point, an optional minus; no
/// plus, exponent, separators, currency or units.
fn is_focus_decimal(s: &str) -> bool {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && (int == "0" || !int.starts_with('0'))
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

/// FOCUS unit format, for the units Meridian writes: a plural time or data size unit,
/// or `<singular count or size>-<plural time>`.
fn is_focus_unit(s: &str) -> bool {
    const SIZES: [&str; 4] = ["GB", "GiB", "TB", "TiB"];
    const TIMES: [&str; 3] = ["Hours", "Minutes", "Seconds"];
    match s.split_once('-') {
        None => TIMES.contains(&s) || SIZES.contains(&s),
        Some((base, time)) => {
            TIMES.contains(&time)
                && (SIZES.contains(&base)
                    || (base.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                        && base.chars().all(|c| c.is_ascii_alphabetic())
                        && !base.ends_with('s')))
        }
    }
}

/// Checks a CSV export against FOCUS's rules, row by row; returns its rows as maps.
fn check_focus_csv(text: &str) -> Vec<BTreeMap<String, Option<String>>> {
    let rows = parse_csv(text);
    let header = &rows[0];
    // Columns: every mandatory and wanted one; custom ones start with x_ and follow
    // every FOCUS column; no duplicates.
    for c in MANDATORY.iter().chain(&WANTED) {
        assert!(header.iter().any(|h| h == c), "column {c} is missing");
    }
    let first_custom = header.iter().position(|h| h.starts_with("x_")).unwrap();
    assert!(
        header[first_custom..].iter().all(|h| h.starts_with("x_")),
        "custom columns come after the FOCUS ones: {header:?}"
    );
    let mut seen = header.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), header.len(), "duplicate columns");

    let mut out = Vec::new();
    for (n, fields) in rows[1..].iter().enumerate() {
        let at = |c: &str| format!("row {} column {c}", n + 1);
        assert_eq!(
            fields.len(),
            header.len(),
            "row {} has {} fields",
            n + 1,
            fields.len()
        );
        let row: BTreeMap<String, Option<String>> = header
            .iter()
            .zip(fields)
            .map(|(h, v)| (h.clone(), (!v.is_empty()).then(|| v.clone())))
            .collect();
        let get = |c: &str| row[c].as_deref();
        for c in MANDATORY {
            if !NULLABLE_MANDATORY.contains(&c) {
                assert!(get(c).is_some(), "{} is null", at(c));
            }
        }
        for (c, v) in &row {
            if let Some(v) = v {
                assert_ne!(v, "\"\"", "{}: an empty string stands for a null", at(c));
            }
        }
        // Dates: format, billing period a calendar month, charge inside it, end exclusive.
        let time = |c: &str| {
            is_focus_time(get(c).unwrap())
                .unwrap_or_else(|| panic!("{} is not YYYY-MM-DDTHH:mm:ssZ: {:?}", at(c), get(c)))
        };
        for c in DATETIMES {
            time(c);
        }
        let (bps, bpe) = (time("BillingPeriodStart"), time("BillingPeriodEnd"));
        let (cps, cpe) = (time("ChargePeriodStart"), time("ChargePeriodEnd"));
        assert_eq!(bps.day(), 1, "{}", at("BillingPeriodStart"));
        assert_eq!(bps.time(), chrono::NaiveTime::MIN);
        assert_eq!(Period::of(bps).end(), bpe, "{}", at("BillingPeriodEnd"));
        assert!(
            cps < cpe,
            "{}: the charge period is empty",
            at("ChargePeriodEnd")
        );
        assert!(
            bps <= cps && cpe <= bpe,
            "row {}: charge [{cps}, {cpe}) is not split at its billing period [{bps}, {bpe})",
            n + 1
        );
        // Numbers.
        for c in DECIMALS {
            if let Some(v) = get(c) {
                assert!(
                    is_focus_decimal(v),
                    "{} is not a FOCUS decimal: {v:?}",
                    at(c)
                );
            }
        }
        for c in ["BilledCost", "EffectiveCost", "ListCost", "ContractedCost"] {
            assert!(get(c).is_some(), "{} is null", at(c));
        }
        let dec = |c: &str| get(c).map(|v| Decimal::from_str(v).unwrap());
        if let (Some(p), Some(q), Some(cost)) = (
            dec("ListUnitPrice"),
            dec("PricingQuantity"),
            dec("ListCost"),
        ) {
            assert_eq!(
                cost,
                p * q,
                "row {}: ListCost ≠ ListUnitPrice × PricingQuantity",
                n + 1
            );
        }
        if let (Some(p), Some(q), Some(cost)) = (
            dec("ContractedUnitPrice"),
            dec("PricingQuantity"),
            dec("ContractedCost"),
        ) {
            assert_eq!(
                cost,
                p * q,
                "row {}: ContractedCost ≠ ContractedUnitPrice × PricingQuantity",
                n + 1
            );
        }
        assert!(
            dec("ListCost").unwrap() >= dec("ContractedCost").unwrap(),
            "row {}: a discount never costs more",
            n + 1
        );
        // Categories and enumerations.
        let category = get("ChargeCategory").unwrap();
        assert!(
            ["Usage", "Purchase", "Tax", "Credit", "Adjustment"].contains(&category),
            "{}",
            at("ChargeCategory")
        );
        assert!(
            matches!(get("ChargeClass"), None | Some("Correction")),
            "{}",
            at("ChargeClass")
        );
        assert!(
            matches!(
                get("ChargeFrequency"),
                Some("One-Time" | "Recurring" | "Usage-Based")
            ),
            "{}",
            at("ChargeFrequency")
        );
        if category == "Usage" {
            assert!(
                get("ConsumedQuantity").is_some(),
                "{}",
                at("ConsumedQuantity")
            );
            assert!(get("ConsumedUnit").is_some(), "{}", at("ConsumedUnit"));
        } else {
            assert!(
                get("ConsumedQuantity").is_none(),
                "{}",
                at("ConsumedQuantity")
            );
        }
        assert!(
            SERVICE_CATEGORIES.contains(&get("ServiceCategory").unwrap()),
            "{}",
            at("ServiceCategory")
        );
        let sub = get("ServiceSubcategory").unwrap();
        let parent = match sub {
            "Virtual Machines" | "Containers" | "Other (Compute)" => "Compute",
            "Files" | "Other (Storage)" => "Storage",
            "Data Transfer" => "Networking",
            other => panic!("{}: unexpected {other:?}", at("ServiceSubcategory")),
        };
        assert_eq!(
            get("ServiceCategory"),
            Some(parent),
            "{}",
            at("ServiceSubcategory")
        );
        // Currency and units.
        let currency = get("BillingCurrency").unwrap();
        assert!(
            currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()),
            "{}",
            at("BillingCurrency")
        );
        for c in ["PricingUnit", "ConsumedUnit"] {
            let u = get(c).unwrap();
            assert!(
                is_focus_unit(u),
                "{} is not in FOCUS unit format: {u:?}",
                at(c)
            );
        }
        // Tags: a JSON object of flat values naming the workflow, tenant and site.
        let tags: Value = serde_json::from_str(get("Tags").unwrap()).expect("Tags is JSON");
        let tags = tags.as_object().expect("Tags is an object");
        for (k, v) in tags {
            assert!(
                !v.is_object() && !v.is_array(),
                "{}: tag {k} is not flat",
                at("Tags")
            );
        }
        for k in ["workflow", "tenant", "site"] {
            assert!(tags.contains_key(k), "{}: no {k} tag", at("Tags"));
        }
        assert_eq!(tags["tenant"].as_str(), get("BillingAccountId"));
        out.push(row);
    }
    out
}

async fn export_text(store: &Store, period: &str, tenant: Option<&str>) -> (String, String) {
    let e = focus::export(store, Period::from_str(period).unwrap(), tenant)
        .await
        .unwrap();
    (focus::to_csv(&e.rows), focus::to_json(&e.rows))
}

/// The JSON export holds the CSV's rows: same columns in the same order, the same
/// values (decimals digit for digit), nulls as nulls.
fn check_json_matches(json: &str, csv: &[BTreeMap<String, Option<String>>]) {
    let parsed: Vec<serde_json::Map<String, Value>> = serde_json::from_str(json).unwrap();
    assert_eq!(parsed.len(), csv.len());
    for (j, c) in parsed.iter().zip(csv) {
        let keys: Vec<&str> = j.keys().map(String::as_str).collect();
        assert_eq!(keys, COLUMNS.to_vec());
        for (k, v) in j {
            match (&c[k], v) {
                (None, Value::Null) => {}
                (Some(text), Value::String(s)) => assert_eq!(text, s, "{k}"),
                (Some(text), Value::Number(_)) => {
                    assert!(
                        json.contains(&format!("\"{k}\":{text}")),
                        "{k} is not {text} digit for digit"
                    )
                }
                (Some(text), Value::Object(_)) => {
                    assert_eq!(serde_json::from_str::<Value>(text).unwrap(), *v, "{k}")
                }
                (c, j) => panic!("{k}: CSV {c:?}, JSON {j}"),
            }
        }
    }
}

#[tokio::test]
async fn a_synthetic_quarter_passes_the_rule_check_and_is_the_same_everywhere() {
    // Three months of every kind of charge, tenants with discounts, runs across month
    // ends, tiered egress; applied to a SQLite ledger and a PostgreSQL ledger.
    let log = Log::new().await;
    for commit in meridian_accounting::synthetic::history(7, 600) {
        log.log.append(commit).await.unwrap();
    }
    let (sdb, sqlite) = Db::sqlite().await;
    let (pdb, postgres) = Db::postgres().await;
    catch_up(&sqlite, &*log.log, &Ledger).await.unwrap();
    catch_up(&postgres, &*log.log, &Ledger).await.unwrap();
    let mut rows = 0;
    for period in ["2026-10", "2026-11", "2026-12"] {
        let (csv, json) = export_text(&sqlite, period, None).await;
        let checked = check_focus_csv(&csv);
        assert!(checked.len() > 100, "{period}: {} rows", checked.len());
        rows += checked.len();
        check_json_matches(&json, &checked);
        // Byte for byte on the other database, and again.
        assert_eq!(
            export_text(&postgres, period, None).await,
            (csv.clone(), json.clone())
        );
        assert_eq!(export_text(&sqlite, period, None).await.0, csv);
        // One tenant's export is that tenant's rows of the whole.
        let (physics, _) = export_text(&postgres, period, Some("physics")).await;
        let mine = check_focus_csv(&physics);
        assert!(!mine.is_empty());
        assert!(mine
            .iter()
            .all(|r| r["BillingAccountId"].as_deref() == Some("physics")));
        assert_eq!(
            mine.len(),
            checked
                .iter()
                .filter(|r| r["BillingAccountId"].as_deref() == Some("physics"))
                .count()
        );
    }
    // Every line of the ledger is in exactly one month's export.
    let all: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_charges")
        .fetch_one(sqlite.pool())
        .await
        .unwrap();
    assert_eq!(rows as i64, all);
    // A rebuild gives the same export.
    let (before, _) = export_text(&postgres, "2026-11", None).await;
    rebuild(&postgres, &*log.log).await.unwrap();
    assert_eq!(export_text(&postgres, "2026-11", None).await.0, before);
    sdb.finish().await;
    pdb.finish().await;
}

#[tokio::test]
async fn rounding_happens_once_and_keeps_the_identities() {
    let mut log = Log::new().await;
    log.site("hpc-eu", SiteKind::Slurm, "eu-central").await;
    let w = Uuid::now_v7();
    log.grant(
        "physics",
        AdjustmentScope::default(),
        AdjustmentTerms::PercentDiscount { percent: d("12.5") },
        t("2026-11-01T00:00:00Z"),
        None,
    )
    .await;
    // Ten minutes and half a second, starting mid-second: 8 × 600.5 s = 1.33444…
    // core-hours.
    log.run(
        "physics",
        w,
        "hpc-eu",
        "eval",
        1,
        &hpc_rate(Currency::EUR),
        &gpu_node(),
        t("2026-11-02T09:00:00.25Z"),
        t("2026-11-02T09:10:00.75Z"),
        End::Finished,
    )
    .await;
    // Across the month end: one row in each export.
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
    let (db, store) = Db::sqlite().await;
    catch_up(&store, &*log.log, &Ledger).await.unwrap();
    let (csv, json) = export_text(&store, "2026-11", None).await;
    let rows = check_focus_csv(&csv);
    check_json_matches(&json, &rows);
    let cores = rows
        .iter()
        .find(|r| {
            r["x_JobName"].as_deref() == Some("eval")
                && r["x_Meter"].as_deref() == Some("core_hours")
        })
        .unwrap();
    // 8 × 600.5 / 3600 = 1.334444…, to ten places.
    assert_eq!(cores["PricingQuantity"].as_deref(), Some("1.3344444444"));
    assert_eq!(cores["ConsumedQuantity"].as_deref(), Some("1.3344444444"));
    assert_eq!(cores["ListUnitPrice"].as_deref(), Some("0.05"));
    assert_eq!(cores["ContractedUnitPrice"].as_deref(), Some("0.04375"));
    assert_eq!(cores["ListCost"].as_deref(), Some("0.06672222222"));
    // 0.04375 × 1.3344444444, exactly.
    assert_eq!(cores["ContractedCost"].as_deref(), Some("0.0583819444425"));
    assert_eq!(cores["BilledCost"], cores["ContractedCost"]);
    assert_eq!(cores["EffectiveCost"], cores["ContractedCost"]);
    // Sub-second times widen to the whole seconds that hold them.
    assert_eq!(
        cores["ChargePeriodStart"].as_deref(),
        Some("2026-11-02T09:00:00Z")
    );
    assert_eq!(
        cores["ChargePeriodEnd"].as_deref(),
        Some("2026-11-02T09:10:01Z")
    );
    assert_eq!(cores["PricingUnit"].as_deref(), Some("Core-Hours"));
    assert_eq!(cores["ChargeClass"], None);
    assert_eq!(cores["RegionId"].as_deref(), Some("eu-central"));
    assert_eq!(cores["ServiceCategory"].as_deref(), Some("Compute"));
    let tags: Value = serde_json::from_str(cores["Tags"].as_deref().unwrap()).unwrap();
    assert_eq!(tags["job"], "eval");
    assert_eq!(tags["workflow"], w.to_string());
    assert_eq!(tags["site"], "hpc-eu");
    assert_eq!(tags["tenant"], "physics");
    assert!(cores["x_AdjustmentId"].is_some());
    // The spanning run: its November part starts at the month, its October part ends
    // there.
    let train_nov: Vec<_> = rows
        .iter()
        .filter(|r| r["x_JobName"].as_deref() == Some("train"))
        .collect();
    assert_eq!(train_nov.len(), 3);
    assert!(train_nov
        .iter()
        .all(|r| r["ChargePeriodStart"].as_deref() == Some("2026-11-01T00:00:00Z")));
    let (october, _) = export_text(&store, "2026-10", None).await;
    let october = check_focus_csv(&october);
    assert_eq!(october.len(), 3);
    assert!(october
        .iter()
        .all(|r| r["ChargePeriodEnd"].as_deref() == Some("2026-11-01T00:00:00Z")));
    assert!(october
        .iter()
        .all(|r| r["BillingPeriodEnd"].as_deref() == Some("2026-11-01T00:00:00Z")));
    // Before the discount started: list price.
    assert!(october.iter().all(|r| r["ListCost"] == r["ContractedCost"]));
    // An empty month is a header and nothing else.
    let (empty, empty_json) = export_text(&store, "2027-01", None).await;
    assert_eq!(empty, format!("{}\n", COLUMNS.join(",")));
    assert_eq!(empty_json, "[]\n");
    db.finish().await;
}
