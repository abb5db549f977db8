//! Hostile and malformed input: `parse` must answer every one of these with errors, never a
//! panic, a stack overflow or a runaway allocation.

use std::time::{Duration, Instant};

use meridian_spec::{parse, SpecErrors, MAX_DEPTH, MAX_DOCUMENT_BYTES};

/// The one document-level error of a document that must fail that way.
fn document_error(doc: &str) -> String {
    let errors: SpecErrors = parse(doc).expect_err("the document must be rejected");
    assert_eq!(errors.len(), 1, "{errors}");
    assert_eq!(errors.errors[0].path, "", "{errors}");
    errors.errors[0].message.clone()
}

const HELLO: &str =
    "version: v1\nname: hello\njobs:\n  hello:\n    image: host\n    command: [echo, hi]\n";

#[test]
fn empty_documents() {
    for doc in [
        "",
        "   ",
        "\n\n\t\n",
        "\u{feff}",
        "# only a comment\n",
        "---\n",
        "~",
        "null",
    ] {
        assert_eq!(document_error(doc), "document is empty", "{doc:?}");
    }
}

#[test]
fn not_yaml_or_json_gives_line_and_column() {
    assert_eq!(
        document_error("version: v1\nname: [unclosed\n"),
        "invalid YAML at line 2, column 7: unclosed bracket '['"
    );
    assert_eq!(
        document_error("a: b: c\n"),
        "invalid YAML at line 1, column 5: mapping values are not allowed in this context"
    );
    assert_eq!(
        document_error("{\"version\": \"v1\",\n \"name\": }"),
        "invalid JSON at line 2, column 10: expected value (a document that starts with \"{\" is read as JSON)"
    );
    assert_eq!(
        document_error("{\"version\": \"v1\"} trailing"),
        "invalid JSON at line 1, column 19: trailing characters (a document that starts with \"{\" is read as JSON)"
    );
    // Lines are counted from the top of the text, blank lines before the `{` included.
    let message = document_error("\n\n{\"version\": }");
    assert!(
        message.starts_with("invalid JSON at line 3, column 13:"),
        "{message}"
    );
    // A YAML flow mapping is read as JSON, and the message says so.
    assert_eq!(
        document_error("{version: v1}"),
        "invalid JSON at line 1, column 2: key must be a string (a document that starts with \"{\" is read as JSON)"
    );
}

#[test]
fn duplicate_keys_are_errors_in_both_syntaxes() {
    let yaml = document_error("version: v1\nname: a\nname: b\n");
    assert!(
        yaml.starts_with("invalid YAML at line 3, column 1:"),
        "{yaml}"
    );
    assert!(yaml.contains("duplicate"), "{yaml}");
    assert_eq!(
        document_error("{\"version\": \"v1\", \"name\": \"a\", \"name\": \"b\"}"),
        "invalid JSON at line 1, column 37: duplicate key \"name\""
    );
}

#[test]
fn multiple_yaml_documents() {
    let doc = format!("{HELLO}---\n{HELLO}");
    let message = document_error(&doc);
    assert!(
        message.starts_with("the file holds more than one YAML document"),
        "{message}"
    );
}

#[test]
fn oversized_documents_name_the_limit() {
    let mut doc = String::from(HELLO);
    doc.push_str(&"#".repeat(MAX_DOCUMENT_BYTES + 1 - doc.len()));
    assert_eq!(
        document_error(&doc),
        format!(
            "document is {} bytes; the limit is 1048576 bytes (1 MiB)",
            MAX_DOCUMENT_BYTES + 1
        )
    );
    // Exactly at the limit is still read.
    doc.pop();
    assert!(parse(&doc).is_ok());
}

fn nested_flow(open: &str, close: &str, depth: usize) -> String {
    format!("{}{}", open.repeat(depth), close.repeat(depth))
}

#[test]
fn deep_nesting_names_the_limit() {
    let limit = format!("document is nested deeper than the limit of {MAX_DEPTH} levels");
    // 100,000 levels of YAML flow lists, unclosed and closed.
    for doc in ["[".repeat(100_000), nested_flow("[", "]", 100_000)] {
        let message = document_error(&doc);
        assert!(message.starts_with(&limit), "{message}");
    }
    // JSON objects and lists.
    let json = format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
    assert!(document_error(&json).starts_with(&limit));
    let json = format!("{{\"a\":{}", nested_flow("[", "]", 100_000));
    assert!(document_error(&json).starts_with(&limit));
    // YAML block mappings and block lists.
    let block: String = (0..1_000)
        .map(|i| format!("{}a:\n", " ".repeat(i)))
        .collect();
    assert!(document_error(&block).starts_with(&limit));
    let dashes = format!("{}x\n", "- ".repeat(10_000));
    assert!(document_error(&dashes).starts_with(&limit));
}

