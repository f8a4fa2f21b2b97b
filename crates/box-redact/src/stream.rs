//! Redaction of output that arrives in chunks (a process read in several
//! `process.read` calls, progress notifications carrying output, one byte
//! per write), catching a secret split across chunks.
//!
//! Each push scans what was held back plus the new chunk, releases
//! everything that can no longer be part of a match, redacted, and holds
//! back only the shortest tail that could still be part of one: the longest
//! suffix that is a proper prefix of some form, plus the base64 characters
//! (three at most) just before it that a base64 match would widen over, or
//! the whole of a match whose widening needs bytes not yet seen. A chunk
//! that ends a line or a word boundary holds nothing back; one that ends in
//! letters or digits may hold up to three. A chunk that ends a line of 48
//! base64 characters (wrapped base64 may continue on the next) holds the
//! break and the few characters before it a match may widen over, or more
//! when a form may begin earlier in the lines it joins. After each release
//! the stream keeps, as context and never releases again, the base64
//! characters (48 at most) just before what it holds, so the next scan sees
//! whether a break at its start ends a wrapped line. `finish` releases the
//! rest at the end of the stream. The concatenation of everything released
//! equals [`Redactor::redact_bytes`] of the concatenated input (or
//! [`Redactor::redact`] for text); property tests check it, on wrapped text
//! too.

use std::sync::Arc;

use crate::Redactor;
use crate::forms::is_base64_char;
use crate::search::{Ending, Region, Units};
use crate::wrap::MIN_WRAP;

/// Streaming redaction over bytes. Output may not be UTF-8 at chunk
/// boundaries, so this works on bytes and may release part of a character
/// (exactly as a chunk ended in one, or where a held-back tail starts);
/// decode the concatenation, or use [`TextStreamRedactor`] when every chunk
/// is text.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Arc<Redactor>,
    /// The context (released already), then what is held back.
    pending: Vec<u8>,
    /// How many bytes of `pending` are context.
    context: usize,
}

impl StreamRedactor {
    /// An empty stream over `redactor`'s secrets.
    pub fn new(redactor: Arc<Redactor>) -> StreamRedactor {
        StreamRedactor {
            redactor,
            pending: Vec::new(),
            context: 0,
        }
    }

    /// Take the next chunk; returns the redacted bytes that are now safe to
    /// pass on (possibly none, possibly some of earlier chunks).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        step(
            &self.redactor,
            (&mut self.pending, &mut self.context),
            chunk,
            Ending::More,
        )
    }

    /// End of the stream: returns the rest, redacted. The stream is empty
    /// afterwards and may be used for a new one.
    pub fn finish(&mut self) -> Vec<u8> {
        step(
            &self.redactor,
            (&mut self.pending, &mut self.context),
            &[],
            Ending::Final,
        )
    }

    /// How many bytes are held back, waiting for the next chunk.
    pub fn held_back(&self) -> usize {
        self.pending.len() - self.context
    }
}

/// Streaming redaction over text: every chunk is a `&str`, and every
/// release is a `String` that ends on a character boundary, so each can go
/// into a JSON string on its own.
#[derive(Debug)]
pub struct TextStreamRedactor {
    redactor: Arc<Redactor>,
    /// The context (released already), then what is held back.
    pending: String,
    /// How many bytes of `pending` are context.
    context: usize,
}

impl TextStreamRedactor {
    /// An empty stream over `redactor`'s secrets.
    pub fn new(redactor: Arc<Redactor>) -> TextStreamRedactor {
        TextStreamRedactor {
            redactor,
            pending: String::new(),
            context: 0,
        }
    }

    /// Take the next chunk; returns the redacted text that is now safe to
    /// pass on (possibly empty, possibly some of earlier chunks).
    pub fn push(&mut self, chunk: &str) -> String {
        step_text(
            &self.redactor,
            (&mut self.pending, &mut self.context),
            chunk,
            Ending::More,
        )
    }

    /// End of the stream: returns the rest, redacted. The stream is empty
    /// afterwards and may be used for a new one.
    pub fn finish(&mut self) -> String {
        step_text(
            &self.redactor,
            (&mut self.pending, &mut self.context),
            "",
            Ending::Final,
        )
    }

