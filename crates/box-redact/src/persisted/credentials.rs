//! Recognising a credential in a value: userinfo in a URL, an
//! `http.extraheader`, a `credential.helper`, a `.netrc`, a credential store
//! line. Pure: bytes in, the secret values out.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};

/// Credentials in a URL's userinfo (`scheme://user:password@host`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UrlCredential {
    /// Byte range of the password (or of a token used as user name) in the
    /// text searched.
    pub(crate) secret_range: std::ops::Range<usize>,
    /// The password or token, as written and percent-decoded (once when
    /// they are the same).
    pub(crate) secrets: Vec<Vec<u8>>,
}

/// Every URL with credentials in `text`: a password, or a user name that is
/// a token (`https://ghp_...@github.com`: at least 20 characters with both
/// letters and digits; a plain user name like `git` is not a credential).
pub(crate) fn url_credentials(text: &[u8]) -> Vec<UrlCredential> {
    let mut found = Vec::new();
    let mut search_from = 0;
    while let Some(offset) = find(&text[search_from..], b"://") {
        let separator = search_from + offset;
        search_from = separator + 3;
        let scheme_start = text[..separator]
            .iter()
            .rposition(|&byte| {
                !(byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'.' | b'-'))
            })
            .map_or(0, |position| position + 1);
        if scheme_start == separator || !text[scheme_start].is_ascii_alphabetic() {
            continue;
        }
        let authority_start = separator + 3;
        let authority_end = text[authority_start..]
            .iter()
            .position(|&byte| {
                matches!(byte, b'/' | b'?' | b'#' | b'"' | b'\'' | b'<' | b'>' | b'`')
                    || byte.is_ascii_whitespace()
            })
            .map_or(text.len(), |position| authority_start + position);
        let authority = &text[authority_start..authority_end];
        // The last `@` ends the userinfo, as curl and git read a sloppy URL.
        let Some(at) = authority.iter().rposition(|&byte| byte == b'@') else {
            continue;
        };
        let userinfo = &authority[..at];
        let (range, secret) = match userinfo.iter().position(|&byte| byte == b':') {
            Some(colon) if colon + 1 < userinfo.len() => (
                authority_start + colon + 1..authority_start + at,
                &userinfo[colon + 1..],
            ),
            Some(_) => continue,
            None if looks_like_token(userinfo) => (authority_start..authority_start + at, userinfo),
            None => continue,
        };
        found.push(UrlCredential {
            secret_range: range,
            secrets: with_decoded(secret),
        });
        search_from = authority_end.max(search_from);
    }
    found
}

/// `text` with every URL credential replaced by `***`, for keys and lines
/// that are reported.
pub(crate) fn without_url_credentials(text: &[u8]) -> String {
    let mut out = Vec::with_capacity(text.len());
    let mut position = 0;
    for credential in url_credentials(text) {
        out.extend_from_slice(&text[position..credential.secret_range.start]);
        out.extend_from_slice(b"***");
        position = credential.secret_range.end;
    }
    out.extend_from_slice(&text[position..]);
    String::from_utf8_lossy(&out).into_owned()
}

fn looks_like_token(user: &[u8]) -> bool {
    user.len() >= 20
        && user.iter().any(u8::is_ascii_digit)
        && user.iter().any(u8::is_ascii_alphabetic)
}

/// `value` and, when it differs, its percent-decoding.
fn with_decoded(value: &[u8]) -> Vec<Vec<u8>> {
    let decoded = percent_decode(value);
    if decoded == value {
        vec![value.to_vec()]
    } else {
        vec![value.to_vec(), decoded]
    }
}

fn percent_decode(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut index = 0;
    while index < value.len() {
        if value[index] == b'%'
            && let Some(hex) = value.get(index + 1..index + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
        } else {
            out.push(value[index]);
            index += 1;
        }
    }
    out
}

