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
