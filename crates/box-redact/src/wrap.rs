//! Line-wrapped encodings: base64 as `base64` and MIME write it (76
//! columns), OpenSSH private keys (70), PEM, `openssl base64` and PGP (64),
//! hex as `xxd -p` (60), such a block indented in a YAML file. A value's
//! form cut by line breaks is found by searching, besides the text itself,
//! each *chain* of the text with its breaks taken out.
//!
//! A line break (`\n` or `\r\n`, with the spaces and tabs that indent the
//! next line) is *joinable* when the [`MIN_WRAP`] (48) bytes before it are
//! all base64 characters (either alphabet; hex digits are some) and the
//! first byte after it is one too, or `=`. A chain is the runs of base64
//! characters that joinable breaks link: its first run from the last other
//! byte before its first break, its last run up to the first other byte
//! after its last break. Both rules look only a bounded distance from the
//! break (48 bytes back, the indentation and one byte forward), so a stream
//! decides a break from the few bytes it keeps (`stream`); and since no line
//! of prose, code or logs ends in 48 letters and digits, ordinary text has
//! no chain to search again, and finding that out costs a look at every
//! fifth 8-byte word (`wrapped_line_ends`).
//!
//! Not joined: lines narrower than 48 characters (`base64 -w 40`), a break
//! inside a run of other characters (`xxd` with offsets and spaces, `od`),
//! a line that starts with other text before its base64 (`key: QUJD...`
//! is joined only when 48 base64 characters end it), `\n` escaped inside
//! a JSON string as a unit printed it (the host redacts the strings of the
//! JSON messages it parses, decoded). A form found in a chain is replaced
//! with the breaks inside it: the lines it spans become one.

use std::ops::Range;

use crate::forms::is_base64_char;

/// The fewest base64 characters that must end a line for its break to be
/// joinable: narrower than the wrap width of the usual encoders (`base64`
/// and MIME 76, OpenSSH keys 70, PEM, `openssl base64` and PGP 64, `xxd -p`
/// 60), wider than what ends a line of prose or code, and wide enough that
/// looking at every fifth 8-byte word finds every such line
/// (`wrapped_line_ends`).
pub(crate) const MIN_WRAP: usize = 48;

/// A line break: `start` at its `\r` or `\n`, `end` past the next line's
/// indentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Break {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Where the run of base64 characters before it starts.
    pub(crate) run: usize,
    /// The text ends in it: joinable if what comes next is; only while
    /// more may follow.
    pub(crate) pending: bool,
}

/// Base64 runs linked by joinable breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    /// Where its first run starts.
    pub(crate) start: usize,
    /// Its breaks, indexes into `Wraps::breaks`.
    pub(crate) breaks: Range<usize>,
    /// Where its last run ends (the pending break's start when it ends in
    /// one).
    pub(crate) end: usize,
    /// It ends in a pending break: it touches the end of the text.
    pub(crate) pending: bool,
}

/// The joinable breaks of a text and the chains they make, in order.
#[derive(Debug, Default)]
pub(crate) struct Wraps {
    pub(crate) breaks: Vec<Break>,
    pub(crate) chains: Vec<Chain>,
}

impl Wraps {
    /// The joinable breaks and chains of `text`; with `more`, a break the
    /// text ends in (or a `\r` it ends in) counts as pending. Linear: every
    /// byte is looked at a bounded number of times.
    pub(crate) fn find(text: &[u8], more: bool) -> Wraps {
        let mut breaks = Vec::new();
        for (run, start) in wrapped_line_ends(text) {
            let newline = match text[start] {
                b'\r' if text.get(start + 1) == Some(&b'\n') => start + 1,
                b'\n' => start,
                // A `\r` last: its `\n` may come next.
                _ => {
                    if more && start + 1 == text.len() {
                        breaks.push(Break {
                            start,
                            end: text.len(),
                            run,
                            pending: true,
                        });
                    }
                    continue;
                }
            };
            let mut end = newline + 1;
            while matches!(text.get(end), Some(b' ' | b'\t')) {
                end += 1;
            }
            match text.get(end) {
                Some(&byte) if is_base64_char(byte) || byte == b'=' => breaks.push(Break {
                    start,
                    end,
                    run,
                    pending: false,
                }),
                None if more => breaks.push(Break {
                    start,
                    end,
                    run,
                    pending: true,
                }),
                _ => {}
            }
        }
        let mut chains = Vec::new();
        let mut index = 0;
        while index < breaks.len() {
            let first = index;
            let start = breaks[index].run;
            let (end, pending) = loop {
                let at = breaks[index];
                index += 1;
                if at.pending {
                    break (at.start, true);
                }
                // The next line continues the chain when it is all base64
                // up to its own joinable break.
                match breaks.get(index) {
                    Some(next) if next.run <= at.end => {}
                    _ => break (run_end(text, at.end), false),
                }
            };
            chains.push(Chain {
                start,
                breaks: first..index,
                end,
                pending,
            });
        }
        Wraps { breaks, chains }
    }