/// The secrets in an `http.extraheader` value (`Name: value`): the header's
/// value; for `basic`, the base64 credentials and, decoded, the password
/// (`x-access-token:TOKEN` gives `TOKEN`); for `bearer` or `token`, the
/// token.
pub(crate) fn extraheader_secrets(value: &[u8]) -> Vec<Vec<u8>> {
    let header_value = match value.iter().position(|&byte| byte == b':') {
        Some(colon) => trim(&value[colon + 1..]),
        None => trim(value),
    };
    let mut secrets = vec![header_value.to_vec()];
    let Some(space) = header_value.iter().position(u8::is_ascii_whitespace) else {
        return secrets;
    };
    let scheme = header_value[..space].to_ascii_lowercase();
    let credentials = trim(&header_value[space..]);
    match scheme.as_slice() {
        b"basic" => {
            secrets.push(credentials.to_vec());
            let decoded = STANDARD
                .decode(credentials)
                .or_else(|_| STANDARD_NO_PAD.decode(credentials.trim_ascii_end()));
            if let Ok(decoded) = decoded {
                if let Some(colon) = decoded.iter().position(|&byte| byte == b':') {
                    secrets.push(decoded[colon + 1..].to_vec());
                }
                secrets.push(decoded);
            }
        }
        b"bearer" | b"token" => secrets.push(credentials.to_vec()),
        _ => {}
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets.dedup();
    secrets
}

/// The secrets in a `credential.helper` value: an inline helper (`!cmd`)
/// may carry the credential itself, so its whole text, and each
/// `password=` or `token=` value in it.
pub(crate) fn inline_helper_secrets(value: &[u8]) -> Vec<Vec<u8>> {
    let mut secrets = vec![value.to_vec()];
    for marker in [&b"password="[..], b"token="] {
        let mut from = 0;
        while let Some(offset) = find(&value[from..], marker) {
            let start = from + offset + marker.len();
            let end = value[start..]
                .iter()
                .position(|&byte| {
                    byte.is_ascii_whitespace() || matches!(byte, b';' | b'"' | b'\'' | b'&' | b'|')
                })
                .map_or(value.len(), |position| start + position);
            if end > start {
                secrets.push(value[start..end].to_vec());
            }
            from = end.max(start);
        }
    }
    secrets
}

/// The file a `credential.helper = store --file=<path>` (or `--file <path>`)
/// writes to, if it names one.
pub(crate) fn store_file(value: &[u8]) -> Option<Vec<u8>> {
    let words = split_words(value);
    let (first, rest) = words.split_first()?;
    if first.as_slice() != b"store" && !first.ends_with(b"git-credential-store") {
        return None;
    }
    let mut rest = rest.iter();
    while let Some(word) = rest.next() {
        if let Some(path) = word.strip_prefix(b"--file=") {
            return Some(path.to_vec());
        }
        if word.as_slice() == b"--file" {
            return rest.next().cloned();
        }
    }
    None
}

/// Words of a helper command line, with simple single and double quotes.
fn split_words(value: &[u8]) -> Vec<Vec<u8>> {
    let mut words = Vec::new();
    let mut word: Option<Vec<u8>> = None;
    let mut quote: Option<u8> = None;
    for &byte in value {
        match quote {
            Some(open) if byte == open => quote = None,
            Some(_) => word.get_or_insert_with(Vec::new).push(byte),
            None if byte == b'"' || byte == b'\'' => {
                quote = Some(byte);
                word.get_or_insert_with(Vec::new);
            }
            None if byte.is_ascii_whitespace() => words.extend(word.take()),
            None => word.get_or_insert_with(Vec::new).push(byte),
        }
    }
    words.extend(word);
    words
}

/// A `.netrc` password: the machine it is for, its line, and the secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NetrcPassword {
    pub(crate) machine: String,
    pub(crate) line: usize,
    pub(crate) secret: Vec<u8>,
}

/// Every `password` (and `account`) in a `.netrc`: whitespace-separated
/// tokens, double-quoted tokens with `\` escapes (curl), `macdef` bodies
/// skipped up to their blank line.
pub(crate) fn netrc_passwords(text: &[u8]) -> Vec<NetrcPassword> {
    let tokens = netrc_tokens(text);
    let mut found = Vec::new();
    let mut machine = String::from("default");
    let mut index = 0;
    while index < tokens.len() {
        let (token, _) = &tokens[index];
        match token.as_slice() {
            b"machine" => {
                if let Some((name, _)) = tokens.get(index + 1) {
                    machine = String::from_utf8_lossy(name).into_owned();
                }
                index += 2;
            }
            b"default" => {
                machine = String::from("default");
                index += 1;
            }
            b"password" | b"account" => {
                if let Some((secret, line)) = tokens.get(index + 1) {
                    found.push(NetrcPassword {
                        machine: machine.clone(),
                        line: *line,
                        secret: secret.clone(),
                    });
                }
                index += 2;
            }
            _ => index += 1,
        }
    }
    found
}

