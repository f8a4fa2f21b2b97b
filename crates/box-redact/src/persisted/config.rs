//! A git config file parser that reads the syntax as git does (`config.c`:
//! `get_next_char`, `get_base_var`, `get_extended_base_var`, `get_value`,
//! `parse_value`), so a credential cannot hide in a spelling a grep misses.
//!
//! What it follows: `\r\n` read as `\n`; a UTF-8 byte order mark skipped;
//! `#` and `;` comments outside quotes; section and variable names
//! case-insensitive (lower-cased here), subsections case-sensitive in the
//! quoted form (`[http "https://x"]`, with `\"` and `\\`, any other
//! backslash dropped) and lower-cased in the deprecated dotted form
//! (`[http.https://x]`); a key on the same line as its section header; a
//! key without `=` (boolean true); values with quotes, the escapes `\t`
//! `\b` `\n` `\\` `\"` (any other is an error, as in git), backslash-newline
//! continuations, whitespace kept inside and trimmed at the ends. A file git
//! would refuse is reported with the line of the first error, and what was
//! parsed before it is kept.

/// One `section[.subsection].name [= value]` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConfigEntry {
    /// Lower-cased.
    pub(crate) section: String,
    /// As written in the quoted form, lower-cased in the dotted form.
    pub(crate) subsection: Option<Vec<u8>>,
    /// Lower-cased.
    pub(crate) name: String,
    /// `None` for a key without `=`.
    pub(crate) value: Option<Vec<u8>>,
    /// The line the key starts on (1-based).
    pub(crate) line: usize,
}

impl ConfigEntry {
    /// The key as `git config --list` prints it (`section.subsection.name`,
    /// the subsection as written).
    pub(crate) fn key(&self) -> String {
        match &self.subsection {
            Some(subsection) => format!(
                "{}.{}.{}",
                self.section,
                String::from_utf8_lossy(subsection),
                self.name
            ),
            None => format!("{}.{}", self.section, self.name),
        }
    }
}

/// Where git would refuse the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConfigSyntaxError {
    /// 1-based.
    pub(crate) line: usize,
}

struct Cursor<'t> {
    text: &'t [u8],
    position: usize,
    line: usize,
    eof: bool,
}

impl Cursor<'_> {
    /// The next character as git's `get_next_char` gives it: `\r\n` is
    /// `\n`, and the end of the text is a `\n` with `eof` set.
    fn next(&mut self) -> u8 {
        let Some(&byte) = self.text.get(self.position) else {
            self.eof = true;
            return b'\n';
        };
        self.position += 1;
        if byte == b'\r' && self.text.get(self.position) == Some(&b'\n') {
            self.position += 1;
            self.line += 1;
            return b'\n';
        }
        if byte == b'\n' {
            self.line += 1;
        }
        byte
    }
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}

fn is_key_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-'
}

/// Every entry of `text`, and the first syntax error if git would refuse
/// the file (the entries before it are kept).
pub(crate) fn parse_config(text: &[u8]) -> (Vec<ConfigEntry>, Option<ConfigSyntaxError>) {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    let mut cursor = Cursor {
        text,
        position: 0,
        line: 1,
        eof: false,
    };
    let mut entries = Vec::new();
    // The current section, as git keeps it: `section[.subsection]`.
    let mut section: Option<Vec<u8>> = None;
    let mut comment = false;
    loop {
        let byte = cursor.next();
        if byte == b'\n' {
            if cursor.eof {
                return (entries, None);
            }
            comment = false;
            continue;
        }
        if comment || is_space(byte) {
            continue;
        }
        if byte == b'#' || byte == b';' {
            comment = true;
            continue;
        }
        if byte == b'[' {
            let line = cursor.line;
            match base_var(&mut cursor) {
                Some(name) if !name.is_empty() => section = Some(name),
                _ => return (entries, Some(ConfigSyntaxError { line })),
            }
            continue;
        }
        if !byte.is_ascii_alphabetic() {
            return (entries, Some(ConfigSyntaxError { line: cursor.line }));
        }
        let line = cursor.line;
        match variable(&mut cursor, byte) {
            Some((name, value)) => {
                let (section_name, subsection) =
                    split_section(section.as_deref().unwrap_or_default());
                entries.push(ConfigEntry {
                    section: section_name,
                    subsection,
                    name,
                    value,
                    line,
                });
            }
            None => return (entries, Some(ConfigSyntaxError { line })),
        }
    }
}

