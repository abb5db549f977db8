//! The text formats the API takes in its bodies and queries, each one pattern: the
//! OpenAPI document states it and the server checks it, so what the document allows is
//! exactly what is accepted.

use std::sync::LazyLock;

use meridian_events::Money;
use regex::Regex;
use rust_decimal::Decimal;

use crate::AppError;

/// An amount above zero and a currency code: `500 USD`, `0.25 EUR`.
pub const POSITIVE_MONEY: &str =
    r"^([1-9][0-9]{0,14}(\.[0-9]{1,12})?|0\.[0-9]{0,11}[1-9][0-9]{0,11}) [A-Z]{3}$";

/// A number of hours, zero or more: `500`, `0.5`.
pub const HOURS: &str = r"^(0|[1-9][0-9]{0,11})(\.[0-9]{1,6})?$";

/// A decimal of zero or more: `10`, `1.80`.
pub const DECIMAL: &str = r"^(0|[1-9][0-9]{0,14})(\.[0-9]{1,12})?$";

/// An ISO 4217 currency code: `USD`.
pub const CURRENCY: &str = r"^[A-Z]{3}$";

/// A site, region or jurisdiction name in a policy: `eu`, `aws-us-east-1`.
pub const PLACE_NAME: &str = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$";

fn compiled(pattern: &'static str) -> Regex {
    Regex::new(pattern).expect("the API's patterns compile")
}

static POSITIVE_MONEY_RE: LazyLock<Regex> = LazyLock::new(|| compiled(POSITIVE_MONEY));
static HOURS_RE: LazyLock<Regex> = LazyLock::new(|| compiled(HOURS));
static PLACE_NAME_RE: LazyLock<Regex> = LazyLock::new(|| compiled(PLACE_NAME));
static DECIMAL_RE: LazyLock<Regex> = LazyLock::new(|| compiled(DECIMAL));

/// `text` as a decimal of zero or more, or why `field` is not one.
pub fn decimal(field: &str, text: &str) -> Result<Decimal, AppError> {
    let bad = || refuse(field, "a decimal such as \"1.80\"", text);
    if !DECIMAL_RE.is_match(text) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

/// `text` as a currency code, or why `field` is not one.
pub fn currency(field: &str, text: &str) -> Result<meridian_events::Currency, AppError> {
    meridian_events::Currency::new(text).map_err(|_| {
        refuse(
            field,
            "a currency code of three capital letters such as \"USD\"",
            text,
        )
    })
}

fn refuse(field: &str, expected: &str, got: &str) -> AppError {
    AppError::BadRequest(format!("{field}: expected {expected}; got {got:?}"))
}

/// `text` as an amount above zero, or why `field` is not one.
pub fn positive_money(field: &str, text: &str) -> Result<Money, AppError> {
    let bad = || {
        refuse(
            field,
            "an amount above zero and a currency code such as \"500 USD\"",
            text,
        )
    };
    if !POSITIVE_MONEY_RE.is_match(text) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

/// `text` as a number of hours, or why `field` is not one.
pub fn hours(field: &str, text: &str) -> Result<Decimal, AppError> {
    let bad = || refuse(field, "a number of hours such as \"500\"", text);
    if !HOURS_RE.is_match(text) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

/// `text` as a site, region or jurisdiction name, or why `field` holds none.
pub fn place_name(field: &str, text: &str) -> Result<String, AppError> {
    if PLACE_NAME_RE.is_match(text) {
        Ok(text.to_string())
    } else {
        Err(refuse(
            field,
            "a name of 1 to 63 letters, digits, \".\", \"_\" or \"-\", starting with a letter or digit",
            text,
        ))
    }
}

/// A JSON body as `T`: an object (or `null` where `T` takes one), whose integral numbers
/// written as decimals (`2.0`) count as the integers JSON Schema says they are. A wrong
/// field is named by its path.
pub fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, AppError> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| AppError::BadRequest(format!("invalid {what}: not JSON: {e}")))?;
    if !matches!(
        value,
        serde_json::Value::Object(_) | serde_json::Value::Null
    ) {
        return Err(AppError::BadRequest(format!(
            "invalid {what}: expected a JSON object"
        )));
    }
    integral_numbers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            AppError::BadRequest(format!("invalid {what}: {inner}"))
        } else {
            AppError::BadRequest(format!("{path}: {inner}"))
        }
    })
}

