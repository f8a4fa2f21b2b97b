//! The reference's pitfalls list (opening-the-session.md §2.4), case by
//! case, then the properties: a secret in any form never survives, streams
//! agree with one-shot redaction, and text without secrets is untouched.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use serde_json::json;

use crate::{MIN_SECRET_LEN, Redactor, SkipReason, Skipped};

const TOKEN: &str = "ghp_R3dact10nT0kenValue0123456789abcd";

fn redactor(secrets: &[(&str, &str)]) -> Arc<Redactor> {
    Arc::new(Redactor::new(secrets.iter().copied()).unwrap())
}

fn check(secrets: &[(&str, &str)], input: &str, expected: &str) {
    let redactor = redactor(secrets);
    assert_eq!(redactor.redact(input), expected, "one-shot");
    // The same through a stream, one byte at a time and in one chunk.
    let mut stream = redactor.stream();
    let mut streamed: Vec<u8> = input
        .bytes()
        .flat_map(|byte| stream.push(&[byte]))
        .collect();
    streamed.extend(stream.finish());
    assert_eq!(
        String::from_utf8(streamed).unwrap(),
        expected,
        "one byte per write"
    );
    let mut stream = redactor.text_stream();
    let streamed = stream.push(input) + &stream.finish();
    assert_eq!(streamed, expected, "one chunk");
}

#[test]
fn raw_value_is_redacted() {
    check(
        &[("GITHUB_TOKEN", TOKEN)],
        &format!("$ cat /run/secrets/GITHUB_TOKEN\n{TOKEN}\n$ echo done"),
        "$ cat /run/secrets/GITHUB_TOKEN\n[REDACTED:GITHUB_TOKEN]\n$ echo done",
    );
}

/// Base64 of `prefix + value + suffix` with every 4-character group that
/// carries any bit of the value (padding included) replaced by the marker:
/// what redaction must give.
fn expected_base64(encoded: &str, prefix_len: usize, value_len: usize) -> String {
    let first = prefix_len / 3 * 4;
    let end = ((prefix_len + value_len).div_ceil(3) * 4).min(encoded.len());
    format!("{}[REDACTED:T]{}", &encoded[..first], &encoded[end..])
}

#[test]
fn base64_at_every_alignment_is_redacted_with_its_edge_characters() {
    for prefix in ["", "x", "xy", "x-access-token:", "Authorization: basic u:"] {
        for suffix in ["", "!", "!!", "!!!", "\n"] {
            let text = format!("{prefix}{TOKEN}{suffix}");
            for engine in [STANDARD, URL_SAFE] {
                let encoded = engine.encode(&text);
                let expected = expected_base64(&encoded, prefix.len(), TOKEN.len());
                check(&[("T", TOKEN)], &encoded, &expected);
            }
        }
    }
}

#[test]
fn base64_of_a_value_printed_by_the_base64_tool_is_redacted() {
    // What `cat /run/secrets/T; echo; cat /run/secrets/T | base64` prints.
    let output = format!("{TOKEN}\n{}\n", STANDARD.encode(format!("{TOKEN}\n")));
    check(&[("T", TOKEN)], &output, "[REDACTED:T]\n[REDACTED:T]\n");
}

#[test]
fn base64url_without_padding_is_redacted() {
    // Bytes that encode to `+` and `/` in the standard alphabet.
    let value = "\u{fb}\u{ff}\u{be}>?~~~secret";
    assert!(STANDARD.encode(value).contains('+') || STANDARD.encode(value).contains('/'));
    let encoded = URL_SAFE_NO_PAD.encode(value);
    check(
        &[("V", value)],
        &format!("jwt={encoded};"),
        "jwt=[REDACTED:V];",
    );
}

#[test]
fn hex_in_both_cases_is_redacted() {
    let value = "s3cret-hex-value";
    let lower: String = value.bytes().map(|byte| format!("{byte:02x}")).collect();
    check(
        &[("V", value)],
        &format!("dump: {lower}0a"),
        "dump: [REDACTED:V]0a",
    );
    check(
        &[("V", value)],
        &format!("DUMP {}", lower.to_uppercase()),
        "DUMP [REDACTED:V]",
    );
}