    /// How many pieces `chain` has: the text before, between and (unless it
    /// ends in a pending break) after its breaks.
    pub(crate) fn piece_count(&self, chain: &Chain) -> usize {
        chain.breaks.len() + usize::from(!chain.pending)
    }

    /// Piece `index` of `chain`, as a range of the text.
    pub(crate) fn piece(&self, chain: &Chain, index: usize) -> Range<usize> {
        let start = match index {
            0 => chain.start,
            _ => self.breaks[chain.breaks.start + index - 1].end,
        };
        let end = match self.breaks.get(chain.breaks.start + index) {
            Some(at) if index < chain.breaks.len() => at.start,
            _ => chain.end,
        };
        start..end
    }

    /// Write `pieces` of `chain` into `view`, its breaks taken out, and,
    /// when they end with the chain's last piece, up to `lookahead` bytes of
    /// the text after it (a match widens over them; none is found in them);
    /// `map` gets, per piece, its start in `view` and in `text`. Returns the
    /// length of `view` without the lookahead.
    pub(crate) fn view(
        &self,
        chain: &Chain,
        pieces: Range<usize>,
        (text, lookahead): (&[u8], usize),
        view: &mut Vec<u8>,
        map: &mut Vec<(usize, usize)>,
    ) -> usize {
        view.clear();
        map.clear();
        let last = pieces.end == self.piece_count(chain);
        for index in pieces {
            let piece = self.piece(chain, index);
            map.push((view.len(), piece.start));
            view.extend_from_slice(&text[piece]);
        }
        let len = view.len();
        if last && !chain.pending {
            view.extend_from_slice(&text[chain.end..(chain.end + lookahead).min(text.len())]);
        }
        len
    }
}

