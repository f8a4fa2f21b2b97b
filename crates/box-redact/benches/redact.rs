//! The cost of redaction on a 1 MiB tool output, against what the host
//! already pays per call for the same answer: parsing the unit's JSON-RPC
//! line into a `serde_json::Value` and writing it back out.
//!
//! Run: `cargo bench -p box-redact --bench redact` (release build). Optional
//! argument: a filter on the row names (`source`, `log`, `10`, `100`,
//! `short8`).
//! `BOX_BENCH_ROUNDS` sets the rounds (default 31); each round times the
//! baseline and every redaction once, interleaved, and the figures are
//! medians.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use box_redact::Redactor;
use serde_json::{Value, json};

const MIB: usize = 1 << 20;

fn main() {
    let filter = std::env::args().nth(1).filter(|arg| !arg.starts_with('-'));
    let rounds: usize = std::env::var("BOX_BENCH_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(31);
    println!(
        "| output | secrets (forms) | build | memory | parse + write (baseline) | redact_json, 6 leaks | ratio | redact, no leak | ratio | stream, 64 KiB reads, 6 leaks | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (output_name, output) in [
        ("source", source_text()),
        ("log", build_log()),
        ("base64", wrapped_base64()),
    ] {
        for (secret_count, shortest) in [(10, None), (100, None), (100, Some(8))] {
            let row = match shortest {
                Some(len) => format!("{output_name} {secret_count} short{len}"),
                None => format!("{output_name} {secret_count}"),
            };
            if filter
                .as_deref()
                .is_some_and(|filter| !row.contains(filter))
            {
                continue;
            }
            run(output_name, &output, secret_count, shortest, rounds);
        }
    }
}

fn run(output_name: &str, base: &str, secret_count: usize, shortest: Option<usize>, rounds: usize) {
    let mut secrets = secrets(secret_count);
    // One value of the shortest redacted length brings the prefilter's
    // stride down to 5 bytes: the slowest case.
    if let Some(len) = shortest {
        secrets.pop();
        secrets.push(("PIN_CODE".to_owned(), "7".repeat(len - 1) + "Q"));
    }
    let label = match shortest {
        Some(len) => format!("{secret_count}, one of {len} bytes"),
        None => secret_count.to_string(),
    };
    let build_start = Instant::now();
    let redactor = Arc::new(
        Redactor::new(
            secrets
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
        )
        .unwrap_or_else(|error| panic!("{error}")),
    );
    let build = build_start.elapsed();
    // A few real hits, as a leaking tool would print them: raw, and base64
    // after a prefix.
    let mut text = base.to_owned();
    for (index, (_, value)) in secrets.iter().take(3).enumerate() {
        let at = text.len() / 4 * (index + 1);
        let at = (at..text.len())
            .find(|&at| text.is_char_boundary(at))
            .unwrap_or(text.len());
        let base64 =
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{value}"));
        text.insert_str(at, &format!("\ntoken={value} auth={base64}\n"));
    }
    let answer = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": text}], "isError": false},
    });
    let line = serde_json::to_string(&answer).unwrap_or_default();
    // Sanity: every inserted secret is gone, and the clean text has none.
    assert!(matches!(
        redactor.redact(base),
        std::borrow::Cow::Borrowed(_)
    ));
    let mut check = answer.clone();
    let replaced = redactor.redact_json(&mut check);
    let checked = serde_json::to_string(&check).unwrap_or_default();
    assert!(replaced >= 6, "expected at least 6 regions, got {replaced}");
    for (_, value) in &secrets {
        assert!(!checked.contains(value.as_str()), "a secret survived");
    }

    let mut baseline = Vec::new();
    let mut json_times = Vec::new();
    let mut clean_times = Vec::new();
    let mut stream_times = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let value: Value = serde_json::from_str(black_box(&line)).unwrap_or_default();
        let written = serde_json::to_string(&value).unwrap_or_default();
        baseline.push(start.elapsed());
        black_box(written);

        let mut value = answer.clone();
        let start = Instant::now();
        black_box(redactor.redact_json(black_box(&mut value)));
        json_times.push(start.elapsed());

        // The common case: nothing to replace, the text comes back borrowed.
        let start = Instant::now();
        black_box(redactor.redact(black_box(base)));
        clean_times.push(start.elapsed());

        let start = Instant::now();
        let mut stream = redactor.text_stream();
        let mut released = 0;
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut cut = rest.len().min(64 * 1024);
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            released += stream.push(&rest[..cut]).len();
            rest = &rest[cut..];
        }
        released += stream.finish().len();
        stream_times.push(start.elapsed());
        black_box(released);
    }
    // Medians, and in brackets the fastest rounds (steadier when the
    // machine is shared).
    let figures = [
        &mut baseline,
        &mut json_times,
        &mut clean_times,
        &mut stream_times,
    ]
    .map(|samples| (median(samples), fastest(samples)));
    let [baseline, json_time, clean_time, stream_time] = figures;
    let time = |(median, fastest): (Duration, Duration)| {
        format!("{:.2} ({:.2}) ms", ms(median), ms(fastest))
    };
    let ratio = |(median, fastest): (Duration, Duration)| {
        format!(
            "{:.3} ({:.3})",
            median.as_secs_f64() / baseline.0.as_secs_f64(),
            fastest.as_secs_f64() / baseline.1.as_secs_f64()
        )
    };
    println!(
        "| {output_name}, {:.2} MiB | {label} ({}) | {:.1} ms | {:.1} MiB | {} | {} | {} | {} | {} | {} | {} |",
        text.len() as f64 / MIB as f64,
        redactor.forms_len(),
        ms(build),
        redactor.memory_usage() as f64 / MIB as f64,
        time(baseline),
        time(json_time),
        ratio(json_time),
        time(clean_time),
        ratio(clean_time),
        time(stream_time),
        ratio(stream_time),
    );
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn fastest(samples: &[Duration]) -> Duration {
    samples.iter().copied().min().unwrap_or_default()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// 1 MiB of `cat`-ed source: the repository's own Rust files, repeated.
fn source_text() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src");
    let mut files = Vec::new();
    collect_rust_files(&root, &mut files);
    files.sort();
    let mut text = String::new();
    while text.len() < MIB && !files.is_empty() {
        for file in &files {
            text.push_str(&std::fs::read_to_string(file).unwrap_or_default());
            if text.len() >= MIB {
                break;
            }
        }
    }
    truncate(text)
}