#[test]
fn percent_encoded_forms_are_redacted() {
    let value = "p@ss w/rd+key=1&2";
    for encoded in [
        "p%40ss%20w%2Frd%2Bkey%3D1%262", // RFC 3986, encodeURIComponent
        "p%40ss%20w%2frd%2bkey%3d1%262", // lower-case hex
        "p%40ss%20w/rd%2Bkey%3D1%262",   // Python quote
        "p%40ss+w%2Frd%2Bkey%3D1%262",   // form encoding
    ] {
        check(
            &[("V", value)],
            &format!("GET /login?password={encoded}&next=/"),
            "GET /login?password=[REDACTED:V]&next=/",
        );
    }
}

#[test]
fn json_escaped_value_is_redacted_in_serialised_json() {
    let value = "pa\"ss\\word\nline2é";
    let line = serde_json::to_string(&json!({"output": format!("value={value}.")})).unwrap();
    check(
        &[("V", value)],
        &line,
        r#"{"output":"value=[REDACTED:V]."}"#,
    );
    // Python's json.dumps escapes non-ASCII.
    let python = r#"{"output": "value=pa\"ss\\word\nline2\u00e9."}"#;
    check(
        &[("V", value)],
        python,
        r#"{"output": "value=[REDACTED:V]."}"#,
    );
}

#[test]
fn value_split_across_two_chunks_is_redacted_at_every_split() {
    let redactor = redactor(&[("T", TOKEN)]);
    let text = format!("before {TOKEN} after");
    for split in 0..=text.len() {
        let mut stream = redactor.stream();
        let mut out = stream.push(&text.as_bytes()[..split]);
        out.extend(stream.push(&text.as_bytes()[split..]));
        out.extend(stream.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "before [REDACTED:T] after",
            "split at {split}"
        );
    }
}

#[test]
fn value_in_one_byte_writes_is_held_back_only_while_it_could_be_a_secret() {
    let redactor = redactor(&[("T", TOKEN)]);
    let mut stream = redactor.stream();
    assert_eq!(stream.push(b"plain text\n"), b"plain text\n");
    assert_eq!(stream.held_back(), 0);
    let mut out = Vec::new();
    for byte in TOKEN.bytes() {
        out.extend(stream.push(&[byte]));
        // Nothing of the value is released while it is incomplete.
        assert!(out.is_empty() || out == b"[REDACTED:T]", "released {out:?}");
    }
    out.extend(stream.push(b" and more"));
    out.extend(stream.finish());
    assert_eq!(String::from_utf8(out).unwrap(), "[REDACTED:T] and more");
}

#[test]
fn value_inside_an_error_message_is_redacted() {
    let redactor = redactor(&[("DEPLOY_TOKEN", TOKEN)]);
    let mut answer = json!({
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32000, "message": format!("git push failed: https://x:{TOKEN}@example.com/r.git: 403")},
    });
    assert_eq!(redactor.redact_json(&mut answer), 1);
    assert_eq!(
        answer,
        json!({
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32000, "message": "git push failed: https://x:[REDACTED:DEPLOY_TOKEN]@example.com/r.git: 403"},
        })
    );
}

#[test]
fn json_keys_and_numbers_are_redacted_and_colliding_keys_both_stay() {
    let redactor = redactor(&[("T", TOKEN), ("PIN", "123456789012")]);
    let mut value = json!({
        "z": 1,
        TOKEN: "a",
        "[REDACTED:T]": "b",
        "pin": 123456789012u64,
        "short": 1234567,
        "list": [format!("{TOKEN}{TOKEN}"), null, true, 1.5],
    });
    assert_eq!(redactor.redact_json(&mut value), 4);
    assert_eq!(
        serde_json::to_string(&value).unwrap(),
        r#"{"z":1,"[REDACTED:T]":"a","[REDACTED:T]#2":"b","pin":"[REDACTED:PIN]","short":1234567,"list":["[REDACTED:T][REDACTED:T]",null,true,1.5]}"#
    );
}