/// Every `\r` or `\n` that the `MIN_WRAP` bytes before it, all base64
/// characters, make the end of a wrapped line: where the run before it
/// starts, and its offset. Not a scan of
/// every line break (a step per line of ordinary text, several times the
/// cost of the rest of the search): a run of `MIN_WRAP` base64 characters
/// holds `SAMPLE` consecutive aligned 8-byte words, so only every
/// `SAMPLE`th word is looked at, and a word that is all base64 is followed
/// to the end of its run.
fn wrapped_line_ends(text: &[u8]) -> Vec<(usize, usize)> {
    const SAMPLE: usize = MIN_WRAP / 8 - 1;
    let mut ends = Vec::new();
    // Bytes before `skip` are inside a run already followed to its end.
    let mut skip = 0;
    let mut at = 0;
    while let Some(word) = word_at(text, at) {
        if at >= skip && base64_bytes(word) == HIGHS {
            let end = run_end(text, at + 8);
            if matches!(text.get(end), Some(b'\n' | b'\r')) {
                let start = run_start(text, at);
                if end - start >= MIN_WRAP {
                    ends.push((start, end));
                }
            }
            skip = end + 1;
        }
        at += 8 * SAMPLE;
    }
    ends
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The 8 bytes of `text` at `at`, little-endian (the first byte lowest).
fn word_at(text: &[u8], at: usize) -> Option<u64> {
    let word = text.get(at..at + 8)?;
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(word);
    Some(u64::from_le_bytes(bytes))
}

/// The high bit of each byte of `value` that is a base64 character (either
/// alphabet), computed word-wide without a branch: a byte's range tests are
/// sums that never carry into the next byte (its high bit is cleared first,
/// and a byte that had one is no character).
fn base64_bytes(value: u64) -> u64 {
    let low = value & !HIGHS;
    let at_least = |first: u8| low + ONES * u64::from(0x80 - first);
    let above = |last: u8| low + ONES * u64::from(0x7f - last);
    let digit = at_least(b'0') & !above(b'9');
    let upper = at_least(b'A') & !above(b'Z');
    let lower = at_least(b'a') & !above(b'z');
    // `+`, `-` and `/` are the odd bytes of `+`..=`/` (`,` and `.` even):
    // shifted by 7, each byte's lowest bit lands on its own high bit.
    let symbol = at_least(b'+') & !above(b'/') & (value << 7);
    let underscore = at_least(b'_') & !above(b'_');
    (digit | upper | lower | symbol | underscore) & !value & HIGHS
}

/// The end of the run of base64 characters that starts at or continues
/// through `from`: the first offset at or after it that is no base64
/// character (or the text's length).
fn run_end(text: &[u8], from: usize) -> usize {
    let mut at = from;
    while let Some(word) = word_at(text, at) {
        let other = !base64_bytes(word) & HIGHS;
        if other != 0 {
            return at + other.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while at < text.len() && is_base64_char(text[at]) {
        at += 1;
    }
    at
}

/// The start of the run of base64 characters that ends at `to`.
fn run_start(text: &[u8], to: usize) -> usize {
    let mut at = to;
    while let Some(word) = at.checked_sub(8).and_then(|start| word_at(text, start)) {
        let other = !base64_bytes(word) & HIGHS;
        if other != 0 {
            return at - other.leading_zeros() as usize / 8;
        }
        at -= 8;
    }
    while at > 0 && is_base64_char(text[at - 1]) {
        at -= 1;
    }
    at
}

/// The offset in the text of offset `at` of a view built by
/// [`Wraps::view`] with `pieces`.
pub(crate) fn original(pieces: &[(usize, usize)], at: usize) -> usize {
    let index = pieces
        .partition_point(|&(in_view, _)| in_view <= at)
        .saturating_sub(1);
    let (in_view, in_text) = pieces[index];
    in_text + (at - in_view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// 52 base64 characters: a line of a wrapped block.
    const LINE: &str = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xt";

    #[test]
    fn breaks_after_a_long_line_of_base64_join_the_next_line() {
        let text = format!("$ base64 f\n{LINE}\n{LINE}\r\n  {LINE}\n==\nok\n");
        let wraps = Wraps::find(text.as_bytes(), false);
        // The break after `$ base64 f` and the one before `ok` are not
        // joinable; the one before `==` is (padding continues the encoding).
        assert_eq!(wraps.breaks.len(), 3, "{wraps:?}");
        assert_eq!(wraps.chains.len(), 1);
        let chain = &wraps.chains[0];
        assert_eq!(chain.start, 11);
        assert_eq!(&text[chain.end..chain.end + 3], "==\n");
        let (mut view, mut pieces) = (Vec::new(), Vec::new());
        assert_eq!(wraps.piece_count(chain), 4);
        let len = wraps.view(chain, 0..4, (text.as_bytes(), 3), &mut view, &mut pieces);
        assert_eq!(len, view.len() - 3);
        assert_eq!(
            String::from_utf8(view.clone()).unwrap(),
            format!("{LINE}{LINE}{LINE}==\n")
        );
        for (at, &byte) in view.iter().enumerate() {
            assert_eq!(text.as_bytes()[original(&pieces, at)], byte, "at {at}");
        }
    }

    #[test]
    fn short_lines_prose_and_code_have_no_chain() {
        for text in &[
            "short\nlines\n",
            "the quick brown fox jumps\nover the lazy dog\n",
            "    let value = compute(x)\n    value\n",
            "0123456789abcde\nf0123456789\n",
            // 47 base64 characters: one short of a wrapped line.
            &format!("{}\n{LINE}\n", &LINE[..47]),
        ] {
            let wraps = Wraps::find(text.as_bytes(), false);
            assert!(wraps.breaks.is_empty(), "{text:?}: {wraps:?}");
        }
    }

    #[test]
    fn a_break_at_the_end_is_pending_only_while_more_may_follow() {
        for end in ["\n", "\r\n", "\r", "\n  "] {
            let text = format!("x {LINE}{end}");
            let wraps = Wraps::find(text.as_bytes(), true);
            assert_eq!(
                wraps.chains,
                [Chain {
                    start: 2,
                    breaks: 0..1,
                    end: 2 + LINE.len(),
                    pending: true
                }],
                "{end:?}"
            );
            assert!(Wraps::find(text.as_bytes(), false).chains.is_empty());
        }
    }

    proptest::proptest! {
        /// The sampled search finds every line end the plain definition
        /// gives, at every alignment.
        #[test]
        fn sampled_line_ends_are_every_line_end(
            pieces in proptest::collection::vec(("[A-Za-z0-9+/_-]{0,80}", "[\r\n .:]{0,3}"), 0..12),
        ) {
            let text: String = pieces.iter().map(|(run, other)| format!("{run}{other}")).collect();
            let text = text.as_bytes();
            let naive: Vec<(usize, usize)> = (0..text.len())
                .filter(|&at| matches!(text[at], b'\r' | b'\n'))
                .map(|at| {
                    let run = (0..at).rev().take_while(|&before| is_base64_char(text[before])).count();
                    (at - run, at)
                })
                .filter(|&(start, at)| at - start >= MIN_WRAP)
                .collect();
            proptest::prop_assert_eq!(wrapped_line_ends(text), naive);
        }
    }

    #[test]
    fn base64_bytes_agrees_with_is_base64_char_on_every_byte() {
        for byte in 0..=255u8 {
            for position in 0..8 {
                let mut bytes = [b'A'; 8];
                bytes[position] = byte;
                let mask = base64_bytes(u64::from_le_bytes(bytes));
                assert_eq!(
                    mask & (0x80 << (8 * position)) != 0,
                    is_base64_char(byte),
                    "{byte:#x} at {position}"
                );
            }
        }
    }
}
