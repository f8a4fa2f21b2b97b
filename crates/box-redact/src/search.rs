//! Finding the regions to replace, writing the replacement, and the holdback
//! a stream keeps: the mechanics under `Redactor` and the streams.

use std::cmp::Reverse;

use crate::filter::Occurrence;
use crate::forms::is_base64_char;
use crate::{Redactor, has_bit};

/// What a region's edges must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Units {
    /// Any byte offset.
    Bytes,
    /// UTF-8 character boundaries: the haystack is text and so is the output.
    Chars,
}

/// Whether more input may follow the haystack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The haystack is all there is.
    Final,
    /// More may follow: a match whose widening needs bytes past the end is
    /// marked undecided.
    More,
}

/// A maximal run of the haystack to replace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// The secrets that extend the region, in order (indexes into names).
    pub(crate) names: Vec<u32>,
    /// A match in it may still widen over bytes not yet seen.
    pub(crate) undecided: bool,
}

struct Hit {
    start: usize,
    end: usize,
    name: u32,
    undecided: bool,
}

impl Redactor {
    /// The regions of `haystack` to replace, sorted and disjoint.
    pub(crate) fn regions(&self, haystack: &[u8], units: Units, ending: Ending) -> Vec<Region> {
        if self.patterns.is_empty() {
            return Vec::new();
        }
        let mut hits = Vec::new();
        for (id, found_start) in self.occurrences(haystack) {
            let pattern = self.patterns[id as usize];
            let mut start = found_start;
            let mut end = found_start + self.pattern_bytes[id as usize].len();
            let mut undecided = false;
            let (left, right) = pattern.kind.widening();
            for _ in 0..left {
                match start.checked_sub(1).map(|before| haystack[before]) {
                    Some(byte) if is_base64_char(byte) => start -= 1,
                    _ => break,
                }
            }
            let mut padded = false;
            for _ in 0..right {
                match haystack.get(end) {
                    Some(&b'=') => padded = true,
                    Some(&byte) if !padded && is_base64_char(byte) => {}
                    Some(_) => break,
                    None => {
                        undecided = ending == Ending::More;
                        break;
                    }
                }
                end += 1;
            }
            if units == Units::Chars {
                while start > 0 && !is_char_boundary(haystack, start) {
                    start -= 1;
                }
                while !is_char_boundary(haystack, end) {
                    end += 1;
                }
            }
            hits.push(Hit {
                start,
                end,
                name: pattern.name,
                undecided,
            });
        }
        hits.sort_unstable_by_key(|hit| (hit.start, Reverse(hit.end)));
        let mut regions: Vec<Region> = Vec::new();
        for hit in hits {
            match regions.last_mut() {
                Some(region) if hit.start < region.end => {
                    // A hit inside what is listed adds nothing; one that
                    // reaches further adds its name (once in a row).
                    if hit.end > region.end {
                        region.end = hit.end;
                        if region.names.last() != Some(&hit.name) {
                            region.names.push(hit.name);
                        }
                    }
                    region.undecided |= hit.undecided;
                }
                _ => regions.push(Region {
                    start: hit.start,
                    end: hit.end,
                    names: vec![hit.name],
                    undecided: hit.undecided,
                }),
            }
        }
        regions
    }

    /// Every occurrence of every form in `haystack`: through the prefilter,
    /// or the automaton when there is none or the text is dense in
    /// candidates. Both give the same set.
    pub(crate) fn occurrences(&self, haystack: &[u8]) -> Vec<Occurrence> {
        let mut occurrences = Vec::new();
        if let Some(filter) = &self.filter
            && filter
                .find(haystack, &self.pattern_bytes, &mut occurrences)
                .is_ok()
        {
            return occurrences;
        }
        self.occurrences_by_automaton(haystack)
    }

    /// Every occurrence of every form, by the automaton alone.
    pub(crate) fn occurrences_by_automaton(&self, haystack: &[u8]) -> Vec<Occurrence> {
        self.automaton
            .find_overlapping_iter(haystack)
            .map(|found| (found.pattern().as_u32(), found.start()))
            .collect()
    }