    /// How many bytes are held back, waiting for the next chunk.
    pub fn held_back(&self) -> usize {
        self.pending.len() - self.context
    }
}

/// The regions of `haystack` and how much of it can be released now;
/// `haystack[..from]` is context, released already.
fn plan(
    redactor: &Redactor,
    haystack: &[u8],
    from: usize,
    units: Units,
    ending: Ending,
) -> (Vec<Region>, usize) {
    let (regions, wraps) = redactor.scan(haystack, units, ending);
    let mut release = haystack.len();
    if ending == Ending::More {
        release -= redactor.holdback(haystack);
        if let Some(start) = redactor.wrapped_holdback_start(haystack, &wraps) {
            release = release.min(start);
        }
        if let Some(undecided) = regions.iter().find(|region| region.undecided) {
            release = release.min(undecided.start);
        }
        // A break the text ends in is held with the line it may join.
        if let Some(at) = wraps.breaks.last().filter(|at| at.pending) {
            release = release.min(at.start);
        }
        // Never cut a region: hold all of it, so it is found again, whole,
        // with what follows.
        if let Some(cut) = regions
            .iter()
            .find(|region| region.start < release && release < region.end)
        {
            release = cut.start;
        }
        if units == Units::Chars {
            while release > 0
                && haystack
                    .get(release)
                    .is_some_and(|&byte| byte & 0xc0 == 0x80)
            {
                release -= 1;
            }
        }
    }
    // What was released cannot be held again (nothing above reaches back
    // into the context: what could was held when it was the end).
    (regions, release.max(from))
}

/// Where the context kept after releasing `haystack[..release]` starts: the
/// base64 characters just before `release`, at most `MIN_WRAP`, so that the
/// next scan sees whether a break at its start ends a wrapped line.
fn context_start(haystack: &[u8], release: usize) -> usize {
    release
        - haystack[..release]
            .iter()
            .rev()
            .take(MIN_WRAP)
            .take_while(|&&byte| is_base64_char(byte))
            .count()
}

fn step(
    redactor: &Redactor,
    (pending, context): (&mut Vec<u8>, &mut usize),
    chunk: &[u8],
    ending: Ending,
) -> Vec<u8> {
    let mut buffer = std::mem::take(pending);
    let buffered = !buffer.is_empty();
    if buffered {
        buffer.extend_from_slice(chunk);
    }
    let haystack: &[u8] = if buffered { &buffer } else { chunk };
    let from = *context;
    let (regions, release) = plan(redactor, haystack, from, Units::Bytes, ending);
    let mut out = Vec::with_capacity(release - from);
    redactor.write_redacted(haystack, &regions, (from, release), &mut out);
    let keep = match ending {
        Ending::More => context_start(haystack, release),
        Ending::Final => haystack.len(),
    };
    *context = release.max(keep) - keep;
    if buffered {
        buffer.drain(..keep);
        *pending = buffer;
    } else {
        *pending = chunk[keep..].to_vec();
    }
    out
}

fn step_text(
    redactor: &Redactor,
    (pending, context): (&mut String, &mut usize),
    chunk: &str,
    ending: Ending,
) -> String {
    let mut buffer = std::mem::take(pending);
    let buffered = !buffer.is_empty();
    if buffered {
        buffer.push_str(chunk);
    }
    let haystack: &str = if buffered { &buffer } else { chunk };
    let from = *context;
    let (regions, release) = plan(redactor, haystack.as_bytes(), from, Units::Chars, ending);
    let mut out = String::with_capacity(release - from);
    redactor.write_redacted_text(haystack, &regions, (from, release), &mut out);
    // The context is ASCII and `plan` releases on a character boundary, so
    // `keep` is one; `get` keeps this panic-free.
    let keep = match ending {
        Ending::More => context_start(haystack.as_bytes(), release),
        Ending::Final => haystack.len(),
    };
    *context = release.max(keep) - keep;
    *pending = haystack.get(keep..).unwrap_or_default().to_owned();
    out
}