#[test]
fn depth_limit_is_exact_and_the_same_for_yaml_and_json() {
    // `labels` holds the nesting; the top-level mapping is level 1.
    let at = |levels: usize, json: bool| {
        let inner = nested_flow("[", "]", levels - 1);
        if json {
            format!("{{\"version\": \"v1\", \"labels\": {inner}}}")
        } else {
            format!("version: v1\nlabels: {inner}\n")
        }
    };
    for json in [false, true] {
        let ok = parse(&at(MAX_DEPTH, json)).unwrap_err().to_string();
        assert!(!ok.contains("nested deeper"), "{ok}");
        let too_deep = document_error(&at(MAX_DEPTH + 1, json));
        assert!(too_deep.contains("nested deeper"), "{too_deep}");
    }
}

#[test]
fn billion_laughs_is_refused_quickly() {
    let mut doc = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for pair in names.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        let refs = vec![format!("*{prev}"); 9].join(",");
        doc.push_str(&format!("{next}: &{next} [{refs}]\n"));
    }
    let start = Instant::now();
    let message = document_error(&doc);
    assert!(message.contains("YAML alias"), "{message}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );

    // Many alias uses of a small anchor are refused by count as well.
    let mut doc = String::from("version: v1\nname: x\nlabels: &l {a: b}\nextra: [");
    doc.push_str(&vec!["*l"; 5_000].join(","));
    doc.push_str("]\n");
    let message = document_error(&doc);
    assert!(message.contains("YAML alias"), "{message}");
}

#[test]
fn modest_aliases_are_fine() {
    let doc = r#"
version: v1
name: anchors
jobs:
  a: &base
    image: host
    command: [echo, a]
    resources: &res {cpus: 2, memory: 4GiB}
  b:
    <<: *base
    command: [echo, b]
    resources: *res
"#;
    let w = parse(doc).unwrap();
    assert_eq!(w.jobs["b"].resources.cpus, 2);
    assert_eq!(w.jobs["b"].command, ["echo", "b"]);
}

/// A small deterministic generator, so the fuzz loops need no extra crates.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn garbage_never_panics() {
    let fixed = [
        "\0",
        "\0\0\0{",
        "{",
        "}",
        "[",
        "]",
        ":",
        "-",
        "---",
        "...",
        "&",
        "*",
        "*a",
        "&a [*a]",
        "a: *undefined",
        "!!binary x",
        "!!int abc",
        "? ? ? ?",
        "a: !!float .nan",
        "a: .inf",
        "\t\t\t",
        "'",
        "\"",
        "\"\\u",
        "{\"a\": \"\\ud800\"}",
        "%YAML 1.2\n---\na: 1",
        "%TAG ! tag:x,2000:\n---\n!a b",
        "<<: 1",
        "<<: [1, 2]",
        "a:\n  - b\n - c",
        "- &a\n- *a",
        "version: v1\nname: x\njobs:\n  x: {image: host, command: [a], resources: {gpus: {count: 1e309}}}",
        "version: v1\nname: x\njobs:\n  x: {image: host, command: [a], resources: {cpus: -1e300}}",
        "{\"version\": \"v1\", \"jobs\": {\"x\": {\"array\": {\"start\": 0, \"end\": 4294967295, \"parallelism\": 1}}}}",
        "\u{feff}{\"version\": \"v1\"}",
        "\u{202e}\u{200b}",
        "🦀: 🦀",
    ];
    for doc in fixed {
        let _ = parse(doc);
    }

    // Random documents over an alphabet heavy in YAML and JSON punctuation.
    let alphabet: Vec<char> = "{}[]:,-?&*!|>'\"#%@` \n\t\\abcvxyz0123456789.+~\u{0}é🦀"
        .chars()
        .collect();
    let mut rng = Lcg(42);
    for _ in 0..3_000 {
        let len = rng.below(120);
        let doc: String = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        let _ = parse(&doc);
    }
}

#[test]
fn mutated_examples_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            sources.push(std::fs::read_to_string(&path).unwrap());
        }
    }
    assert!(!sources.is_empty());
    let inserts = [
        "[", "]", "{", "}", ":", "- ", "\n", "  ", "*", "&x ", "0", "-1", "\"", "~", "\t",
    ];
    let mut rng = Lcg(3);
    for round in 0..1_500 {
        let source = &sources[round % sources.len()];
        let mut chars: Vec<char> = source.chars().collect();
        for _ in 0..1 + rng.below(4) {
            if chars.is_empty() {
                break;
            }
            let at = rng.below(chars.len());
            match rng.below(3) {
                0 => {
                    chars.remove(at);
                }
                1 => {
                    let insert = inserts[rng.below(inserts.len())];
                    for (i, c) in insert.chars().enumerate() {
                        chars.insert(at + i, c);
                    }
                }
                _ => {
                    let other = rng.below(chars.len());
                    chars.swap(at, other);
                }
            }
        }
        let doc: String = chars.into_iter().collect();
        // Whatever the outcome, it must be an answer; errors must carry messages.
        if let Err(errors) = parse(&doc) {
            assert!(!errors.is_empty());
            assert!(errors.iter().all(|e| !e.message.is_empty()));
        }
    }
}