#[test]
fn short_values_are_reported_and_never_redacted() {
    let redactor = redactor(&[
        ("PIN", "1234"),
        ("EMPTY", ""),
        ("SEVEN", "abcdefg"),
        ("T", TOKEN),
    ]);
    assert_eq!(
        redactor.skipped(),
        [
            Skipped {
                name: "PIN".into(),
                len: 4,
                reason: SkipReason::TooShort
            },
            Skipped {
                name: "EMPTY".into(),
                len: 0,
                reason: SkipReason::TooShort
            },
            Skipped {
                name: "SEVEN".into(),
                len: 7,
                reason: SkipReason::TooShort
            },
        ]
    );
    assert_eq!(
        redactor.skipped()[0].to_string(),
        "secret PIN is 4 bytes, shorter than 8: it is not redacted from output"
    );
    let text = "pin 1234, abcdefg, MTIzNA==, 31323334";
    assert!(matches!(
        redactor.redact(text),
        std::borrow::Cow::Borrowed(_)
    ));
    assert_eq!(redactor.redact(text), text);
}

#[test]
fn overlapping_secrets_are_both_redacted() {
    check(
        &[("A", "abcdefgh12345678"), ("B", "12345678XYZWVUTS")],
        "[abcdefgh12345678XYZWVUTS]",
        "[[REDACTED:A][REDACTED:B]]",
    );
}

#[test]
fn secret_that_is_a_prefix_of_another_gives_the_longer_name() {
    let secrets = [("SHORT", "secretvalue1"), ("LONG", "secretvalue123")];
    check(&secrets, "x secretvalue123 y", "x [REDACTED:LONG] y");
    check(&secrets, "x secretvalue12 y", "x [REDACTED:SHORT]2 y");
    check(&secrets, "x secretvalue1", "x [REDACTED:SHORT]");
}

#[test]
fn lines_of_a_multi_line_secret_are_redacted_one_by_one() {
    let key =
        "-----BEGIN TEST KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END TEST KEY-----\n";
    check(
        &[("KEY", key)],
        "line: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n",
        "line: [REDACTED:KEY]\n",
    );
    check(&[("KEY", key)], &format!("<{key}>"), "<[REDACTED:KEY]>");
}

#[test]
fn non_utf8_input_is_redacted_as_bytes() {
    let redactor = redactor(&[("T", TOKEN)]);
    let mut input = b"\xff\xfe\x80".to_vec();
    input.extend_from_slice(TOKEN.as_bytes());
    input.extend_from_slice(b"\xc3");
    assert_eq!(
        &*redactor.redact_bytes(&input),
        b"\xff\xfe\x80[REDACTED:T]\xc3"
    );
    let mut stream = redactor.stream();
    let mut out: Vec<u8> = input
        .chunks(3)
        .flat_map(|chunk| stream.push(chunk))
        .collect();
    out.extend(stream.finish());
    assert_eq!(out, b"\xff\xfe\x80[REDACTED:T]\xc3");
    // A value that is not UTF-8 itself.
    let redactor = Arc::new(Redactor::new([("B", b"\xde\xad\xbe\xef\x00\x01\x02\x03")]).unwrap());
    assert_eq!(
        &*redactor.redact_bytes(b"<\xde\xad\xbe\xef\x00\x01\x02\x03> deadbeef00010203"),
        b"<[REDACTED:B]> [REDACTED:B]"
    );
}

#[test]
fn text_stream_releases_whole_characters() {
    let redactor = redactor(&[("T", "ünïcødé-sécret")]);
    let text = "é ünïcødé-sécret ü ünïcødé";
    let mut stream = redactor.text_stream();
    let mut out = String::new();
    // Chunks on character boundaries, as `&str` requires.
    let mut chunk_start = 0;
    for (index, _) in text.char_indices().skip(1) {
        out.push_str(&stream.push(&text[chunk_start..index]));
        chunk_start = index;
    }
    out.push_str(&stream.push(&text[chunk_start..]));
    out.push_str(&stream.finish());
    assert_eq!(out, "é [REDACTED:T] ü ünïcødé");
}

#[test]
fn debug_output_never_shows_values() {
    let redactor = redactor(&[("T", TOKEN)]);
    let debug = format!("{redactor:?}");
    assert!(debug.contains("\"T\""));
    assert!(!debug.contains(TOKEN));
}

#[test]
fn empty_redactor_passes_everything() {
    let redactor = Arc::new(Redactor::new(Vec::<(String, String)>::new()).unwrap());
    assert!(redactor.is_empty());
    assert_eq!(redactor.redact("anything"), "anything");
    let mut stream = redactor.stream();
    assert_eq!(stream.push(b"abc"), b"abc");
    assert_eq!(stream.finish(), b"");
}

