//! File names in text: how a name or path is shown in tool output and error
//! text, and how a path argument written in that form is taken back.
//!
//! One rule for every tool's text (ls, glob, grep, copy, move, remove, the
//! errors of all),
//! the files resource's names and error messages, and the facts questions:
//! a name is shown as it is unless it holds a byte that is not UTF-8, a
//! control character (C0, DEL, C1), a line or paragraph separator, a
//! bidirectional formatting character, a backslash or a double quote. Such a
//! name is shown **quoted**, as git quotes a path: inside double quotes, with
//! `\\`, `\"`, `\t`, `\n`, `\r`, and `\xHH` for every other byte that needs
//! it (a C1 character is its two UTF-8 bytes, `\xc2\x9b`). In a path each
//! name is quoted on its own (`src/"a\nb.rs"`), so a listed name can be
//! joined to its directory. One entry is then one line, no name reaches a
//! terminal as a live control sequence, and inside quotes a backslash is
//! always an escape.
//!
//! A path argument is taken back the same way: each `/`-separated name that
//! starts with `"` is a quoted name; a whole path in quotes, as `git status`
//! prints one, is taken too (with git's octal `\NNN` and `\a \b \e \f \v`), so
//! a path copied from git works. Anything else is literal, backslashes and
//! all. The one ambiguity: a file whose name really starts with `"` must be
//! named by its quoted form, which is how the tools show it.
//!
//! Separately, [`escape_controls`] is what bash output gets by default:
//! terminal control sequences (ANSI colour, OSC titles, cursor movement) made
//! visible as `\xHH`; backslashes are left alone, so it is not reversible.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// Whether the character must not appear raw in a shown name.
fn is_unshown(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\\' | '"'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Whether `bytes` must be shown quoted.
fn needs_quotes(bytes: &[u8]) -> bool {
    bytes
        .utf8_chunks()
        .any(|chunk| !chunk.invalid().is_empty() || chunk.valid().chars().any(is_unshown))
}

/// A name (any bytes) as tool output shows it: as it is, or quoted.
pub(crate) fn show(bytes: &[u8]) -> Cow<'_, str> {
    if !needs_quotes(bytes) {
        // Checked above: valid UTF-8.
        return String::from_utf8_lossy(bytes);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if is_unshown(c) => push_hex(&mut out, c.encode_utf8(&mut [0; 4]).as_bytes()),
                c => out.push(c),
            }
        }
        push_hex(&mut out, chunk.invalid());
    }
    out.push('"');
    Cow::Owned(out)
}

/// A path as tool output shows it: each name shown on its own, joined by `/`.
pub(crate) fn show_path(path: &Path) -> Cow<'_, str> {
    show_path_bytes(path.as_os_str().as_bytes())
}

/// [`show_path`] of a path's bytes.
pub(crate) fn show_path_bytes(bytes: &[u8]) -> Cow<'_, str> {
    if !needs_quotes(bytes) {
        return String::from_utf8_lossy(bytes);
    }
    let parts: Vec<Cow<'_, str>> = bytes.split(|byte| *byte == b'/').map(show).collect();
    Cow::Owned(parts.join("/"))
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        let _ = write!(out, "\\x{byte:02x}");
    }
}

/// What a quoted name must look like, for a refusal.
const SHAPE: &str = "a name that starts with \" is a quoted name: it ends with \", and inside it a \" or a backslash is written \\\" or \\\\ (escapes \\t \\n \\r \\xHH)";

/// The bytes a path argument names: its quoted names decoded, anything else
/// as written. `Err` says what is wrong with a quoted name.
pub(crate) fn parse(raw: &str) -> Result<Cow<'_, [u8]>, String> {
    if raw.starts_with('"')
        && let Ok(whole) = parse_quoted(raw)
    {
        return Ok(Cow::Owned(whole));
    }
    if !raw.split('/').any(|part| part.starts_with('"')) {
        return Ok(Cow::Borrowed(raw.as_bytes()));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (index, part) in raw.split('/').enumerate() {
        if index > 0 {
            out.push(b'/');
        }
        if part.starts_with('"') {
            out.extend(parse_quoted(part)?);
        } else {
            out.extend_from_slice(part.as_bytes());
        }
    }
    Ok(Cow::Owned(out))
}

/// One quoted name (its quotes included) decoded.
fn parse_quoted(quoted: &str) -> Result<Vec<u8>, String> {
    let Some(inner) = quoted
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return Err(SHAPE.to_owned());
    };
    let bytes = inner.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'"' => return Err(SHAPE.to_owned()),
            b'\\' => {
                let (byte, used) = unescape(&bytes[index + 1..]).ok_or_else(|| {
                    let escape: String = inner[index..].chars().take(4).collect();
                    format!("unknown escape {escape}; {SHAPE}")
                })?;
                out.push(byte);
                index += 1 + used;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    Ok(out)
}

/// The byte an escape stands for (what follows the backslash) and how many
/// bytes of `rest` it used.
fn unescape(rest: &[u8]) -> Option<(u8, usize)> {
    let simple = match rest.first()? {
        b'\\' => b'\\',
        b'"' => b'"',
        b'a' => 0x07,
        b'b' => 0x08,
        b't' => b'\t',
        b'n' => b'\n',
        b'v' => 0x0b,
        b'f' => 0x0c,
        b'r' => b'\r',
        b'e' => 0x1b,
        b'x' => {
            let hex = std::str::from_utf8(rest.get(1..3)?).ok()?;
            return Some((u8::from_str_radix(hex, 16).ok()?, 3));
        }
        b'0'..=b'3' => {
            let octal = std::str::from_utf8(rest.get(..3)?).ok()?;
            return Some((u8::from_str_radix(octal, 8).ok()?, 3));
        }
        _ => return None,
    };
    Some((simple, 1))
}

