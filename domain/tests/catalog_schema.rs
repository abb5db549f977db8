//! The checked-in JSON Schema of catalogue files must be what `json_schema()` generates
//! today, and must describe the reference catalogue.

use std::fs;
use std::path::Path;

#[test]
fn checked_in_catalog_schema_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/catalog.schema.json");
    let generated =
        serde_json::to_string_pretty(&meridian_domain::catalog_file::json_schema()).unwrap() + "\n";
    if std::env::var("MERIDIAN_UPDATE_SCHEMAS").as_deref() == Ok("1") {
        fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "schemas/catalog.schema.json is out of date with domain/src/catalog_file.rs; regenerate it with\n  \
         MERIDIAN_UPDATE_SCHEMAS=1 cargo test -p meridian-domain --test catalog_schema\n\
         and commit the result"
    );
}

#[test]
fn the_schema_names_what_a_site_needs() {
    let schema = meridian_domain::catalog_file::json_schema();
    assert_eq!(schema["required"], serde_json::json!(["sites"]));
    assert_eq!(schema["additionalProperties"], false);
    let site = &schema["$defs"]["Site"];
    assert_eq!(
        site["required"],
        serde_json::json!(["name", "kind", "region", "jurisdiction", "prices"])
    );
    assert_eq!(site["properties"]["kind"]["enum"][1], "slurm");
    // Every site of the reference catalogue has only the fields the schema names.
    let reference: serde_json::Value =
        serde_saphyr::from_str(meridian_domain::catalog_file::REFERENCE).unwrap();
    let fields: Vec<&String> = site["properties"].as_object().unwrap().keys().collect();
    for s in reference["sites"].as_array().unwrap() {
        for key in s.as_object().unwrap().keys() {
            assert!(fields.contains(&key), "{key} is not in the schema");
        }
    }
}
