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
//! letters or digits may hold up to three. `finish` releases the rest at the
//! end of the stream. The concatenation of everything released equals
//! [`Redactor::redact_bytes`] of the concatenated input (or
//! [`Redactor::redact`] for text); a property test checks it.

use std::sync::Arc;

use crate::Redactor;
use crate::search::{Ending, Region, Units};

/// Streaming redaction over bytes. Output may not be UTF-8 at chunk
/// boundaries, so this works on bytes and may release part of a character
/// (exactly as a chunk ended in one, or where a held-back tail starts);
/// decode the concatenation, or use [`TextStreamRedactor`] when every chunk
/// is text.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Arc<Redactor>,
    pending: Vec<u8>,
}

impl StreamRedactor {
    /// An empty stream over `redactor`'s secrets.
    pub fn new(redactor: Arc<Redactor>) -> StreamRedactor {
        StreamRedactor {
            redactor,
            pending: Vec::new(),
        }
    }

    /// Take the next chunk; returns the redacted bytes that are now safe to
    /// pass on (possibly none, possibly some of earlier chunks).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        step(&self.redactor, &mut self.pending, chunk, Ending::More)
    }

    /// End of the stream: returns the rest, redacted. The stream is empty
    /// afterwards and may be used for a new one.
    pub fn finish(&mut self) -> Vec<u8> {
        step(&self.redactor, &mut self.pending, &[], Ending::Final)
    }

    /// How many bytes are held back, waiting for the next chunk.
    pub fn held_back(&self) -> usize {
        self.pending.len()
    }
}

/// Streaming redaction over text: every chunk is a `&str`, and every
/// release is a `String` that ends on a character boundary, so each can go
/// into a JSON string on its own.
#[derive(Debug)]
pub struct TextStreamRedactor {
    redactor: Arc<Redactor>,
    pending: String,
}

impl TextStreamRedactor {
    /// An empty stream over `redactor`'s secrets.
    pub fn new(redactor: Arc<Redactor>) -> TextStreamRedactor {
        TextStreamRedactor {
            redactor,
            pending: String::new(),
        }
    }

    /// Take the next chunk; returns the redacted text that is now safe to
    /// pass on (possibly empty, possibly some of earlier chunks).
    pub fn push(&mut self, chunk: &str) -> String {
        step_text(&self.redactor, &mut self.pending, chunk, Ending::More)
    }

    /// End of the stream: returns the rest, redacted. The stream is empty
    /// afterwards and may be used for a new one.
    pub fn finish(&mut self) -> String {
        step_text(&self.redactor, &mut self.pending, "", Ending::Final)
    }

    /// How many bytes are held back, waiting for the next chunk.
    pub fn held_back(&self) -> usize {
        self.pending.len()
    }
}

/// The regions of `haystack` and how much of it can be released now.
fn plan(
    redactor: &Redactor,
    haystack: &[u8],
    units: Units,
    ending: Ending,
) -> (Vec<Region>, usize) {
    let regions = redactor.regions(haystack, units, ending);
    let mut release = haystack.len();
    if ending == Ending::More {
        release -= redactor.holdback(haystack);
        if let Some(undecided) = regions.iter().find(|region| region.undecided) {
            release = release.min(undecided.start);
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
    (regions, release)
}

fn step(redactor: &Redactor, pending: &mut Vec<u8>, chunk: &[u8], ending: Ending) -> Vec<u8> {
    let mut buffer = std::mem::take(pending);
    let buffered = !buffer.is_empty();
    if buffered {
        buffer.extend_from_slice(chunk);
    }
    let haystack: &[u8] = if buffered { &buffer } else { chunk };
    let (regions, release) = plan(redactor, haystack, Units::Bytes, ending);
    let mut out = Vec::with_capacity(release);
    redactor.write_redacted(haystack, &regions, release, &mut out);
    if buffered {
        buffer.drain(..release);
        *pending = buffer;
    } else {
        *pending = chunk[release..].to_vec();
    }
    out
}

fn step_text(redactor: &Redactor, pending: &mut String, chunk: &str, ending: Ending) -> String {
    let mut buffer = std::mem::take(pending);
    let buffered = !buffer.is_empty();
    if buffered {
        buffer.push_str(chunk);
    }
    let haystack: &str = if buffered { &buffer } else { chunk };
    let (regions, release) = plan(redactor, haystack.as_bytes(), Units::Chars, ending);
    let mut out = String::with_capacity(release);
    redactor.write_redacted_text(haystack, &regions, release, &mut out);
    // `plan` releases on a character boundary; `get` keeps this panic-free.
    *pending = haystack.get(release..).unwrap_or_default().to_owned();
    out
}
