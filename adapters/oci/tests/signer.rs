//! The signer against the test vector OCI's "Request Signatures" documentation publishes
//! (its test key, in `tests/keys/`, a GET and a POST on 5 January 2014).

use meridian_adapter_oci::signer::{signing_string, Body, Signer};

const TENANCY: &str =
    "ocid1.tenancy.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq";
const USER: &str = "ocid1.user.oc1..aaaaaaaat5nvwcna5j6aqzjcaty5eqbb6qt2jvpkanghtgdaqedqw3rynjq";
const FINGERPRINT: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";
const DATE: &str = "Thu, 05 Jan 2014 21:31:40 GMT";
const HOST: &str = "iaas.us-phoenix-1.oraclecloud.com";

const GET_TARGET: &str = "/20160918/instances?availabilityDomain=Pjwf%3A%20PHX-AD-1&compartmentId=ocid1.compartment.oc1..aaaaaaaam3we6vgnherjq5q2idnccdflvjsnog7mlr6rtdb25gilchfeyjxa&displayName=TeamXInstances&volumeId=ocid1.volume.oc1.phx.abyhqljrgvttnlx73nmrwfaux7kcvzfs3s66izvxf2h4lgvyndsdsnoiwr5q";

const POST_BODY: &str = "{\n    \"compartmentId\": \"ocid1.compartment.oc1..aaaaaaaam3we6vgnherjq5q2idnccdflvjsnog7mlr6rtdb25gilchfeyjxa\",\n    \"instanceId\": \"ocid1.instance.oc1.phx.abuw4ljrlsfiqw6vzzxb43vyypt4pkodawglp3wqxjqofakrwvou52gb6s5a\",\n    \"volumeId\": \"ocid1.volume.oc1.phx.abyhqljrgvttnlx73nmrwfaux7kcvzfs3s66izvxf2h4lgvyndsdsnoiwr5q\"\n}";

fn signer() -> Signer {
    let pem = include_str!("keys/oci-doc-test-key.pem");
    Signer::new(TENANCY, USER, FINGERPRINT, pem).unwrap()
}

#[test]
fn a_get_signs_date_target_and_host_as_documented() {
    let (headers, text) = signing_string("GET", GET_TARGET, HOST, DATE, None);
    assert_eq!(headers, "date (request-target) host");
    assert_eq!(
        text,
        format!("date: {DATE}\n(request-target): get {GET_TARGET}\nhost: {HOST}")
    );
    let signed = signer().sign("GET", GET_TARGET, HOST, DATE, None);
    assert_eq!(signed.content_sha256, None);
    assert_eq!(
        signed.authorization,
        format!(
            "Signature version=\"1\",headers=\"date (request-target) host\",keyId=\"{TENANCY}/{USER}/{FINGERPRINT}\",algorithm=\"rsa-sha256\",signature=\"GBas7grhyrhSKHP6AVIj/h5/Vp8bd/peM79H9Wv8kjoaCivujVXlpbKLjMPeDUhxkFIWtTtLBj3sUzaFj34XE6YZAHc9r2DmE4pMwOAy/kiITcZxa1oHPOeRheC0jP2dqbTll8fmTZVwKZOKHYPtrLJIJQHJjNvxFWeHQjMaR7M=\""
        )
    );
}

#[test]
fn a_post_also_signs_its_length_type_and_body_digest_as_documented() {
    assert_eq!(POST_BODY.len(), 316);
    let signed = signer().sign(
        "POST",
        "/20160918/volumeAttachments",
        HOST,
        DATE,
        Some(Body {
            bytes: POST_BODY.as_bytes(),
            content_type: "application/json",
        }),
    );
    assert_eq!(
        signed.content_sha256.as_deref(),
        Some("V9Z20UJTvkvpJ50flBzKE32+6m2zJjweHpDMX/U4Uy0=")
    );
    let (_, text) = signing_string(
        "POST",
        "/20160918/volumeAttachments",
        HOST,
        DATE,
        Some((
            316,
            "application/json",
            "V9Z20UJTvkvpJ50flBzKE32+6m2zJjweHpDMX/U4Uy0=",
        )),
    );
    assert_eq!(
        text,
        format!("date: {DATE}\n(request-target): post /20160918/volumeAttachments\nhost: {HOST}\ncontent-length: 316\ncontent-type: application/json\nx-content-sha256: V9Z20UJTvkvpJ50flBzKE32+6m2zJjweHpDMX/U4Uy0=")
    );
    assert_eq!(
        signed.authorization,
        format!(
            "Signature version=\"1\",headers=\"date (request-target) host content-length content-type x-content-sha256\",keyId=\"{TENANCY}/{USER}/{FINGERPRINT}\",algorithm=\"rsa-sha256\",signature=\"Mje8vIDPlwIHmD/cTDwRxE7HaAvBg16JnVcsuqaNRim23fFPgQfLoOOxae6WqKb1uPjYEl0qIdazWaBy/Ml8DRhqlocMwoSXv0fbukP8J5N80LCmzT/FFBvIvTB91XuXI3hYfP9Zt1l7S6ieVadHUfqBedWH0itrtPJBgKmrWso=\""
        )
    );
}

#[test]
fn a_key_that_is_not_an_unencrypted_rsa_key_is_refused_saying_why() {
    let e = Signer::new(TENANCY, USER, FINGERPRINT, "not a key").unwrap_err();
    assert!(e.contains("not an RSA private key in PEM"), "{e}");
    let e = Signer::new(
        TENANCY,
        USER,
        FINGERPRINT,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap_err();
    assert!(e.contains("encrypted"), "{e}");
    // The key never shows in a debug print.
    let shown = format!("{:?}", signer());
    assert!(
        shown.contains(FINGERPRINT) && !shown.contains("MIIC"),
        "{shown}"
    );
}
