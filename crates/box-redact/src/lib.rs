//! Known-value redaction: every secret value box knows (handed to a unit, or
//! removed from an environment by the scrubber) is replaced by
//! `[REDACTED:NAME]` in text that passes the host, raw or encoded, whole or
//! split across chunks.
//!
//! The one idea: box knows the values, so it masks values, not formats. A
//! [`Redactor`] is built once per session from `(name, value)` pairs; for each
//! value it computes every form a tool is likely to print it in and finds all
//! of them in one pass. What it owns: the forms, the search, the
//! replacement, and the holdback that catches a value split across chunks
//! ([`StreamRedactor`], [`TextStreamRedactor`]). What it does not: deciding
//! which values are secret, which text passes through it, or logging; the
//! host does that, and logs the [`Skipped`] values by name.
//!
//! # Search
//!
//! One Aho-Corasick automaton over all forms (standard semantics, searched
//! overlapping) is the reference and the fallback; in front of it, a sampled
//! q-gram prefilter (`filter`) looks at the text only every
//! `shortest form − 3` bytes, so output without secrets, the common case,
//! costs a lookup every few dozen bytes instead of an automaton step per
//! byte (BENCHMARKS.md, "Redaction").
//! Both find the same occurrences (a property test checks it); text dense in
//! candidates falls back to the automaton, whose time is linear whatever the
//! input.
//!
//! # Forms searched for
//!
//! For each value of at least [`MIN_SECRET_LEN`] bytes, and separately for
//! each line of at least that length of a multi-line value (a key printed
//! line by line, a value with a trailing newline printed without it):
//!
//! - raw bytes;
//! - base64, standard and URL-safe alphabets, at the three byte alignments:
//!   the stable inner run of characters that every base64 encoding of a
//!   longer text holding the value at offset 0, 1 or 2 (mod 3) contains,
//!   padded or not (so `base64("x-access-token:" + V)` is caught);
//! - hex, lower and upper case;
//! - percent-encoded as RFC 3986 (both hex cases), `encodeURIComponent`,
//!   Python `quote` (keeps `/`) and form encoding (`+` for a space, both hex
//!   cases);
//! - JSON-escaped as serde_json and `JSON.stringify` write it (quote,
//!   backslash, control characters; non-ASCII as is) and as Python's
//!   `json.dumps` writes it by default (also `\uXXXX` for non-ASCII).
//!
//! A form that equals another (a token of letters and digits is its own
//! percent and JSON form) is searched once. A value registered under two
//! names is reported under the first.
//!
//! # Line-wrapped encodings
//!
//! Every form is also found cut by line breaks, as `base64` and MIME (76
//! columns), OpenSSH keys (70), PEM, `openssl base64` and PGP (64) and
//! `xxd -p` (60) write them, with `\n` or `\r\n` and the next line indented
//! or not: a break is taken out when the 48 bytes before it are base64
//! characters and the byte after its indentation is one too (or `=`), and
//! the runs such breaks link are searched again without them (`wrap`). The
//! region replaced spans the breaks inside it. Text without such a line
//! costs a word-wide test every 40 bytes; wrapped base64 is searched twice
//! (BENCHMARKS.md, "Redaction").
//!
//! # What is replaced
//!
//! The union of all matches, overlapping ones included, so two secrets that
//! overlap in the text are both gone (a leftmost-longest search would leave
//! the second one's tail). Each maximal covered region becomes one
//! `[REDACTED:NAME]` per secret that extends it, in order: a secret that is a
//! prefix of another, printed in full, gives one marker, the longer one's.
//! A base64 match is widened over the characters at its edges that carry
//! some of the value's bits (one each side at most, depending on the
//! alignment) and over the `=` padding that would follow the value when it
//! ends the encoded text; the rest of the encoded run (the prefix's
//! characters) stays, because it carries none of the secret. Text redaction
//! ([`Redactor::redact`], [`TextStreamRedactor`]) widens each region to
//! character boundaries, so the output is always valid UTF-8.
//!
//! # Not redacted
//!
//! - Values shorter than [`MIN_SECRET_LEN`] (8) bytes: masking short strings
//!   everywhere mangles output with false hits. They are reported by
//!   [`Redactor::skipped`], never silently masked everywhere; the host should
//!   warn naming the variable.
//! - Whole values longer than [`MAX_SECRET_LEN`]: only their lines are
//!   registered, and they are reported too.
//! - Transformations not anticipated: base64 or hex wrapped narrower than
//!   48 columns, or at a line that does not end in 48 base64 characters
//!   (a short first line after a prefix), other text wrapped at spaces,
//!   separators inside hex dumps (`xxd`, `od`), base32, `\/` and other
//!   optional JSON escapes, HTML or XML entities, reversal, compression,
//!   encryption, two encodings nested. Masking is the last line, not the
//!   control.

