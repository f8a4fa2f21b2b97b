//! The forms a secret value can take in output: every byte string the
//! redactor searches for, and how far a match of each may be widened.
//!
//! Pure: a value in, its forms out. The one idea: a secret is masked by
//! value, so every encoding a tool is likely to print it in is computed here
//! once, and the search is one Aho-Corasick pass over all of them.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

/// How a form was derived from its value; decides how a match may be widened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormKind {
    /// The value itself, or one line of a multi-line value.
    Raw,
    /// The stable inner run of a base64 encoding of a text that holds the
    /// value at `alignment` bytes past a 3-byte group boundary.
    Base64 {
        /// 0, 1 or 2.
        alignment: u8,
        /// The value's length in bytes (with the alignment, it fixes the edges).
        value_len: usize,
    },
    /// Hex, lower or upper case.
    Hex,
    /// Percent-encoded by one of the common encoders.
    Percent,
    /// Escaped as inside a JSON string.
    Json,
}

impl FormKind {
    /// How many characters before and after a match may be replaced with
    /// it: for base64, the rest of each 4-character group that carries any
    /// bit of the value (its padding included), so a value is removed with
    /// the groups it is entangled in and nothing of it stays at the edges.
    pub(crate) fn widening(self) -> (usize, usize) {
        match self {
            FormKind::Base64 {
                alignment,
                value_len,
            } => {
                let alignment = usize::from(alignment);
                let left = (8 * alignment).div_ceil(6);
                let run_end = 8 * (alignment + value_len) / 6;
                let group_end = 4 * (alignment + value_len).div_ceil(3);
                (left, group_end - run_end)
            }
            FormKind::Raw | FormKind::Hex | FormKind::Percent | FormKind::Json => (0, 0),
        }
    }
}

/// One byte string to search for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Form {
    pub(crate) bytes: Vec<u8>,
    pub(crate) kind: FormKind,
}

/// The values a secret is registered as: the whole value, and each line of a
/// multi-line value (trailing `\r` removed) that is at least `min_len` bytes,
/// so a key printed line by line, or a value with a trailing newline printed
/// without it, is still found. PEM armor lines (`-----BEGIN ... KEY-----`)
/// are the same in every key, so they are not registered on their own.
/// Values longer than `max_len` contribute only their lines (each bounded
/// the same way).
pub(crate) fn registered_values(value: &[u8], min_len: usize, max_len: usize) -> Vec<&[u8]> {
    let mut values = Vec::new();
    if value.len() <= max_len {
        values.push(value);
    }
    if value.contains(&b'\n') {
        for line in value.split(|&byte| byte == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() >= min_len
                && line.len() <= max_len
                && !is_armor(line)
                && !values.contains(&line)
            {
                values.push(line);
            }
        }
    }
    values
}

fn is_armor(line: &[u8]) -> bool {
    (line.starts_with(b"-----BEGIN ") || line.starts_with(b"-----END ")) && line.ends_with(b"-----")
}

/// Every form of `value`, duplicates included (the caller deduplicates
/// across secrets).
pub(crate) fn forms(value: &[u8]) -> Vec<Form> {
    let mut forms = vec![Form {
        bytes: value.to_vec(),
        kind: FormKind::Raw,
    }];
    for alignment in 0..3 {
        for url_safe in [false, true] {
            if let Some(run) = base64_run(value, alignment, url_safe) {
                forms.push(Form {
                    bytes: run,
                    kind: FormKind::Base64 {
                        alignment,
                        value_len: value.len(),
                    },
                });
            }
        }
    }
    for case in [Case::Lower, Case::Upper] {
        forms.push(Form {
            bytes: hex(value, case),
            kind: FormKind::Hex,
        });
    }
    for encoder in &PERCENT_ENCODERS {
        forms.push(Form {
            bytes: percent(value, encoder),
            kind: FormKind::Percent,
        });
    }
    for escaped in json_escaped(value) {
        forms.push(Form {
            bytes: escaped,
            kind: FormKind::Json,
        });
    }
    forms
}