/// How a secret may be printed, for the properties.
#[derive(Clone, Copy, Debug)]
enum Encoding {
    Raw,
    Base64 { prefix_len: usize },
    Base64Url { prefix_len: usize },
    HexLower,
    HexUpper,
    Percent,
    Json,
}

fn encodings() -> impl Strategy<Value = Encoding> {
    prop_oneof![
        Just(Encoding::Raw),
        (0usize..6).prop_map(|prefix_len| Encoding::Base64 { prefix_len }),
        (0usize..6).prop_map(|prefix_len| Encoding::Base64Url { prefix_len }),
        Just(Encoding::HexLower),
        Just(Encoding::HexUpper),
        Just(Encoding::Percent),
        Just(Encoding::Json),
    ]
}

/// `value` printed in `encoding` (base64 after a prefix from `filler`), and
/// the bytes that must not survive redaction.
fn encode(value: &str, encoding: Encoding, filler: &str) -> (String, Vec<String>) {
    let hex: String = value.bytes().map(|byte| format!("{byte:02x}")).collect();
    match encoding {
        Encoding::Raw => (value.to_owned(), vec![value.to_owned()]),
        Encoding::Base64 { prefix_len } | Encoding::Base64Url { prefix_len } => {
            let prefix: String = filler.chars().take(prefix_len).collect();
            let engine = match encoding {
                Encoding::Base64Url { .. } => URL_SAFE,
                _ => STANDARD,
            };
            let encoded = engine.encode(format!("{prefix}{value}"));
            let alignment = u8::try_from(prefix.len() % 3).unwrap();
            let url = matches!(encoding, Encoding::Base64Url { .. });
            let run = crate::forms::base64_run(value.as_bytes(), alignment, url).unwrap();
            (encoded, vec![String::from_utf8(run).unwrap()])
        }
        Encoding::HexLower => (hex.clone(), vec![hex]),
        Encoding::HexUpper => (hex.to_uppercase(), vec![hex.to_uppercase()]),
        Encoding::Percent => {
            let encoded: String = value
                .bytes()
                .map(|byte| {
                    if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                        char::from(byte).to_string()
                    } else {
                        format!("%{byte:02X}")
                    }
                })
                .collect();
            (encoded.clone(), vec![encoded])
        }
        Encoding::Json => {
            let quoted = serde_json::to_string(value).unwrap();
            let inner = quoted[1..quoted.len() - 1].to_owned();
            (inner.clone(), vec![inner])
        }
    }
}

fn secret_values() -> impl Strategy<Value = String> {
    // Printable with the characters that make encodings differ.
    "[A-Za-z0-9_+/=%\"\\\\ .:@-]{8,48}"
}