/// Turns every number written with a fraction of zero (`2.0`, `1e3`) into the integer it
/// is, where it fits one.
fn integral_numbers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                *value = serde_json::Value::from(f as i64);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_above_zero_only_as_the_pattern_says() {
        for ok in [
            "500 USD",
            "0.25 EUR",
            "1.5 GBP",
            "0.001 USD",
            "999999999999999 JPY",
        ] {
            assert!(positive_money("b", ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "0 USD", "0.0 USD", "-1 USD", " 500 USD", "500 usd", "500  USD", "01 USD",
            "1e3 USD", "500", "500 USDX", "1.5. USD",
        ] {
            let err = positive_money("b", bad).unwrap_err().to_string();
            assert!(err.starts_with("b: expected"), "{bad}: {err}");
        }
    }

    #[test]
    fn hours_and_names() {
        assert_eq!(hours("h", "0.5").unwrap(), Decimal::new(5, 1));
        for bad in ["", "-1", "1e3", "01", ".5", "1."] {
            assert!(hours("h", bad).is_err(), "{bad}");
        }
        assert!(place_name("sites", "aws-us-east-1").is_ok());
        for bad in ["", " eu", "-x", "a b", &"x".repeat(64)] {
            assert!(place_name("sites", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bodies_are_objects_and_integral_decimals_are_integers() {
        #[derive(serde::Deserialize, Debug)]
        struct Limits {
            n: Option<u32>,
        }
        let l: Limits = json_body(br#"{"n": 7.0}"#, "limits").unwrap();
        assert_eq!(l.n, Some(7));
        let err = json_body::<Limits>(b"[null, null]", "limits").unwrap_err();
        assert!(err.to_string().contains("expected a JSON object"), "{err}");
        let err = json_body::<Limits>(br#"{"n": 7.5}"#, "limits").unwrap_err();
        assert!(err.to_string().starts_with("n: "), "{err}");
        let none: Option<Limits> = json_body(b"null", "limits").unwrap();
        assert!(none.is_none());
    }
}

/// The OpenAPI schemas of these formats, for `#[schema(schema_with = …)]`.
pub mod schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    use utoipa::openapi::{Array, Object};

    fn text(pattern: &str, nullable: bool, description: &str) -> Object {
        let kind = match nullable {
            true => SchemaType::from_iter([Type::String, Type::Null]),
            false => SchemaType::Type(Type::String),
        };
        ObjectBuilder::new()
            .schema_type(kind)
            .pattern(Some(pattern))
            .description(Some(description))
            .build()
    }

    pub fn place_names() -> Array {
        ArrayBuilder::new()
            .items(text(super::PLACE_NAME, false, "A name"))
            .description(Some("Names; empty or absent: any"))
            .build()
    }

    pub fn optional_place_name() -> Object {
        text(super::PLACE_NAME, true, "A name such as `eu`")
    }

    pub fn optional_positive_money() -> Object {
        text(
            super::POSITIVE_MONEY,
            true,
            "An amount above zero and a currency code, such as `500 USD`",
        )
    }

    fn one_of(values: &[&str], description: &str) -> Object {
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .enum_values(Some(values.iter().copied()))
            .description(Some(description))
            .build()
    }

    /// The roles a token may be issued for (a job's role is never issued).
    pub fn issued_role() -> Object {
        one_of(
            &["researcher", "finance", "admin", "agent"],
            "`researcher`, `finance`, `admin` or `agent`",
        )
    }

    /// A run's output stream as its route names it (`PUT /v1/runs/{job}/output/{stream}`).
    pub struct OutputStream;

    impl utoipa::PartialSchema for OutputStream {
        fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
            one_of(&["stdout", "stderr"], "`stdout` or `stderr`").into()
        }
    }

    impl utoipa::ToSchema for OutputStream {}

    pub fn grants() -> Array {
        ArrayBuilder::new()
            .items(one_of(&["submit", "cancel"], "A write action"))
            .description(Some("For an agent: the write actions it may do"))
            .build()
    }

    pub fn decimal() -> Object {
        text(
            super::DECIMAL,
            false,
            "A decimal of zero or more, such as `1.80`",
        )
    }

    pub fn currency() -> Object {
        text(super::CURRENCY, false, "A currency code such as `USD`")
    }

    pub fn meter() -> Object {
        one_of(
            &[
                "instance_hours",
                "core_hours",
                "memory_gib_hours",
                "gpu_hours",
                "storage_gib_hours",
                "egress_gb",
            ],
            "What is priced",
        )
    }

    fn optional_one_of(values: &[&str], description: &str) -> Object {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .enum_values(Some(values.iter().map(|v| Some(*v)).chain([None])))
            .description(Some(description))
            .build()
    }

    pub fn optional_site_kind() -> Object {
        optional_one_of(
            &[
                "local",
                "slurm",
                "pbs",
                "kubernetes",
                "coreweave",
                "aws",
                "gcp",
                "azure",
                "oci",
            ],
            "A kind of site",
        )
    }

    pub fn optional_charge() -> Object {
        optional_one_of(&["compute", "storage", "egress"], "A kind of charge")
    }

    pub fn optional_hours() -> Object {
        text(super::HOURS, true, "A number of hours, such as `500`")
    }
}