// Beyond the workspace's lints: no unsafe code at all, every public item documented.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod filter;
mod forms;
mod json;
pub mod persisted;
mod search;
mod stream;
#[cfg(test)]
mod tests;
mod wrap;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use aho_corasick::{AhoCorasick, MatchKind};

pub use stream::{StreamRedactor, TextStreamRedactor};

/// Values shorter than this many bytes are not redacted (too many false
/// hits); [`Redactor::skipped`] names them.
pub const MIN_SECRET_LEN: usize = 8;

/// Whole values longer than this many bytes are registered by their lines
/// only (bounds the automaton a session builds); [`Redactor::skipped`] names
/// them.
pub const MAX_SECRET_LEN: usize = 64 * 1024;

/// A redactor that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum RedactError {
    /// The automaton over all forms exceeds aho-corasick's limits.
    #[error(
        "cannot build the redaction automaton over {patterns} forms of {secrets} secrets: {source}"
    )]
    Automaton {
        /// How many distinct forms were registered.
        patterns: usize,
        /// How many secrets they came from.
        secrets: usize,
        /// What aho-corasick reported.
        source: aho_corasick::BuildError,
    },
}

/// A secret whose value is not (or not wholly) redacted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The secret's name, as given.
    pub name: String,
    /// The value's length in bytes (never the value).
    pub len: usize,
    /// Why.
    pub reason: SkipReason,
}

/// Why a secret is not (or not wholly) redacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Shorter than [`MIN_SECRET_LEN`]: not redacted at all (its lines are
    /// shorter still).
    TooShort,
    /// Longer than [`MAX_SECRET_LEN`]: only its lines (of
    /// [`MIN_SECRET_LEN`] to [`MAX_SECRET_LEN`] bytes) are redacted; none
    /// when it has no newline.
    TooLong,
}

impl fmt::Display for Skipped {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            SkipReason::TooShort => write!(
                formatter,
                "secret {} is {} bytes, shorter than {MIN_SECRET_LEN}: it is not redacted from output",
                self.name, self.len
            ),
            SkipReason::TooLong => write!(
                formatter,
                "secret {} is {} bytes, longer than {MAX_SECRET_LEN}: only its lines of {MIN_SECRET_LEN} to {MAX_SECRET_LEN} bytes are redacted from output",
                self.name, self.len
            ),
        }
    }
}

/// What a search pattern stands for.
#[derive(Clone, Copy, Debug)]
struct Pattern {
    /// Index into `Redactor::names`.
    name: u32,
    kind: forms::FormKind,
}