/// Text (bash output) with terminal control characters made visible: C0
/// controls but tab and newline (and a carriage return before a newline),
/// DEL and C1 controls become `\xHH` of their bytes. Everything else,
/// backslashes included, is left as it is.
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    let live = |c: char, next: Option<char>| {
        c.is_control() && !matches!(c, '\t' | '\n') && !(c == '\r' && next == Some('\n'))
    };
    let mut chars = text.chars().peekable();
    let mut first = None;
    let mut at = 0;
    while let Some(c) = chars.next() {
        if live(c, chars.peek().copied()) {
            first = Some(at);
            break;
        }
        at += c.len_utf8();
    }
    let Some(first) = first else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    let mut chars = text[first..].chars().peekable();
    while let Some(c) = chars.next() {
        if live(c, chars.peek().copied()) {
            push_hex(&mut out, c.encode_utf8(&mut [0; 4]).as_bytes());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ordinary_names_are_shown_as_they_are() {
        for name in [
            "a.txt",
            "src/main.rs",
            "é/日本.md",
            "with space",
            "a'b",
            "-x",
            ".env",
        ] {
            assert_eq!(show(name.as_bytes()), name);
            assert_eq!(&*parse(name).unwrap(), name.as_bytes());
        }
    }

    #[test]
    fn unusual_names_are_quoted() {
        let check = |bytes: &[u8], shown: &str| assert_eq!(show(bytes), shown, "{bytes:?}");
        check(b"a\nb", r#""a\nb""#);
        check(b"\x1b]0;title\x07", r#""\x1b]0;title\x07""#);
        check(b"\x1b[31mred", r#""\x1b[31mred""#);
        check(b"tab\there\r", r#""tab\there\r""#);
        check(b"bad-\xff.txt", r#""bad-\xff.txt""#);
        check(b"back\\slash", r#""back\\slash""#);
        check(b"\"quoted\"", r#""\"quoted\"""#);
        check("c1\u{9b}x".as_bytes(), r#""c1\xc2\x9bx""#);
        check(
            "rtl\u{202e}txt.exe".as_bytes(),
            r#""rtl\xe2\x80\xaetxt.exe""#,
        );
        check(b"del\x7f", r#""del\x7f""#);
    }

    #[test]
    fn quoted_names_are_taken_back() {
        assert_eq!(&*parse(r#""a\nb""#).unwrap(), &b"a\nb"[..]);
        assert_eq!(&*parse(r#""bad-\xff.txt""#).unwrap(), &b"bad-\xff.txt"[..]);
        assert_eq!(&*parse(r#""back\\slash""#).unwrap(), &b"back\\slash"[..]);
        // git's octal quoting, as `git status` prints a name.
        assert_eq!(
            &*parse(r#""caf\303\251\033""#).unwrap(),
            "café\x1b".as_bytes()
        );
        assert_eq!(&*parse(r#""\x2eenv""#).unwrap(), &b".env"[..]);
        // Unquoted text is literal, backslashes and all.
        assert_eq!(&*parse(r"a\nb").unwrap(), &b"a\\nb"[..]);
        // A quoted name inside a path, and a whole path quoted as git prints one.
        assert_eq!(&*parse(r#"src/"a\nb.rs""#).unwrap(), &b"src/a\nb.rs"[..]);
        assert_eq!(&*parse(r#""src/a\nb.rs""#).unwrap(), &b"src/a\nb.rs"[..]);
        assert_eq!(&*parse(r#""x\ty"/"z\n""#).unwrap(), &b"x\ty/z\n"[..]);
        for bad in [
            r#"""#,
            r#""open"#,
            r#""a"b""#,
            r#""\q""#,
            r#""\x4""#,
            r#""end\""#,
            r#"dir/"open"#,
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("quoted name"), "{bad}: {error}");
        }
    }

    #[test]
    fn paths_quote_each_name_on_its_own() {
        assert_eq!(show_path(Path::new("src/main.rs")), "src/main.rs");
        assert_eq!(show_path_bytes(b"src/a\nb.rs"), r#"src/"a\nb.rs""#);
        assert_eq!(show_path_bytes(b"/abs/\x1b[2J"), r#"/abs/"\x1b[2J""#);
    }

    proptest! {
        #[test]
        fn every_path_round_trips_and_is_one_line(bytes in proptest::collection::vec(
            prop_oneof![Just(b'/'), Just(b'"'), Just(b'\\'), any::<u8>()], 0..40)
        ) {
            let shown = show_path_bytes(&bytes);
            prop_assert!(!shown.chars().any(char::is_control), "{}", shown);
            // An unquoted name is taken back literally, a quoted one decoded.
            prop_assert_eq!(parse(&shown).unwrap().into_owned(), bytes);
        }
    }

    #[test]
    fn bash_output_loses_live_control_sequences() {
        assert_eq!(
            escape_controls("plain\ttext\nline\r\n"),
            "plain\ttext\nline\r\n"
        );
        assert_eq!(
            escape_controls("\x1b[31mred\x1b[0m \x1b]0;title\x07 back\\slash"),
            r"\x1b[31mred\x1b[0m \x1b]0;title\x07 back\slash"
        );
        assert_eq!(
            escape_controls("50%\r100%\n"),
            r"50%\x0d100%".to_owned() + "\n"
        );
        assert_eq!(escape_controls("c1 \u{9b}2J é"), r"c1 \xc2\x9b2J é");
        assert!(matches!(escape_controls("nothing to do"), Cow::Borrowed(_)));
    }
}