fn netrc_tokens(text: &[u8]) -> Vec<(Vec<u8>, usize)> {
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut index = 0;
    let mut in_macro = false;
    while index < text.len() {
        let byte = text[index];
        if in_macro {
            // A macro body ends at a blank line.
            if byte == b'\n' {
                line += 1;
                if text.get(index + 1) == Some(&b'\n') {
                    in_macro = false;
                }
            }
            index += 1;
            continue;
        }
        if byte == b'\n' {
            line += 1;
            index += 1;
            continue;
        }
        if byte.is_ascii_whitespace() {
            index += 1;
            continue;
        }
        let token_line = line;
        let mut token = Vec::new();
        if byte == b'"' {
            index += 1;
            while index < text.len() && text[index] != b'"' {
                if text[index] == b'\\' && index + 1 < text.len() {
                    index += 1;
                }
                if text[index] == b'\n' {
                    line += 1;
                }
                token.push(text[index]);
                index += 1;
            }
            index += 1;
        } else {
            while index < text.len() && !text[index].is_ascii_whitespace() {
                token.push(text[index]);
                index += 1;
            }
        }
        if token.as_slice() == b"macdef" {
            // Skip the macro's name line, then its body.
            while index < text.len() && text[index] != b'\n' {
                index += 1;
            }
            in_macro = true;
        }
        tokens.push((token, token_line));
    }
    tokens
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn strings(values: Vec<Vec<u8>>) -> Vec<String> {
        values
            .into_iter()
            .map(|value| String::from_utf8(value).unwrap())
            .collect()
    }

    #[test]
    fn url_passwords_and_token_user_names_are_credentials() {
        let text = b"https://user:p%40ss-w0rd@host/r.git ssh://git@host/r http://x:@h git@github.com:o/r https://ghp_abcdefghij0123456789@github.com/";
        let found = url_credentials(text);
        assert_eq!(found.len(), 2);
        assert_eq!(
            strings(found[0].secrets.clone()),
            ["p%40ss-w0rd", "p@ss-w0rd"]
        );
        assert_eq!(
            strings(found[1].secrets.clone()),
            ["ghp_abcdefghij0123456789"]
        );
        assert_eq!(
            without_url_credentials(text),
            "https://user:***@host/r.git ssh://git@host/r http://x:@h git@github.com:o/r https://***@github.com/"
        );
    }

    #[test]
    fn extraheader_basic_credentials_are_decoded_to_the_token() {
        let secrets =
            extraheader_secrets(b"AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46Z2hzX3NlY3JldA==");
        assert_eq!(
            strings(secrets),
            [
                "basic eC1hY2Nlc3MtdG9rZW46Z2hzX3NlY3JldA==",
                "eC1hY2Nlc3MtdG9rZW46Z2hzX3NlY3JldA==",
                "ghs_secret",
                "x-access-token:ghs_secret",
            ]
        );
        assert_eq!(
            strings(extraheader_secrets(b"Authorization: Bearer tok123")),
            ["Bearer tok123", "tok123"]
        );
    }

    #[test]
    fn helpers_store_files_and_inline_tokens() {
        assert_eq!(
            store_file(b"store --file=.git/creds"),
            Some(b".git/creds".to_vec())
        );
        assert_eq!(
            store_file(b"store --file \"my creds\""),
            Some(b"my creds".to_vec())
        );
        assert_eq!(store_file(b"store"), None);
        assert_eq!(store_file(b"cache --timeout=60"), None);
        assert_eq!(
            strings(inline_helper_secrets(
                b"!f() { echo username=x; echo password=s3cr3t-t0k; }; f"
            )),
            [
                "!f() { echo username=x; echo password=s3cr3t-t0k; }; f",
                "s3cr3t-t0k"
            ]
        );
    }

    #[test]
    fn netrc_passwords_by_machine_with_quotes_and_macros() {
        let text = b"machine a.example login me password p1\n\nmacdef init\npassword notreal\n\nmachine b.example\n  login x\n  password \"two words\\\"q\"\ndefault password p3\n";
        let found = netrc_passwords(text);
        let summary: Vec<(String, usize, String)> = found
            .into_iter()
            .map(|password| {
                (
                    password.machine,
                    password.line,
                    String::from_utf8(password.secret).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("a.example".to_owned(), 1, "p1".to_owned()),
                ("b.example".to_owned(), 8, "two words\"q".to_owned()),
                ("default".to_owned(), 9, "p3".to_owned()),
            ]
        );
    }
}