/// The characters every base64 encoding (no line wrapping) of a longer text
/// must contain when the text holds `value` at `alignment` (0, 1 or 2) bytes
/// past a group boundary: the characters whose 6 bits all come from the
/// value. Characters at either edge that mix the value's bits with its
/// neighbours' are left out; `FormKind::widening` covers them.
/// `None` when no character is stable (a value of one or two bytes).
pub(crate) fn base64_run(value: &[u8], alignment: u8, url_safe: bool) -> Option<Vec<u8>> {
    let alignment = usize::from(alignment);
    let mut text = vec![0u8; alignment];
    text.extend_from_slice(value);
    let encoded = if url_safe {
        URL_SAFE_NO_PAD.encode(&text)
    } else {
        STANDARD_NO_PAD.encode(&text)
    };
    // Character i holds bits [6i, 6i + 6) of the text; the value's bits are
    // [8 * alignment, 8 * (alignment + len)).
    let first = (8 * alignment).div_ceil(6);
    let end = 8 * (alignment + value.len()) / 6;
    (first < end).then(|| encoded.as_bytes()[first..end].to_vec())
}

/// Whether `byte` is a character of either base64 alphabet.
pub(crate) fn is_base64_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'-' | b'_')
}

#[derive(Clone, Copy)]
enum Case {
    Lower,
    Upper,
}

fn hex(value: &[u8], case: Case) -> Vec<u8> {
    let digits: &[u8; 16] = match case {
        Case::Lower => b"0123456789abcdef",
        Case::Upper => b"0123456789ABCDEF",
    };
    let mut out = Vec::with_capacity(value.len() * 2);
    for &byte in value {
        out.push(digits[usize::from(byte >> 4)]);
        out.push(digits[usize::from(byte & 0xf)]);
    }
    out
}

/// A percent encoder as some common tool writes it.
struct PercentEncoder {
    /// Bytes besides ASCII letters and digits written as they are.
    keep: &'static [u8],
    /// A space written as `+` (form encoding).
    space_as_plus: bool,
    case: Case,
}

/// RFC 3986 (curl `--data-urlencode`, Go `url.PathEscape`-like), in both hex
/// cases; JavaScript `encodeURIComponent`; Python `quote` (keeps `/`);
/// form encoding (`application/x-www-form-urlencoded`: Python `quote_plus`,
/// browsers, `URLSearchParams`), in both hex cases.
const PERCENT_ENCODERS: [PercentEncoder; 6] = [
    PercentEncoder {
        keep: b"-._~",
        space_as_plus: false,
        case: Case::Upper,
    },
    PercentEncoder {
        keep: b"-._~",
        space_as_plus: false,
        case: Case::Lower,
    },
    PercentEncoder {
        keep: b"-_.!~*'()",
        space_as_plus: false,
        case: Case::Upper,
    },
    PercentEncoder {
        keep: b"-._~/",
        space_as_plus: false,
        case: Case::Upper,
    },
    PercentEncoder {
        keep: b"*-._",
        space_as_plus: true,
        case: Case::Upper,
    },
    PercentEncoder {
        keep: b"*-._",
        space_as_plus: true,
        case: Case::Lower,
    },
];

fn percent(value: &[u8], encoder: &PercentEncoder) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for &byte in value {
        if byte.is_ascii_alphanumeric() || encoder.keep.contains(&byte) {
            out.push(byte);
        } else if byte == b' ' && encoder.space_as_plus {
            out.push(b'+');
        } else {
            out.push(b'%');
            out.extend_from_slice(&hex(&[byte], encoder.case));
        }
    }
    out
}

