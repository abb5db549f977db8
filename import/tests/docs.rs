//! `docs/import.md` lists every sbatch option with what the import does with it, from
//! the import's own table: the two cannot drift apart.

use meridian_import::sbatch::{Takes, Treatment, OPTIONS};

fn table() -> String {
    let mut out = String::from("| Option | Short | Import | Why |\n|---|---|---|---|\n");
    let mut options: Vec<_> = OPTIONS.iter().collect();
    options.sort_by_key(|o| o.long);
    for o in options {
        let long = match o.takes {
            Takes::Nothing => format!("`--{}`", o.long),
            Takes::Value => format!("`--{}=…`", o.long),
            Takes::Optional => format!("`--{}[=…]`", o.long),
        };
        let short = o.short.map(|c| format!("`-{c}`")).unwrap_or_default();
        let (what, why) = match o.treatment {
            Treatment::Mapped => ("mapped", "see above"),
            Treatment::Ignored(why) => ("ignored", why),
            Treatment::Refused(why) => ("refused", why),
        };
        out.push_str(&format!("| {long} | {short} | {what} | {why} |\n"));
    }
    out
}

#[test]
fn the_docs_list_every_sbatch_option_as_the_import_treats_it() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/import.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let (begin, end) = (
        "<!-- sbatch-options: begin -->\n",
        "<!-- sbatch-options: end -->",
    );
    let start = doc.find(begin).expect("the begin marker") + begin.len();
    let stop = doc.find(end).expect("the end marker");
    let wanted = table();
    if std::env::var("MERIDIAN_UPDATE_DOCS").as_deref() == Ok("1") {
        let updated = format!("{}{wanted}{}", &doc[..start], &doc[stop..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    let differs = doc[start..stop]
        .lines()
        .zip(wanted.lines())
        .find(|(have, want)| have != want);
    assert!(
        differs.is_none() && doc[start..stop].lines().count() == wanted.lines().count(),
        "docs/import.md's option table is stale (first difference: {differs:?}): \
         MERIDIAN_UPDATE_DOCS=1 cargo test -p meridian-import --test docs"
    );
}