/// `section.rest` split at the first dot, as git's key parsing does.
fn split_section(full: &[u8]) -> (String, Option<Vec<u8>>) {
    match full.iter().position(|&byte| byte == b'.') {
        Some(dot) => (
            String::from_utf8_lossy(&full[..dot]).into_owned(),
            Some(full[dot + 1..].to_vec()),
        ),
        None => (String::from_utf8_lossy(full).into_owned(), None),
    }
}

/// After `[`: the section name, lower-cased, with `.subsection` when there
/// is one (`get_base_var`).
fn base_var(cursor: &mut Cursor<'_>) -> Option<Vec<u8>> {
    let mut name = Vec::new();
    loop {
        let byte = cursor.next();
        if cursor.eof {
            return None;
        }
        if byte == b']' {
            return Some(name);
        }
        if is_space(byte) {
            return extended_base_var(cursor, name, byte);
        }
        if !is_key_char(byte) && byte != b'.' {
            return None;
        }
        name.push(byte.to_ascii_lowercase());
    }
}

/// `[section "subsection"]`: the subsection kept as written, `\x` read as
/// `x` (`get_extended_base_var`).
fn extended_base_var(cursor: &mut Cursor<'_>, mut name: Vec<u8>, mut byte: u8) -> Option<Vec<u8>> {
    loop {
        if byte == b'\n' {
            return None;
        }
        byte = cursor.next();
        if !is_space(byte) {
            break;
        }
    }
    if byte != b'"' {
        return None;
    }
    name.push(b'.');
    loop {
        let mut byte = cursor.next();
        if byte == b'\n' {
            return None;
        }
        if byte == b'"' {
            break;
        }
        if byte == b'\\' {
            byte = cursor.next();
            if byte == b'\n' {
                return None;
            }
        }
        name.push(byte);
    }
    (cursor.next() == b']').then_some(name)
}

/// A variable starting with `first`: its lower-cased name and its value
/// (`get_value`).
fn variable(cursor: &mut Cursor<'_>, first: u8) -> Option<(String, Option<Vec<u8>>)> {
    let mut name = vec![first.to_ascii_lowercase()];
    let mut byte;
    loop {
        byte = cursor.next();
        if cursor.eof || !is_key_char(byte) {
            break;
        }
        name.push(byte.to_ascii_lowercase());
    }
    while byte == b' ' || byte == b'\t' {
        byte = cursor.next();
    }
    let name = String::from_utf8_lossy(&name).into_owned();
    if byte == b'\n' {
        return Some((name, None));
    }
    if byte != b'=' {
        return None;
    }
    Some((name, Some(value(cursor)?)))
}

