//! The checked-in JSON Schema must be what `json_schema()` generates today.

use std::fs;
use std::path::Path;

#[test]
fn checked_in_schema_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/workflow.schema.json");
    let generated = serde_json::to_string_pretty(&meridian_spec::json_schema()).unwrap() + "\n";
    if std::env::var("MERIDIAN_UPDATE_SCHEMAS").as_deref() == Ok("1") {
        fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "schemas/workflow.schema.json is out of date with the types in spec/src; regenerate it with\n  \
         MERIDIAN_UPDATE_SCHEMAS=1 cargo test -p meridian-spec --test schema\n\
         and commit the result"
    );
}

#[test]
fn schema_describes_the_v1_shape() {
    let schema = meridian_spec::json_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["required"], serde_json::json!(["version", "name"]));
    assert_eq!(schema["additionalProperties"], false);
    let defs = &schema["$defs"];
    assert_eq!(
        defs["GpuVendor"]["enum"],
        serde_json::json!(["nvidia", "amd", "any"])
    );
    assert_eq!(defs["Size"]["type"], "string");
    assert_eq!(defs["Size"]["pattern"], meridian_spec::SIZE_PATTERN);
    assert_eq!(defs["Walltime"]["pattern"], meridian_spec::WALLTIME_PATTERN);
    assert_eq!(defs["Money"]["pattern"], meridian_spec::MONEY_PATTERN);
    assert_eq!(defs["Image"]["type"], "string");
    assert_eq!(defs["Resources"]["properties"]["memory"]["default"], "2GiB");
    assert_eq!(defs["Resources"]["properties"]["walltime"]["default"], "1h");
    assert_eq!(defs["Service"]["properties"]["port"]["minimum"], 1);
}
