//! The read tool: numbered lines of one regular file, bounded three ways (the
//! bytes scanned, one line's length, the whole output), with trailers that say
//! how to go on. A read records the file's version for version-aware writes.

use std::fmt::Write as _;
use std::io::Read as _;

use serde_json::{Map, Value};

use super::{integer_arg, path_arg};
use crate::Context;
use crate::workspace::{hash, version_of};

/// The most text one read returns.
const MAX_OUTPUT_BYTES: usize = 200 * 1024;
/// The most of one line a read shows.
const MAX_LINE_BYTES: usize = 64 * 1024;
/// Lines shown when the call gives no limit.
const DEFAULT_LIMIT: i64 = 2000;

pub(super) fn run(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let raw = path_arg(arguments, "");
    let workspace = &context.workspace;
    let name = workspace.name(raw).map_err(|e| e.to_string())?;
    let (file, metadata) = workspace
        .open_regular(&name)
        .map_err(|e| e.message(&name))?;
    let cap = context.max_read_bytes;
    let size = metadata.len();
    let mut data = Vec::with_capacity(usize::try_from(size.min(cap)).unwrap_or(0));
    file.take(cap)
        .read_to_end(&mut data)
        .map_err(|e| crate::workspace::io_message(&name, &e))?;
    workspace.record(version_of(&metadata, hash(&data)));

    let offset = integer_arg(arguments, "offset", 1).max(1);
    let limit = match integer_arg(arguments, "limit", DEFAULT_LIMIT) {
        limit if limit <= 0 => DEFAULT_LIMIT,
        limit => limit,
    };
    Ok(render(&data, size, cap, offset, limit))
}

/// The numbered lines of `data` (the first `cap` bytes of a `size`-byte file)
/// from line `offset`, at most `limit` of them, with the trailers.
fn render(data: &[u8], size: u64, cap: u64, offset: i64, limit: i64) -> String {
    let scanned_all = size <= cap;
    let mut lines: Vec<&[u8]> = data.split(|byte| *byte == b'\n').collect();
    if data.is_empty() || data.ends_with(b"\n") {
        lines.pop();
    }
    let total = lines.len();
    let start = usize::try_from(offset - 1).unwrap_or(usize::MAX);
    if start >= total && !(total == 0 && start == 0) {
        return if scanned_all {
            format!("(file has {total} lines; offset {offset} is past the end)")
        } else {
            format!(
                "(offset {offset} is beyond the first {cap} bytes of this {size}-byte file, which is all read will scan; use grep to find a line)"
            )
        };
    }
    let end = start
        .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
        .min(total);
    let mut out = String::with_capacity(data.len().min(MAX_OUTPUT_BYTES) + (end - start) * 8 + 128);
    let mut shown = start;
    for (index, line) in lines.iter().enumerate().take(end).skip(start) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (kept, truncated) = if line.len() > MAX_LINE_BYTES {
            (&line[..MAX_LINE_BYTES], "... [line truncated]")
        } else {
            (line, "")
        };
        let text = String::from_utf8_lossy(kept);
        let number = index + 1;
        // Measured before writing: a line that would pass the cap is not shown.
        let size = digits(number).max(6) + 1 + text.len() + truncated.len() + 1;
        if out.len() + size > MAX_OUTPUT_BYTES && shown > start {
            break;
        }
        push_number(&mut out, number);
        out.push('\t');
        out.push_str(&text);
        out.push_str(truncated);
        out.push('\n');
        shown = number;
    }
    if shown < total {
        let _ = writeln!(
            out,
            "... ({} more lines; use offset={})",
            total - shown,
            shown + 1
        );
    }
    if !scanned_all {
        let _ = writeln!(
            out,
            "... (stopped after the first {cap} of {size} bytes; use grep to find a line later in the file)"
        );
    }
    out
}

/// How many decimal digits `number` has.
fn digits(mut number: usize) -> usize {
    let mut count = 1;
    while number >= 10 {
        number /= 10;
        count += 1;
    }
    count
}

/// `number` right-aligned six wide (`%6d`), without the formatting machinery:
/// a read formats one per line.
fn push_number(out: &mut String, number: usize) {
    for _ in digits(number)..6 {
        out.push(' ');
    }
    let mut buffer = [0u8; 20];
    let mut at = buffer.len();
    let mut rest = number;
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for byte in &buffer[at..] {
        out.push(char::from(*byte));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_padded_like_printf() {
        for number in [1, 9, 10, 99_999, 123_456, 1_234_567] {
            let mut out = String::new();
            push_number(&mut out, number);
            assert_eq!(out, format!("{number:6}"));
        }
    }

    #[test]
    fn lines_are_numbered_six_wide_with_cr_stripped() {
        assert_eq!(
            render(b"a\r\nb\n", 5, 100, 1, 2000),
            "     1\ta\n     2\tb\n"
        );
        assert_eq!(render(b"a\nb", 3, 100, 1, 2000), "     1\ta\n     2\tb\n");
    }

    #[test]
    fn offset_and_limit_page_with_a_trailer() {
        assert_eq!(
            render(b"1\n2\n3\n4\n", 8, 100, 2, 2),
            "     2\t2\n     3\t3\n... (1 more lines; use offset=4)\n"
        );
    }

    #[test]
    fn past_the_end_says_so() {
        assert_eq!(
            render(b"1\n2\n", 4, 100, 5, 10),
            "(file has 2 lines; offset 5 is past the end)"
        );
        assert_eq!(
            render(b"1\n2\n", 400, 4, 5, 10),
            "(offset 5 is beyond the first 4 bytes of this 400-byte file, which is all read will scan; use grep to find a line)"
        );
    }

    #[test]
    fn a_capped_scan_says_where_it_stopped() {
        assert_eq!(
            render(b"ab\ncd", 400, 5, 1, 10),
            "     1\tab\n     2\tcd\n... (stopped after the first 5 of 400 bytes; use grep to find a line later in the file)\n"
        );
    }

    #[test]
    fn a_long_line_is_cut() {
        let line = vec![b'x'; MAX_LINE_BYTES + 10];
        let out = render(&line, line.len() as u64, 1 << 30, 1, 10);
        assert!(out.ends_with("x... [line truncated]\n"));
    }

    #[test]
    fn an_empty_file_reads_as_nothing() {
        assert_eq!(render(b"", 0, 100, 1, 10), "");
    }
}