/// After `=`: the value (`parse_value`).
fn value(cursor: &mut Cursor<'_>) -> Option<Vec<u8>> {
    let mut value = Vec::new();
    let mut quote = false;
    let mut comment = false;
    // Where trailing unquoted whitespace began, to trim it at the end.
    let mut trim_len = 0;
    loop {
        let mut byte = cursor.next();
        if byte == b'\n' {
            if quote {
                return None;
            }
            if trim_len > 0 {
                value.truncate(trim_len);
            }
            return Some(value);
        }
        if comment {
            continue;
        }
        if is_space(byte) && !quote {
            if trim_len == 0 {
                trim_len = value.len();
            }
            if !value.is_empty() {
                value.push(byte);
            }
            continue;
        }
        if !quote && (byte == b';' || byte == b'#') {
            comment = true;
            continue;
        }
        trim_len = 0;
        if byte == b'\\' {
            byte = match cursor.next() {
                b'\n' => continue,
                b't' => b'\t',
                b'b' => b'\x08',
                b'n' => b'\n',
                escaped @ (b'\\' | b'"') => escaped,
                _ => return None,
            };
            value.push(byte);
            continue;
        }
        if byte == b'"' {
            quote = !quote;
            continue;
        }
        value.push(byte);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn entries(text: &str) -> Vec<(String, Option<String>)> {
        let (entries, error) = parse_config(text.as_bytes());
        assert_eq!(error, None, "{text:?}");
        entries
            .iter()
            .map(|entry| {
                (
                    entry.key(),
                    entry
                        .value
                        .as_ref()
                        .map(|value| String::from_utf8_lossy(value).into_owned()),
                )
            })
            .collect()
    }

    fn check(text: &str, expected: &[(&str, Option<&str>)]) {
        let expected: Vec<(String, Option<String>)> = expected
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.map(str::to_owned)))
            .collect();
        assert_eq!(entries(text), expected, "{text:?}");
    }

    #[test]
    fn sections_and_names_are_case_insensitive_subsections_are_not() {
        check(
            "[HTTP \"https://X.example/\"]\n\tExtraHeader = a\n[Core]\nBare\n",
            &[
                ("http.https://X.example/.extraheader", Some("a")),
                ("core.bare", None),
            ],
        );
    }

    #[test]
    fn dotted_subsections_are_lower_cased() {
        check(
            "[Remote.Origin]\nURL = u\n",
            &[("remote.origin.url", Some("u"))],
        );
    }

    #[test]
    fn quoted_subsections_keep_escaped_quotes_and_drop_other_backslashes() {
        check(
            "[url \"a\\\"b\\\\c\\d\"]\ninsteadOf = x\n",
            &[("url.a\"b\\cd.insteadof", Some("x"))],
        );
    }

    #[test]
    fn a_key_may_follow_its_header_on_the_same_line() {
        check(
            "[core] bare = true ; comment\n",
            &[("core.bare", Some("true"))],
        );
    }

    #[test]
    fn values_follow_gits_quoting_escapes_comments_and_trimming() {
        check(
            concat!(
                "[a]\n",
                "plain =   one two\t three   \n",
                "quoted = \" keep ; # \" after # comment\n",
                "escapes = tab\\tnew\\nquote\\\"back\\\\slash\n",
                "semi = x;y\n",
                "empty =\n",
            ),
            &[
                ("a.plain", Some("one two\t three")),
                ("a.quoted", Some(" keep ; #  after")),
                ("a.escapes", Some("tab\tnew\nquote\"back\\slash")),
                ("a.semi", Some("x")),
                ("a.empty", Some("")),
            ],
        );
    }

    #[test]
    fn continuation_lines_join_a_value() {
        check(
            "[http]\n\textraheader = AUTHORIZATION: basic \\\n eC1hY2Nlc3M=\n[b]\nc = d\n",
            &[
                (
                    "http.extraheader",
                    Some("AUTHORIZATION: basic  eC1hY2Nlc3M="),
                ),
                ("b.c", Some("d")),
            ],
        );
        let (entries, _) = parse_config(b"[http]\n\textraheader = a\\\nb\n[b]\nc = d\n");
        assert_eq!(entries[1].line, 5);
    }

    #[test]
    fn crlf_and_a_byte_order_mark_are_read_as_git_reads_them() {
        check(
            "\u{feff}[a]\r\nb = c \r\nd = \"e\r\"\r\n",
            &[("a.b", Some("c")), ("a.d", Some("e\r"))],
        );
    }

    #[test]
    fn what_git_refuses_is_an_error_naming_the_line() {
        for (text, line) in [
            ("[a]\nb = \"unterminated\n", 2),
            ("[a]\nb = bad\\escape\n", 2),
            ("[a\nb = c\n", 1),
            ("[a \"sub\" ]\n", 1),
            ("[a]\n1b = c\n", 2),
            ("[a]\nb c\n", 2),
        ] {
            let (_, error) = parse_config(text.as_bytes());
            assert_eq!(error, Some(ConfigSyntaxError { line }), "{text:?}");
        }
        let (entries, error) = parse_config(b"[a]\nb = c\n!\n");
        assert_eq!(entries.len(), 1);
        assert_eq!(error, Some(ConfigSyntaxError { line: 3 }));
    }

    #[test]
    fn a_key_before_any_section_has_an_empty_section() {
        check("key = v\n", &[(".key", Some("v"))]);
    }
}