    /// Append `haystack[..upto]` to `out` with each region that ends by
    /// `upto` replaced by its markers (the caller never cuts a region).
    pub(crate) fn write_redacted(
        &self,
        haystack: &[u8],
        regions: &[Region],
        upto: usize,
        out: &mut Vec<u8>,
    ) {
        let mut position = 0;
        for region in regions.iter().take_while(|region| region.end <= upto) {
            out.extend_from_slice(&haystack[position..region.start]);
            for &name in &region.names {
                out.extend_from_slice(b"[REDACTED:");
                out.extend_from_slice(self.names[name as usize].as_bytes());
                out.push(b']');
            }
            position = region.end;
        }
        out.extend_from_slice(&haystack[position..upto]);
    }

    /// `write_redacted` for text: regions are on character boundaries (they
    /// were found with `Units::Chars`), so no UTF-8 check of the output is
    /// needed.
    pub(crate) fn write_redacted_text(
        &self,
        haystack: &str,
        regions: &[Region],
        upto: usize,
        out: &mut String,
    ) {
        let mut position = 0;
        for region in regions.iter().take_while(|region| region.end <= upto) {
            push_text(out, haystack, position, region.start);
            for &name in &region.names {
                out.push_str("[REDACTED:");
                out.push_str(&self.names[name as usize]);
                out.push(']');
            }
            position = region.end;
        }
        push_text(out, haystack, position, upto);
    }

    /// How many bytes at the end of `pending` a stream must keep: the longest
    /// suffix that is a proper prefix of some form (it may complete with the
    /// next chunk), plus the base64 characters just before it that a match
    /// may widen over (three at most). Zero when the text ends
    /// in neither, the usual case for text that ends a line.
    pub(crate) fn holdback(&self, pending: &[u8]) -> usize {
        let suffix = self.longest_form_prefix(pending);
        let before = pending[..pending.len() - suffix]
            .iter()
            .rev()
            .take(self.max_left_widening)
            .take_while(|&&byte| is_base64_char(byte))
            .count();
        suffix + before
    }

    /// The length of the longest suffix of `pending` that is a proper prefix
    /// of some form. Suffixes at least as long as the shortest form are found
    /// through the prefilter's sampling (a lookup every few dozen bytes of
    /// the longest form's length); shorter ones, a few dozen positions, one
    /// by one.
    pub(crate) fn longest_form_prefix(&self, pending: &[u8]) -> usize {
        let Some(filter) = &self.filter else {
            return 0;
        };
        let len = pending.len();
        let from = len.saturating_sub(self.max_pattern_len.saturating_sub(1));
        if let Some(last) = len.checked_sub(self.min_pattern_len)
            && from <= last
            && let Some(start) =
                filter.longest_prefix_start(pending, from, last, &self.pattern_bytes)
        {
            return len - start;
        }
        let short_from = from.max((len + 1).saturating_sub(self.min_pattern_len));
        for start in short_from..len {
            let suffix = &pending[start..];
            let possible = match suffix {
                [first] => has_bit(&self.first_bytes, usize::from(*first)),
                [first, second, ..] => has_bit(
                    &self.first_pairs,
                    usize::from(*first) * 256 + usize::from(*second),
                ),
                [] => false,
            };
            if possible && self.is_proper_prefix(suffix) {
                return suffix.len();
            }
        }
        0
    }

    /// Whether some form starts with `bytes` and is longer.
    fn is_proper_prefix(&self, bytes: &[u8]) -> bool {
        let index = self
            .sorted
            .partition_point(|&id| &*self.pattern_bytes[id as usize] < bytes);
        // Forms are distinct, so at most one equals `bytes`; every form that
        // starts with `bytes` sorts right after it.
        self.sorted[index..].iter().take(2).any(|&id| {
            let pattern = &self.pattern_bytes[id as usize];
            pattern.len() > bytes.len() && pattern.starts_with(bytes)
        })
    }
}

fn push_text(out: &mut String, haystack: &str, start: usize, end: usize) {
    match haystack.get(start..end) {
        Some(text) => out.push_str(text),
        // Not reached: every cut is on a character boundary.
        None => out.push_str(&String::from_utf8_lossy(&haystack.as_bytes()[start..end])),
    }
}

fn is_char_boundary(bytes: &[u8], index: usize) -> bool {
    // A UTF-8 continuation byte is 0b10xx_xxxx.
    bytes.get(index).is_none_or(|&byte| byte & 0xc0 != 0x80)
}