/// How a value appears inside a JSON string: as serde_json writes it (quote,
/// backslash and control characters escaped, other characters as they are,
/// so also JavaScript's `JSON.stringify`), and ASCII-only as Python's
/// `json.dumps` writes it by default (`\u00e9`, surrogate pairs, lower-case
/// hex). Nothing for a value that is not UTF-8, which no JSON string holds.
fn json_escaped(value: &[u8]) -> Vec<Vec<u8>> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Vec::new();
    };
    let mut serde_form = String::with_capacity(text.len());
    let mut ascii_form = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '"' => push_both(&mut serde_form, &mut ascii_form, "\\\""),
            '\\' => push_both(&mut serde_form, &mut ascii_form, "\\\\"),
            '\n' => push_both(&mut serde_form, &mut ascii_form, "\\n"),
            '\r' => push_both(&mut serde_form, &mut ascii_form, "\\r"),
            '\t' => push_both(&mut serde_form, &mut ascii_form, "\\t"),
            '\u{8}' => push_both(&mut serde_form, &mut ascii_form, "\\b"),
            '\u{c}' => push_both(&mut serde_form, &mut ascii_form, "\\f"),
            control if u32::from(control) < 0x20 => {
                let escaped = format!("\\u{:04x}", u32::from(control));
                push_both(&mut serde_form, &mut ascii_form, &escaped);
            }
            ascii if ascii.is_ascii() => {
                serde_form.push(ascii);
                ascii_form.push(ascii);
            }
            other => {
                serde_form.push(other);
                let mut units = [0u16; 2];
                for unit in other.encode_utf16(&mut units) {
                    ascii_form.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    vec![serde_form.into_bytes(), ascii_form.into_bytes()]
}

fn push_both(first: &mut String, second: &mut String, text: &str) {
    first.push_str(text);
    second.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    #[test]
    fn base64_runs_are_inside_every_aligned_encoding() {
        let value = b"s3cr3t-t0ken-value!?";
        for prefix_len in 0..9 {
            for suffix_len in 0..4 {
                let mut text = vec![b'x'; prefix_len];
                text.extend_from_slice(value);
                text.extend(std::iter::repeat_n(b'~', suffix_len));
                let alignment = u8::try_from(prefix_len % 3).unwrap();
                let run = base64_run(value, alignment, false).unwrap();
                let encoded = STANDARD.encode(&text);
                assert!(
                    encoded.contains(std::str::from_utf8(&run).unwrap()),
                    "prefix {prefix_len}, suffix {suffix_len}: {encoded} lacks {run:?}"
                );
                let run = base64_run(value, alignment, true).unwrap();
                assert!(
                    URL_SAFE
                        .encode(&text)
                        .contains(std::str::from_utf8(&run).unwrap())
                );
            }
        }
    }

    #[test]
    fn base64_run_of_an_aligned_value_is_its_encoding_without_the_last_partial_character() {
        assert_eq!(base64_run(b"abcdef", 0, false).unwrap(), b"YWJjZGVm");
        assert_eq!(base64_run(b"abcdefgh", 0, false).unwrap(), b"YWJjZGVmZ2");
        assert_eq!(base64_run(b"a", 0, false).unwrap(), b"Y");
        assert_eq!(base64_run(b"a", 1, false), None);
    }

    #[test]
    fn base64_widening_reaches_the_groups_the_value_touches() {
        let kind = |alignment, value_len| FormKind::Base64 {
            alignment,
            value_len,
        };
        assert_eq!(kind(0, 9).widening(), (0, 0));
        assert_eq!(kind(0, 8).widening(), (0, 2));
        assert_eq!(kind(1, 8).widening(), (2, 0));
        assert_eq!(kind(2, 8).widening(), (3, 3));
        assert_eq!(FormKind::Hex.widening(), (0, 0));
    }

    #[test]
    fn hex_and_percent_forms() {
        assert_eq!(hex(b"\x00\xffA", Case::Lower), b"00ff41");
        assert_eq!(hex(b"\x00\xffA", Case::Upper), b"00FF41");
        let encoded: Vec<String> = PERCENT_ENCODERS
            .iter()
            .map(|encoder| String::from_utf8(percent(b"a b/c+d~*", encoder)).unwrap())
            .collect();
        assert_eq!(
            encoded,
            [
                "a%20b%2Fc%2Bd~%2A",
                "a%20b%2fc%2bd~%2a",
                "a%20b%2Fc%2Bd~*",
                "a%20b/c%2Bd~%2A",
                "a+b%2Fc%2Bd%7E*",
                "a+b%2fc%2bd%7e*",
            ]
        );
    }

    #[test]
    fn json_forms_match_serde_json_and_python() {
        let value = "q\"b\\n\nt\tc\u{1}é😀";
        let forms = json_escaped(value.as_bytes());
        let serde = serde_json::to_string(value).unwrap();
        assert_eq!(forms[0], serde.trim_matches('"').as_bytes());
        assert_eq!(
            String::from_utf8(forms[1].clone()).unwrap(),
            r#"q\"b\\n\nt\tc\u0001\u00e9\ud83d\ude00"#
        );
        assert!(json_escaped(b"\xff\xfe not utf-8").is_empty());
    }

    #[test]
    fn lines_of_a_multi_line_value_are_registered() {
        let value = b"-----BEGIN KEY-----\r\nMIIEvQIBADANBgkq\nshort\nsecond line\n";
        assert_eq!(
            registered_values(value, 8, 1024),
            [&value[..], b"MIIEvQIBADANBgkq".as_slice(), b"second line"]
        );
        assert_eq!(
            registered_values(value, 8, 20),
            [b"MIIEvQIBADANBgkq".as_slice(), b"second line"]
        );
    }
}
