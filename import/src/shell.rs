//! The little of the POSIX shell's word rules an import needs: splitting a directive
//! line into words (quoting a word back is `meridian_adapter_core::batch::shell_quote`).

/// Splits `line` into words as `sh` would without expansions: blanks separate words,
/// single quotes keep everything, double quotes keep all but `\"` and `\\`, a backslash
/// outside quotes keeps the next character, and an unquoted `#` starting a word begins
/// a comment. An unterminated quote is an error.
pub(crate) fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("a single quote is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("a double quote is not closed".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("a double quote is not closed".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    word.push(c);
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_adapter_core::batch::shell_quote;

    #[test]
    fn words_follow_the_shell() {
        assert_eq!(
            words(r#"--job-name="my job" -t 10 --comment='a # b' x\ y # trailing"#).unwrap(),
            ["--job-name=my job", "-t", "10", "--comment=a # b", "x y"]
        );
        assert_eq!(
            words("--mem=4G#no space").unwrap(),
            ["--mem=4G#no", "space"]
        );
        assert!(words("--job-name='open").is_err());
    }

    #[test]
    fn quoting_round_trips_through_words() {
        for value in ["plain", "with space", "it's", "$HOME", ""] {
            assert_eq!(
                words(&shell_quote(value)).unwrap_or_default().join(""),
                value
            );
        }
    }
}