fn collect_rust_files(directory: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// 1 MiB of a build log: compile lines, warnings with code excerpts, test
/// lines, as `cargo build && cargo test` prints them.
fn build_log() -> String {
    let mut random = Random(0x5eed);
    let mut text = String::new();
    let crates = [
        "serde", "tokio", "hyper", "regex", "clap", "rand", "bollard", "axum",
    ];
    while text.len() < MIB {
        let name = crates[random.below(crates.len())];
        let version = format!(
            "{}.{}.{}",
            random.below(3),
            random.below(40),
            random.below(20)
        );
        match random.below(4) {
            0 | 1 => text.push_str(&format!("   Compiling {name} v{version}\n")),
            2 => text.push_str(&format!(
                "warning: unused variable: `item{}`\n  --> src/{name}/mod.rs:{}:{}\n   |\n{} |     let item{} = compute(&input, {});\n   |         ^^^^ help: if this is intentional, prefix it with an underscore\n\n",
                random.below(100),
                random.below(900),
                random.below(80),
                random.below(900),
                random.below(100),
                random.below(1000),
            )),
            _ => text.push_str(&format!(
                "test {name}::tests::case_{} ... ok ({}.{:03}s)\n",
                random.below(10_000),
                random.below(3),
                random.below(1000)
            )),
        }
    }
    truncate(text)
}

/// 1 MiB of what `base64 FILE` prints for a binary file: lines of 76
/// characters, every break joinable, so the whole output is one chain
/// searched twice (as it is and with its breaks taken out): the slowest
/// case of the line-wrap search.
fn wrapped_base64() -> String {
    let mut random = Random(0xba5e);
    let bytes: Vec<u8> = (0..MIB / 4 * 3).map(|_| random.next() as u8).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut text = String::with_capacity(MIB + MIB / 76 + 1);
    for line in encoded.as_bytes().chunks(76) {
        text.push_str(std::str::from_utf8(line).unwrap_or_default());
        text.push('\n');
    }
    truncate(text)
}

fn truncate(mut text: String) -> String {
    let mut end = MIB.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// Realistic secret shapes: GitHub and Slack tokens, AWS key pairs, API
/// keys with `/` and `+`, hex tokens, and one multi-line private key.
fn secrets(count: usize) -> Vec<(String, String)> {
    let mut random = Random(count as u64);
    let mut secrets = Vec::new();
    let alphanumeric = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let base64_chars = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let hex_chars = b"0123456789abcdef";
    let mut key = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
    for _ in 0..25 {
        key.push_str(&random.string(base64_chars, 70));
        key.push('\n');
    }
    key.push_str("-----END OPENSSH PRIVATE KEY-----\n");
    secrets.push(("SSH_KEY".to_owned(), key));
    for index in 1..count {
        let value = match index % 5 {
            0 => format!("ghp_{}", random.string(alphanumeric, 36)),
            1 => random.string(base64_chars, 40),
            2 => format!(
                "xoxb-{}-{}",
                random.string(b"0123456789", 12),
                random.string(alphanumeric, 24)
            ),
            3 => random.string(hex_chars, 40),
            _ => format!("sk-{}", random.string(alphanumeric, 48)),
        };
        secrets.push((format!("SECRET_{index}"), value));
    }
    secrets
}

/// A small deterministic generator (xorshift), so runs compare.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn string(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| char::from(alphabet[self.below(alphabet.len())]))
            .collect()
    }
}
