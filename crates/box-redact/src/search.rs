//! Finding the regions to replace, writing the replacement, and the holdback
//! a stream keeps: the mechanics under `Redactor` and the streams.

use std::cmp::Reverse;

use crate::filter::Occurrence;
use crate::forms::is_base64_char;
use crate::wrap::{self, Chain, Wraps};
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
        self.scan(haystack, units, ending).0
    }

    /// The regions of `haystack` to replace, sorted and disjoint, and its
    /// wrapped lines (a stream decides how much to hold back from them).
    /// Forms are searched in the haystack, then in each chain of wrapped
    /// lines with the breaks taken out (`wrap`), so a form a line break cuts
    /// is found too; such a region covers the breaks inside it.
    pub(crate) fn scan(
        &self,
        haystack: &[u8],
        units: Units,
        ending: Ending,
    ) -> (Vec<Region>, Wraps) {
        if self.patterns.is_empty() {
            return (Vec::new(), Wraps::default());
        }
        let wraps = Wraps::find(haystack, ending == Ending::More);
        let mut hits: Vec<Hit> = self
            .occurrences(haystack)
            .into_iter()
            .map(|(id, found)| self.hit(haystack, id, found, ending))
            .collect();
        let (mut view, mut map) = (Vec::new(), Vec::new());
        for chain in &wraps.chains {
            self.search_chain(
                haystack,
                &wraps,
                chain,
                ending,
                (&mut view, &mut map),
                &mut hits,
            );
        }
        if units == Units::Chars {
            for hit in &mut hits {
                while hit.start > 0 && !is_char_boundary(haystack, hit.start) {
                    hit.start -= 1;
                }
                while !is_char_boundary(haystack, hit.end) {
                    hit.end += 1;
                }
            }
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
        (regions, wraps)
    }

    /// The hits of `chain` that its breaks cut (the others the search of
    /// the haystack finds): it is searched with its breaks taken out, in
    /// segments of about `SEGMENT` bytes (so the copy stays small and in
    /// cache however long the chain), each with enough of its neighbours
    /// around it that every form starting in it is seen whole and widened
    /// as in one piece.
    fn search_chain(
        &self,
        haystack: &[u8],
        wraps: &Wraps,
        chain: &Chain,
        ending: Ending,
        (view, map): (&mut Vec<u8>, &mut Vec<(usize, usize)>),
        hits: &mut Vec<Hit>,
    ) {
        const SEGMENT: usize = 32 * 1024;
        let count = wraps.piece_count(chain);
        let len = |index| wraps.piece(chain, index).len();
        let mut first = 0;
        while first < count {
            let mut last = first;
            let mut size = 0;
            while last < count && size < SEGMENT {
                size += len(last);
                last += 1;
            }
            let mut left = first;
            let mut before = 0;
            while left > 0 && before < self.max_left_widening {
                left -= 1;
                before += len(left);
            }
            let mut right = last;
            let mut after = 0;
            while right < count && after < self.max_pattern_len + self.max_right_widening {
                after += len(right);
                right += 1;
            }
            let chain_len = wraps.view(
                chain,
                left..right,
                (haystack, self.max_right_widening),
                view,
                map,
            );
            let segment = before..before + size;
            first = last;
            if chain_len < self.min_pattern_len {
                continue;
            }
            for (id, found) in self.occurrences(view) {
                // Only forms that start in this segment (the neighbours'
                // own searches find theirs), and only inside the chain: one
                // that reaches past it (a raw value ending in other
                // characters) is cut by the break, and the haystack's own
                // search finds it if it is whole.
                if !segment.contains(&found)
                    || found + self.pattern_bytes[id as usize].len() > chain_len
                {
                    continue;
                }
                let hit = self.hit(view, id, found, ending);
                let start = wrap::original(map, hit.start);
                let end = wrap::original(map, hit.end - 1) + 1;
                // Inside one line and decided: the search of the haystack
                // found the same.
                if end - start == hit.end - hit.start && !hit.undecided {
                    continue;
                }
                hits.push(Hit { start, end, ..hit });
            }
        }
    }

    /// The occurrence of pattern `id` at `found` in `haystack`, widened over
    /// the base64 characters at its edges that carry some of the value's
    /// bits and the padding after it.
    fn hit(&self, haystack: &[u8], id: u32, found: usize, ending: Ending) -> Hit {
        let pattern = self.patterns[id as usize];
        let mut start = found;
        let mut end = found + self.pattern_bytes[id as usize].len();
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
        Hit {
            start,
            end,
            name: pattern.name,
            undecided,
        }
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

    /// Append `haystack[from..upto]` to `out` with each region in it
    /// replaced by its markers (the caller never cuts a region).
    pub(crate) fn write_redacted(
        &self,
        haystack: &[u8],
        regions: &[Region],
        (from, upto): (usize, usize),
        out: &mut Vec<u8>,
    ) {
        let mut position = from;
        for region in regions
            .iter()
            .skip_while(|region| region.end <= from)
            .take_while(|region| region.end <= upto)
        {
            // `max`: a region begun in a stream's context (never found
            // there) is written from where this release starts.
            out.extend_from_slice(&haystack[position..region.start.max(position)]);
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
        (from, upto): (usize, usize),
        out: &mut String,
    ) {
        let mut position = from;
        for region in regions
            .iter()
            .skip_while(|region| region.end <= from)
            .take_while(|region| region.end <= upto)
        {
            push_text(out, haystack, position, region.start.max(position));
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

    /// Where a stream must start holding back because of the chain of
    /// wrapped lines `pending` ends in (its last run reaches the end, or a
    /// pending break follows it): the `holdback` of that chain with its
    /// breaks taken out, back in `pending`'s offsets. `None` when no chain
    /// ends there or nothing of it need be held.
    pub(crate) fn wrapped_holdback_start(&self, pending: &[u8], wraps: &Wraps) -> Option<usize> {
        let chain = wraps
            .chains
            .last()
            .filter(|chain| chain.pending || chain.end == pending.len())?;
        // Its last pieces, enough for the longest form and its widening:
        // they end where `pending` does.
        let count = wraps.piece_count(chain);
        let mut first = count;
        let mut size = 0;
        while first > 0 && size < self.max_pattern_len + self.max_left_widening {
            first -= 1;
            size += wraps.piece(chain, first).len();
        }
        let (mut view, mut map) = (Vec::new(), Vec::new());
        wraps.view(chain, first..count, (pending, 0), &mut view, &mut map);
        let held = self.holdback(&view);
        (held > 0).then(|| wrap::original(&map, view.len() - held))
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