fn texts() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~\n]{0,120}", ".{0,60}"]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn secret_in_any_form_anywhere_never_survives(
        value in secret_values(),
        other in secret_values(),
        encoding in encodings(),
        before in texts(),
        after in texts(),
        chunk_len in 1usize..40,
    ) {
        let redactor = redactor(&[("S", &value), ("O", &other)]);
        let (printed, forbidden) = encode(&value, encoding, &before);
        let text = format!("{before}{printed}{after}");
        let redacted = redactor.redact(&text);
        for form in &forbidden {
            prop_assert!(!redacted.contains(form.as_str()), "{form:?} survives in {redacted:?}");
        }
        prop_assert!(redacted.contains("[REDACTED:"));
        // A stream in chunks gives the same bytes as one-shot redaction.
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> =
            text.as_bytes().chunks(chunk_len).flat_map(|chunk| stream.push(chunk)).collect();
        streamed.extend(stream.finish());
        prop_assert_eq!(&streamed[..], &*redactor.redact_bytes(text.as_bytes()));
    }

    #[test]
    fn text_without_secrets_is_returned_unchanged(
        values in proptest::collection::vec(secret_values(), 0..8),
        text in texts(),
        chunk_len in 1usize..40,
    ) {
        let secrets: Vec<(String, String)> =
            values.iter().enumerate().map(|(index, value)| (format!("S{index}"), value.clone())).collect();
        let redactor = Arc::new(Redactor::new(secrets).unwrap());
        prop_assume!(redactor.pattern_bytes.iter().all(|form| !contains(text.as_bytes(), form)));
        prop_assert!(matches!(redactor.redact(&text), std::borrow::Cow::Borrowed(_)));
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> =
            text.as_bytes().chunks(chunk_len).flat_map(|chunk| stream.push(chunk)).collect();
        streamed.extend(stream.finish());
        prop_assert_eq!(streamed, text.as_bytes());
    }

    #[test]
    fn streams_agree_with_one_shot_redaction_on_any_bytes(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), MIN_SECRET_LEN..20), 1..4),
        pieces in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..12), 0usize..4), 0..8),
        chunk_len in 1usize..16,
    ) {
        let secrets: Vec<(String, Vec<u8>)> =
            values.iter().enumerate().map(|(index, value)| (format!("S{index}"), value.clone())).collect();
        let redactor = Arc::new(Redactor::new(secrets).unwrap());
        let input = spliced(&redactor, &values, pieces);
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> = input.chunks(chunk_len).flat_map(|chunk| stream.push(chunk)).collect();
        streamed.extend(stream.finish());
        let one_shot = redactor.redact_bytes(&input);
        prop_assert_eq!(&streamed[..], &*one_shot);
        for value in &values {
            prop_assert!(!contains(&one_shot, value));
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Random bytes with the secrets' raw values and forms spliced in.
fn spliced(redactor: &Redactor, values: &[Vec<u8>], pieces: Vec<(Vec<u8>, usize)>) -> Vec<u8> {
    let mut input = Vec::new();
    for (noise, pick) in pieces {
        input.extend(noise);
        if let Some(value) = values.get(pick) {
            input.extend(value);
        } else if let Some(form) = redactor
            .pattern_bytes
            .get(pick * 7 % redactor.pattern_bytes.len().max(1))
        {
            input.extend(form.iter());
        }
    }
    input
}

proptest! {
    #[test]
    fn prefilter_finds_what_the_automaton_finds(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), MIN_SECRET_LEN..24), 1..6),
        pieces in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..12), 0usize..12), 0..12),
    ) {
        let secrets: Vec<(String, Vec<u8>)> =
            values.iter().enumerate().map(|(index, value)| (format!("S{index}"), value.clone())).collect();
        let redactor = Redactor::new(secrets).unwrap();
        let input = spliced(&redactor, &values, pieces);
        let mut by_automaton = redactor.occurrences_by_automaton(&input);
        by_automaton.sort_unstable();
        let mut by_filter = Vec::new();
        if redactor.filter.as_ref().unwrap().find(&input, &redactor.pattern_bytes, &mut by_filter).is_ok() {
            by_filter.sort_unstable();
            prop_assert_eq!(by_filter, by_automaton);
        }
    }
}

#[test]
fn text_dense_in_candidates_falls_back_to_the_automaton() {
    let redactor = Redactor::new([("Z", "aaaaaaaaaaaaaaaa")]).unwrap();
    let mut input = "a".repeat(64 * 1024);
    input.push_str(" tail");
    let mut found = Vec::new();
    assert!(
        redactor
            .filter
            .as_ref()
            .unwrap()
            .find(input.as_bytes(), &redactor.pattern_bytes, &mut found)
            .is_err()
    );
    // Every offset matches, so the overlapping matches make one region.
    assert_eq!(redactor.redact(&input), "[REDACTED:Z] tail");
}

proptest! {
    #[test]
    fn holdback_is_the_longest_suffix_that_starts_a_form(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), MIN_SECRET_LEN..40), 1..4),
        noise in proptest::collection::vec(any::<u8>(), 0..60),
        pick in 0usize..64,
        cut in 0usize..200,
    ) {
        let secrets: Vec<(String, Vec<u8>)> =
            values.iter().enumerate().map(|(index, value)| (format!("S{index}"), value.clone())).collect();
        let redactor = Redactor::new(secrets).unwrap();
        // Noise, then a form cut short (or whole).
        let form = &redactor.pattern_bytes[pick % redactor.pattern_bytes.len()];
        let mut pending = noise;
        pending.extend_from_slice(&form[..cut.min(form.len())]);
        let naive = (1..=pending.len().min(redactor.max_pattern_len - 1))
            .rev()
            .find(|&len| {
                let suffix = &pending[pending.len() - len..];
                redactor.pattern_bytes.iter().any(|form| form.len() > len && form.starts_with(suffix))
            })
            .unwrap_or(0);
        prop_assert_eq!(redactor.longest_form_prefix(&pending), naive);
    }
}

