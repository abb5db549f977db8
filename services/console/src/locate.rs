//! Where a field is in a YAML document: the line of a spec error's path
//! (`jobs.train.resources.gpus.vendor`, `jobs.prep.command[0]`), so the console shows
//! each error beside the line it is about. Block-style YAML is followed key by key by
//! indentation; a path it cannot follow (flow style, JSON on one line) falls back to the
//! deepest key it found.

/// The 1-based line of `path` in `doc`, or `None` for a document-wide problem (empty
/// path) or a path whose first key is not in the document.
pub fn line_of(doc: &str, path: &str) -> Option<usize> {
    let keys = segments(path);
    if keys.is_empty() {
        return None;
    }
    let lines: Vec<&str> = doc.lines().collect();
    let mut found = None;
    // Where the current parent's children may be: after `from`, indented more than
    // `parent_indent`, until a line indented as little as the parent.
    let mut from = 0;
    let mut parent_indent: Option<usize> = None;
    for key in &keys {
        let mut hit = None;
        // Only the parent's direct children count: the lines at the first child's indent.
        let mut child_indent = None;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            if parent_indent.is_some_and(|p| indent <= p) {
                break;
            }
            if *child_indent.get_or_insert(indent) != indent {
                continue;
            }
            let item = trimmed.trim_start_matches("- ");
            let name = match key {
                Segment::Key(k) => k.as_str(),
                Segment::Index(_) => continue,
            };
            if let Some(rest) = item.strip_prefix(name).or_else(|| {
                item.strip_prefix(&format!("\"{name}\""))
                    .or_else(|| item.strip_prefix(&format!("'{name}'")))
            }) {
                if rest.trim_start().starts_with(':') {
                    hit = Some((i, indent));
                    break;
                }
            }
        }
        match (key, hit) {
            (Segment::Key(_), Some((i, indent))) => {
                found = Some(i + 1);
                from = i + 1;
                parent_indent = Some(indent);
            }
            (Segment::Index(n), _) => {
                // The n-th `- ` item under the current key, when written as a block list.
                let mut seen = 0;
                let mut item_indent = None;
                for (i, line) in lines.iter().enumerate().skip(from) {
                    let trimmed = line.trim_start();
                    let indent = line.len() - trimmed.len();
                    if trimmed.is_empty() {
                        continue;
                    }
                    if parent_indent.is_some_and(|p| indent <= p) && !trimmed.starts_with("- ") {
                        break;
                    }
                    let item = trimmed.starts_with("- ") || trimmed == "-";
                    // Only the list's own items, not those of lists inside them.
                    if item && *item_indent.get_or_insert(indent) == indent {
                        if seen == *n {
                            found = Some(i + 1);
                            from = i + 1;
                            parent_indent = Some(indent);
                            break;
                        }
                        seen += 1;
                    }
                }
            }
            (Segment::Key(_), None) => break,
        }
    }
    found
}

#[derive(Debug, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `a.b[0]["c d"]` → `a`, `b`, 0, `c d`.
fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut chars = path.chars().peekable();
    let mut key = String::new();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !key.is_empty() {
                    out.push(Segment::Key(std::mem::take(&mut key)));
                }
            }
            '[' => {
                if !key.is_empty() {
                    out.push(Segment::Key(std::mem::take(&mut key)));
                }
                let mut inside = String::new();
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    inside.push(c);
                }
                match inside.parse::<usize>() {
                    Ok(n) => out.push(Segment::Index(n)),
                    Err(_) => out.push(Segment::Key(inside.trim_matches('"').to_string())),
                }
            }
            other => key.push(other),
        }
    }
    if !key.is_empty() {
        out.push(Segment::Key(key));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "version: v1\nname: demo\njobs:\n  prep:\n    image: host\n    command:\n      - sh\n      - -c\n  train:\n    image: host\n    resources:\n      gpus: {count: 1}\n      cpus: 2\n";

    #[test]
    fn keys_and_list_items_are_found_by_indentation() {
        assert_eq!(line_of(DOC, "name"), Some(2));
        assert_eq!(line_of(DOC, "jobs.prep.command"), Some(6));
        assert_eq!(line_of(DOC, "jobs.prep.command[1]"), Some(8));
        assert_eq!(line_of(DOC, "jobs.train.resources.cpus"), Some(13));
        // `image` under train, not prep's.
        assert_eq!(line_of(DOC, "jobs.train.image"), Some(10));
    }

    #[test]
    fn a_key_is_a_direct_child_not_a_deeper_one_of_the_same_name() {
        let doc = "jobs:\n  t:\n    resources:\n      gpus:\n        memory: 80GiB\n      memory: 1GiB\n    command:\n      - - nested\n      - second\n";
        assert_eq!(line_of(doc, "jobs.t.resources.memory"), Some(6));
        assert_eq!(line_of(doc, "jobs.t.resources.gpus.memory"), Some(5));
        assert_eq!(line_of(doc, "jobs.t.command[1]"), Some(9));
    }

    #[test]
    fn an_unfollowable_path_falls_back_to_the_deepest_key_found() {
        // Inside a flow mapping: the line of `gpus`.
        assert_eq!(line_of(DOC, "jobs.train.resources.gpus.vendor"), Some(12));
        assert_eq!(line_of(DOC, "jobs.nope.image"), Some(3));
        assert_eq!(line_of(DOC, ""), None);
        assert_eq!(line_of(DOC, "volumes.x"), None);
    }

    #[test]
    fn quoted_keys_are_read() {
        assert_eq!(
            segments("jobs[\"a b\"].command[0]"),
            [
                Segment::Key("jobs".into()),
                Segment::Key("a b".into()),
                Segment::Key("command".into()),
                Segment::Index(0)
            ]
        );
    }
}