/// Replaces every registered secret value, raw or encoded, by
/// `[REDACTED:NAME]`. Built once per session; cheap to share behind an `Arc`
/// (the streaming redactors hold one).
#[derive(Clone)]
pub struct Redactor {
    automaton: AhoCorasick,
    /// Skips ahead over text that cannot hold a form; `None` without forms.
    filter: Option<filter::Filter>,
    /// Per automaton pattern id.
    patterns: Vec<Pattern>,
    /// The pattern bytes, per pattern id.
    pattern_bytes: Vec<Box<[u8]>>,
    /// Pattern ids sorted by their bytes: "is this suffix the start of a
    /// form?" is a binary search.
    sorted: Vec<u32>,
    /// Bit `a * 256 + b` set when some pattern starts with bytes `a b`; bit
    /// `a` of `first_bytes` when some pattern starts with `a`.
    first_pairs: Box<[u64]>,
    first_bytes: [u64; 4],
    max_pattern_len: usize,
    min_pattern_len: usize,
    /// The most characters a match widens over to its left, and to its right.
    max_left_widening: usize,
    max_right_widening: usize,
    names: Vec<String>,
    skipped: Vec<Skipped>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the values or their forms.
        formatter
            .debug_struct("Redactor")
            .field("names", &self.names)
            .field("patterns", &self.patterns.len())
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl Redactor {
    /// A redactor for `secrets`, given as `(name, value)` pairs. Values
    /// shorter than [`MIN_SECRET_LEN`] are not redacted and longer than
    /// [`MAX_SECRET_LEN`] only by line; both are listed in
    /// [`Redactor::skipped`].
    pub fn new<I, N, V>(secrets: I) -> Result<Redactor, RedactError>
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: AsRef<[u8]>,
    {
        let mut names = Vec::new();
        let mut skipped = Vec::new();
        let mut index: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut patterns = Vec::new();
        let mut pattern_bytes: Vec<Box<[u8]>> = Vec::new();
        for (name, value) in secrets {
            let name = name.into();
            let value = value.as_ref();
            if value.len() < MIN_SECRET_LEN {
                skipped.push(Skipped {
                    name,
                    len: value.len(),
                    reason: SkipReason::TooShort,
                });
                continue;
            }
            if value.len() > MAX_SECRET_LEN {
                skipped.push(Skipped {
                    name: name.clone(),
                    len: value.len(),
                    reason: SkipReason::TooLong,
                });
            }
            let name_index = u32::try_from(names.len()).unwrap_or(u32::MAX);
            names.push(name);
            for registered in forms::registered_values(value, MIN_SECRET_LEN, MAX_SECRET_LEN) {
                for form in forms::forms(registered) {
                    if index.contains_key(&form.bytes) {
                        continue;
                    }
                    let id = u32::try_from(patterns.len()).unwrap_or(u32::MAX);
                    index.insert(form.bytes.clone(), id);
                    patterns.push(Pattern {
                        name: name_index,
                        kind: form.kind,
                    });
                    pattern_bytes.push(form.bytes.into_boxed_slice());
                }
            }
        }
        let automaton = AhoCorasick::builder()
            // Standard semantics, searched overlapping: every occurrence of
            // every form, so overlapping secrets are all found.
            .match_kind(MatchKind::Standard)
            .build(&pattern_bytes)
            .map_err(|source| RedactError::Automaton {
                patterns: pattern_bytes.len(),
                secrets: names.len(),
                source,
            })?;
        let mut sorted: Vec<u32> =
            (0..u32::try_from(pattern_bytes.len()).unwrap_or(u32::MAX)).collect();
        sorted.sort_unstable_by(|&a, &b| pattern_bytes[a as usize].cmp(&pattern_bytes[b as usize]));
        let mut first_pairs = vec![0u64; 65536 / 64].into_boxed_slice();
        let mut first_bytes = [0u64; 4];
        for bytes in &pattern_bytes {
            if let [first, rest @ ..] = &bytes[..] {
                set_bit(&mut first_bytes, usize::from(*first));
                if let [second, ..] = rest {
                    set_bit(
                        &mut first_pairs,
                        usize::from(*first) * 256 + usize::from(*second),
                    );
                }
            }
        }
        let max_left_widening = patterns
            .iter()
            .map(|pattern| pattern.kind.widening().0)
            .max()
            .unwrap_or(0);
        let max_right_widening = patterns
            .iter()
            .map(|pattern| pattern.kind.widening().1)
            .max()
            .unwrap_or(0);
        let min_pattern_len = pattern_bytes
            .iter()
            .map(|bytes| bytes.len())
            .min()
            .unwrap_or(0);
        let max_pattern_len = pattern_bytes
            .iter()
            .map(|bytes| bytes.len())
            .max()
            .unwrap_or(0);
        Ok(Redactor {
            filter: filter::Filter::new(&pattern_bytes),
            automaton,
            patterns,
            pattern_bytes,
            sorted,
            first_pairs,
            first_bytes,
            max_pattern_len,
            min_pattern_len,
            max_left_widening,
            max_right_widening,
            names,
            skipped,
        })
    }

    /// The secrets not (or not wholly) redacted, with the reason; the host
    /// warns about each by name.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Whether nothing is redacted (no secret long enough was given).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// How many distinct forms are searched for.
    pub fn forms_len(&self) -> usize {
        self.patterns.len()
    }

    /// Heap bytes used by the search automaton and the pattern tables.
    pub fn memory_usage(&self) -> usize {
        self.automaton.memory_usage()
            + self.filter.as_ref().map_or(0, filter::Filter::memory_usage)
            + self
                .pattern_bytes
                .iter()
                .map(|bytes| bytes.len() + 16)
                .sum::<usize>()
            + self.sorted.len() * 4
            + self.patterns.len() * std::mem::size_of::<Pattern>()
            + self.first_pairs.len() * 8
    }

    /// `text` with every registered secret form replaced by
    /// `[REDACTED:NAME]`; borrowed, byte-identical, when nothing matched.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match self.redact_counted(text) {
            Some((redacted, _)) => Cow::Owned(redacted),
            None => Cow::Borrowed(text),
        }
    }

    /// Whether `bytes` hold any registered form: the search [`redact_bytes`]
    /// runs, without building the redacted copy.
    ///
    /// [`redact_bytes`]: Self::redact_bytes
    pub fn finds_any(&self, bytes: &[u8]) -> bool {
        !self.is_empty()
            && !self
                .regions(bytes, search::Units::Bytes, search::Ending::Final)
                .is_empty()
    }

    /// `bytes` with every registered secret form replaced by
    /// `[REDACTED:NAME]`; borrowed, byte-identical, when nothing matched.
    /// Regions are not widened to UTF-8 character boundaries.
    pub fn redact_bytes<'b>(&self, bytes: &'b [u8]) -> Cow<'b, [u8]> {
        let mut out = Vec::new();
        match self.redact_bytes_into(bytes, &mut out) {
            true => Cow::Owned(out),
            false => Cow::Borrowed(bytes),
        }
    }

    /// [`redact_bytes`] written into `out` (cleared first), so a caller that
    /// redacts large buffers again and again keeps one allocation instead of
    /// faulting in fresh pages each time. `false`, `out` left empty, when
    /// nothing matched.
    ///
    /// [`redact_bytes`]: Self::redact_bytes
    pub fn redact_bytes_into(&self, bytes: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        let regions = self.regions(bytes, search::Units::Bytes, search::Ending::Final);
        if regions.is_empty() {
            return false;
        }
        out.reserve(bytes.len());
        self.write_redacted(bytes, &regions, (0, bytes.len()), out);
        true
    }

    /// Every string in `value` redacted in place, object keys included (they
    /// rarely carry secrets, and checking them is cheap); a number whose
    /// digits hold a secret becomes the marker string. Returns how many
    /// regions were replaced.
    pub fn redact_json(&self, value: &mut serde_json::Value) -> usize {
        if self.is_empty() {
            return 0;
        }
        json::redact_value(self, value)
    }

    /// A streaming redactor over bytes sharing this redactor.
    pub fn stream(self: &std::sync::Arc<Self>) -> StreamRedactor {
        StreamRedactor::new(std::sync::Arc::clone(self))
    }

    /// A streaming redactor over text sharing this redactor.
    pub fn text_stream(self: &std::sync::Arc<Self>) -> TextStreamRedactor {
        TextStreamRedactor::new(std::sync::Arc::clone(self))
    }

    /// The redacted text and how many regions were replaced, or `None` when
    /// nothing matched.
    fn redact_counted(&self, text: &str) -> Option<(String, usize)> {
        if self.is_empty() {
            return None;
        }
        let bytes = text.as_bytes();
        let regions = self.regions(bytes, search::Units::Chars, search::Ending::Final);
        if regions.is_empty() {
            return None;
        }
        let mut redacted = String::with_capacity(text.len());
        self.write_redacted_text(text, &regions, (0, text.len()), &mut redacted);
        Some((redacted, regions.len()))
    }
}

fn set_bit(bits: &mut [u64], index: usize) {
    bits[index / 64] |= 1 << (index % 64);
}

fn has_bit(bits: &[u64], index: usize) -> bool {
    bits[index / 64] & (1 << (index % 64)) != 0
}