#[test]
fn a_text_gram_that_only_collides_in_the_bitmap_keeps_the_prefilter() {
    // Regression: four spaces collided with an indexed gram in the bitmap,
    // every sample of indented source counted as work, and a 1 MiB `cat`
    // fell back to the automaton at 20 times the cost.
    let redactor = Redactor::new([("T", TOKEN), ("PIN", "7777777Q")]).unwrap();
    let filter = redactor.filter.as_ref().unwrap();
    let colliding = (0u32..)
        .map(|index| {
            let mut gram = *b"    ";
            for (position, byte) in gram.iter_mut().enumerate() {
                *byte = b' ' + u8::try_from((index >> (position * 6)) & 63).unwrap();
            }
            gram
        })
        .find(|gram| {
            let gram = u32::from_le_bytes(*gram);
            filter.may_hold(gram) && filter.entries_for(gram).next().is_none()
        })
        .unwrap();
    let text = colliding.repeat(64 * 1024);
    let mut found = Vec::new();
    assert!(
        filter
            .find(&text, &redactor.pattern_bytes, &mut found)
            .is_ok()
    );
    assert_eq!(found, []);
}

#[test]
fn a_value_over_the_maximum_is_redacted_by_its_lines_and_reported() {
    let line = "k".repeat(40);
    let value = format!("{line}\n").repeat(2000);
    let redactor = Redactor::new([("BIG", value.as_str())]).unwrap();
    assert_eq!(
        redactor.skipped(),
        [Skipped {
            name: "BIG".into(),
            len: 82_000,
            reason: SkipReason::TooLong
        }]
    );
    assert_eq!(redactor.redact(&format!("<{line}>")), "<[REDACTED:BIG]>");
}

// Issue 22, item 2: base64 (and hex) wrapped across lines, as `base64`
// (76 columns), PEM and `openssl base64` (64) and `xxd -p` (60) write it.

/// `encoded` cut into lines of `width` characters ended by `eol`, with
/// `indent` before each, as a wrapping encoder writes it.
fn wrap(encoded: &str, width: usize, eol: &str, indent: &str) -> String {
    encoded
        .as_bytes()
        .chunks(width)
        .map(|line| format!("{indent}{}{eol}", std::str::from_utf8(line).unwrap()))
        .collect()
}

/// `text` with its line breaks and the indentation after them taken out.
fn unwrap_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| line.trim_start_matches([' ', '\t']).trim_end_matches('\r'))
        .collect()
}

/// Redacts `input` one-shot, asserts that streams give the same (one byte
/// per write, in chunks of every size up to 80, in one chunk), and returns it.
fn redacted_everywhere(redactor: &Arc<Redactor>, input: &str) -> String {
    let one_shot = redactor.redact(input).into_owned();
    assert_eq!(
        &*redactor.redact_bytes(input.as_bytes()),
        one_shot.as_bytes(),
        "bytes"
    );
    for chunk_len in (1..=80).chain([input.len().max(1)]) {
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> = input
            .as_bytes()
            .chunks(chunk_len)
            .flat_map(|chunk| stream.push(chunk))
            .collect();
        streamed.extend(stream.finish());
        assert_eq!(
            String::from_utf8(streamed).unwrap(),
            one_shot,
            "chunks of {chunk_len}"
        );
    }
    let mut stream = redactor.text_stream();
    let mut streamed = String::new();
    let mut rest = input;
    while !rest.is_empty() {
        let mut cut = rest.len().min(7);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        streamed.push_str(&stream.push(&rest[..cut]));
        rest = &rest[cut..];
    }
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, one_shot, "text in chunks of 7");
    one_shot
}

/// The stable run of `value`'s base64 at each alignment, in both alphabets:
/// what must not survive, line breaks taken out.
fn base64_runs(value: &[u8]) -> Vec<String> {
    (0..3)
        .flat_map(|alignment| [false, true].map(move |url| (alignment, url)))
        .filter_map(|(alignment, url)| crate::forms::base64_run(value, alignment, url))
        .map(|run| String::from_utf8(run).unwrap())
        .collect()
}

