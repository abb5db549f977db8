//! The checked-in OpenAPI document must be what `openapi_json()` generates today.

use std::fs;
use std::path::Path;

#[test]
fn checked_in_openapi_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/openapi.json");
    let generated = meridian_intake::openapi_json();
    if std::env::var("MERIDIAN_UPDATE_SCHEMAS").as_deref() == Ok("1") {
        fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "schemas/openapi.json is out of date with the handlers and types in services/intake; \
         regenerate it with\n  \
         MERIDIAN_UPDATE_SCHEMAS=1 cargo test -p meridian-intake --test openapi\n\
         and commit the result"
    );
}

#[test]
fn openapi_describes_every_route() {
    let doc: serde_json::Value = serde_json::from_str(&meridian_intake::openapi_json()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/workflows", "post"),
        ("/v1/workflows", "get"),
        ("/v1/workflows/{id}", "get"),
        ("/v1/workflows/{id}/cancel", "post"),
        ("/v1/workflows/{id}/events", "get"),
        ("/v1/health", "get"),
        ("/v1/workflows/{id}/bill", "get"),
        ("/v1/tenants/{tenant}/bills", "get"),
        ("/v1/exports/focus", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is missing from the OpenAPI document"
        );
    }
    let submit = &paths["/v1/workflows"]["post"];
    for content_type in meridian_intake::WORKFLOW_CONTENT_TYPES {
        assert!(
            submit["requestBody"]["content"].get(content_type).is_some(),
            "{content_type} is not an accepted request body"
        );
    }
    for status in ["200", "202", "400", "413", "415", "422"] {
        assert!(
            submit["responses"].get(status).is_some(),
            "no {status} response"
        );
    }
    let export = &paths["/v1/exports/focus"]["get"]["responses"]["200"]["content"];
    for content_type in ["text/csv", "application/json"] {
        assert!(
            export.get(content_type).is_some(),
            "the FOCUS export does not describe {content_type}"
        );
    }
    let states = &doc["components"]["schemas"]["WorkflowState"]["enum"];
    assert_eq!(
        states,
        &serde_json::json!([
            "submitted",
            "waiting",
            "placed",
            "running",
            "finished",
            "failed",
            "cancelling",
            "cancelled",
            "rejected"
        ])
    );
}
