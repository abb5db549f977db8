//! The corpus: scripts and Fuzzfiles in the shapes people write them, each with the
//! workflow and the notes its import gives, pinned in `corpus/**/*.expected`
//! (`MERIDIAN_UPDATE_GOLDEN=1` rewrites them). Each imported workflow also goes through
//! `meridian_spec::parse` as text, as `meridian submit` would send it.

use std::path::Path;

use meridian_import::{detect, import, Format};

fn render(format: Format, path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let file = path.file_name().unwrap().to_str().unwrap();
    let imported = import(format, &text, file).unwrap_or_else(|e| panic!("{file}: {:#?}", e.0));
    let yaml = serde_saphyr::to_string(&imported.workflow).unwrap();
    let reparsed = meridian_spec::parse(&yaml)
        .unwrap_or_else(|e| panic!("{file}: the YAML printed does not parse: {e:?}\n{yaml}"));
    assert_eq!(reparsed, imported.workflow, "{file}: YAML round trip");
    let mut out = String::from("# notes\n");
    for note in &imported.notes {
        out.push_str(&format!("# {note}\n"));
    }
    out.push_str(&yaml);
    out
}

fn corpus(dir: &str, format: Format) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(dir);
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e != "expected"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 4, "the corpus is in {}", root.display());
    let mut stale = Vec::new();
    for case in cases {
        let got = render(format, &case);
        let expected_path = case.with_extension("expected");
        if std::env::var_os("MERIDIAN_UPDATE_GOLDEN").is_some() {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            stale.push(format!(
                "{}:\n--- expected\n{expected}\n--- got\n{got}",
                case.display()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "imports differ from their golden files (MERIDIAN_UPDATE_GOLDEN=1 cargo test -p meridian-import --test corpus rewrites them):\n{}",
        stale.join("\n")
    );
}

#[test]
fn sbatch_scripts_import_as_their_golden_files() {
    corpus("sbatch", Format::Sbatch);
}

#[test]
fn fuzzfiles_import_as_their_golden_files() {
    corpus("fuzzfile", Format::Fuzzfile);
}

#[test]
fn the_format_is_told_by_its_shape() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(
        detect(&read("sbatch/array-capped.sh")),
        Some(Format::Sbatch)
    );
    assert_eq!(
        detect(&read("sbatch/windows-crlf.sh")),
        Some(Format::Sbatch)
    );
    // No directives: a plain shell script, which only `meridian import sbatch` takes.
    assert_eq!(detect(&read("sbatch/no-directives.sh")), None);
    assert_eq!(detect(&read("fuzzfile/hello.yaml")), Some(Format::Fuzzfile));
    assert_eq!(
        detect(&read("fuzzfile/service.yaml")),
        Some(Format::Fuzzfile)
    );
    let workflow = "version: v1\nname: w\njobs:\n  a:\n    image: host\n    command: [true]\n";
    assert_eq!(detect(workflow), None);
}