#[test]
fn wrapped_base64_is_redacted_at_every_alignment_break_width_and_line_ending() {
    let redactor = redactor(&[("T", TOKEN)]);
    // Prefixes of 0 to 59 bytes put the value at each alignment and its
    // encoding across each of the first lines' breaks.
    let filler = "x-access-token:".repeat(4);
    for prefix_len in 0..60 {
        let prefix = &filler[..prefix_len];
        // `base64 FILE` of a file holding the prefix, the value and a newline.
        let plain = format!("{prefix}{TOKEN}\n");
        for engine in [STANDARD, URL_SAFE] {
            let encoded = engine.encode(&plain);
            for width in [76, 64] {
                for eol in ["\n", "\r\n"] {
                    let wrapped = wrap(&encoded, width, eol, "");
                    let input = format!("$ base64 key\n{wrapped}$ echo done\n");
                    let output = redacted_everywhere(&redactor, &input);
                    let case = format!("prefix {prefix_len}, width {width}, eol {eol:?}");
                    // Exactly what the unwrapped encoding gives, line breaks
                    // aside: the groups carrying the value replaced, once.
                    assert_eq!(
                        unwrap_lines(&output),
                        unwrap_lines(&format!(
                            "$ base64 key\n{}$ echo done\n",
                            expected_base64(&encoded, prefix_len, TOKEN.len())
                        )),
                        "{case}: {output}"
                    );
                    assert_eq!(output.matches("[REDACTED:T]").count(), 1, "{case}");
                    // The lines around it are kept as they were.
                    assert!(output.starts_with("$ base64 key\n"), "{case}: {output}");
                    assert!(output.ends_with(&format!("{eol}$ echo done\n")), "{case}");
                }
            }
        }
    }
}

#[test]
fn a_pem_block_whose_body_holds_the_value_is_redacted_at_every_offset() {
    let redactor = redactor(&[("T", TOKEN)]);
    for offset in 0..70 {
        // A DER-like body: binary bytes, the value, more binary bytes.
        let mut der: Vec<u8> = (0..offset).map(|n| (n * 37 + 0x30) as u8).collect();
        der.extend_from_slice(TOKEN.as_bytes());
        der.extend((0..40).map(|n| (n * 91 + 7) as u8));
        for eol in ["\n", "\r\n"] {
            let pem = format!(
                "-----BEGIN PRIVATE KEY-----{eol}{}-----END PRIVATE KEY-----{eol}",
                wrap(&STANDARD.encode(&der), 64, eol, "")
            );
            let output = redacted_everywhere(&redactor, &pem);
            let joined = unwrap_lines(&output);
            for run in base64_runs(TOKEN.as_bytes()) {
                assert!(!joined.contains(&run), "offset {offset}: {output}");
            }
            assert_eq!(output.matches("[REDACTED:T]").count(), 1, "{output}");
            assert!(output.starts_with(&format!("-----BEGIN PRIVATE KEY-----{eol}")));
            assert!(output.ends_with(&format!("{eol}-----END PRIVATE KEY-----{eol}")));
        }
    }
}

#[test]
fn an_indented_pem_block_is_redacted() {
    // A key in a YAML document: every line of the block indented.
    let redactor = redactor(&[("T", TOKEN)]);
    for offset in 0..48 {
        let mut der = vec![0x30u8; offset];
        der.extend_from_slice(TOKEN.as_bytes());
        der.extend_from_slice(&[0x02; 30]);
        let yaml = format!(
            "tls.key: |\n    -----BEGIN PRIVATE KEY-----\n{}    -----END PRIVATE KEY-----\n",
            wrap(&STANDARD.encode(&der), 64, "\n", "    ")
        );
        let output = redacted_everywhere(&redactor, &yaml);
        let joined = unwrap_lines(&output);
        for run in base64_runs(TOKEN.as_bytes()) {
            assert!(!joined.contains(&run), "offset {offset}: {output}");
        }
    }
}

#[test]
fn hex_wrapped_as_xxd_plain_writes_it_is_redacted() {
    let redactor = redactor(&[("T", TOKEN)]);
    for prefix_len in 0..40 {
        let plain = format!("{}{TOKEN}\n", "p".repeat(prefix_len));
        let hex: String = plain.bytes().map(|byte| format!("{byte:02x}")).collect();
        let output = redacted_everywhere(&redactor, &wrap(&hex, 60, "\n", ""));
        let token_hex: String = TOKEN.bytes().map(|byte| format!("{byte:02x}")).collect();
        assert!(!unwrap_lines(&output).contains(&token_hex), "{output}");
        assert!(output.contains("[REDACTED:T]"), "{output}");
    }
}

#[test]
fn ordinary_lines_are_not_joined_and_streams_hold_back_only_after_a_long_base64_run() {
    let redactor = redactor(&[("T", TOKEN)]);
    // Prose and code whose lines end in letters: untouched, nothing held.
    let mut stream = redactor.stream();
    for line in ["plain text\n", "fn main() {\n", "    let value = compute\n"] {
        assert_eq!(stream.push(line.as_bytes()), line.as_bytes());
        assert_eq!(stream.held_back(), 0, "{line:?}");
    }
    // A line that may be wrapped base64 (48 or more of its characters before
    // the break) waits for the next line's first character: the break and
    // the characters before it that a match may widen over, unless a form
    // may begin earlier.
    let line = format!("{}\n", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY".repeat(2));
    let released = stream.push(line.as_bytes());
    assert!(stream.held_back() <= 4, "held {}", stream.held_back());
    let mut out = released;
    out.extend(stream.push(b"$ next\n"));
    out.extend(stream.finish());
    assert_eq!(out, format!("{line}$ next\n").as_bytes());
}

fn wrap_widths() -> impl Strategy<Value = usize> {
    prop_oneof![Just(76usize), Just(70), Just(64), Just(60), 48usize..120]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn wrapped_base64_never_survives_at_any_width(
        value in secret_values(),
        prefix in "[ -~]{0,90}",
        suffix in "[ -~\n]{0,8}",
        width in wrap_widths(),
        crlf in any::<bool>(),
        url in any::<bool>(),
        before in texts(),
        after in texts(),
        chunk_len in 1usize..40,
    ) {
        let redactor = redactor(&[("S", &value)]);
        let engine = if url { URL_SAFE } else { STANDARD };
        let encoded = engine.encode(format!("{prefix}{value}{suffix}"));
        let eol = if crlf { "\r\n" } else { "\n" };
        let text = format!("{before}\n{}{after}", wrap(&encoded, width, eol, ""));
        let redacted = redactor.redact(&text);
        let alignment = u8::try_from(prefix.len() % 3).unwrap();
        let run = crate::forms::base64_run(value.as_bytes(), alignment, url).unwrap();
        let run = String::from_utf8(run).unwrap();
        prop_assert!(!unwrap_lines(&redacted).contains(&run), "{run:?} survives in {redacted:?}");
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> =
            text.as_bytes().chunks(chunk_len).flat_map(|chunk| stream.push(chunk)).collect();
        streamed.extend(stream.finish());
        prop_assert_eq!(&streamed[..], &*redactor.redact_bytes(text.as_bytes()));
    }

    #[test]
    fn streams_agree_with_one_shot_redaction_on_wrapped_text(
        values in proptest::collection::vec("[A-Za-z0-9+/=_ -]{8,20}", 1..3),
        pieces in proptest::collection::vec(
            ("[A-Za-z0-9+/=-]{0,60}", prop_oneof!["", "\n", "\r\n", "\n  ", " ", "=", "\r"], 0usize..6),
            0..8,
        ),
        width in 48usize..64,
        chunk_len in 1usize..24,
    ) {
        let secrets: Vec<(String, String)> =
            values.iter().enumerate().map(|(index, value)| (format!("S{index}"), value.clone())).collect();
        let redactor = Arc::new(Redactor::new(secrets).unwrap());
        let values: Vec<Vec<u8>> = values.iter().map(|value| value.as_bytes().to_vec()).collect();
        let pieces = pieces
            .into_iter()
            .map(|(noise, separator, pick)| (format!("{noise}{separator}").into_bytes(), pick))
            .collect();
        // Forms and noise, cut into lines as a wrapping encoder would.
        let flat = spliced(&redactor, &values, pieces);
        let mut input = Vec::new();
        for line in flat.chunks(width) {
            input.extend_from_slice(line);
            input.push(b'\n');
        }
        let mut stream = redactor.stream();
        let mut streamed: Vec<u8> = input.chunks(chunk_len).flat_map(|chunk| stream.push(chunk)).collect();
        streamed.extend(stream.finish());
        prop_assert_eq!(&streamed[..], &*redactor.redact_bytes(&input));
    }
}
