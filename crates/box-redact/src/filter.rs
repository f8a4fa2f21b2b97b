//! A sampled q-gram prefilter in front of the Aho-Corasick automaton, so
//! text without secrets costs a lookup every few dozen bytes instead of an
//! automaton step per byte.
//!
//! Every form is at least `min_len` bytes long, so any occurrence of a form
//! covers a text position that is a multiple of `stride = min_len - GRAM +
//! 1`, and the `GRAM` bytes there are the form's own at an offset below
//! `stride`. The filter indexes exactly those grams (each form's first
//! `stride` offsets), looks at the text only at multiples of `stride`, and
//! checks each candidate the index names by comparing the form's bytes. It
//! finds every occurrence exactly once (at the first sampled position inside
//! it), the same set the automaton's overlapping search finds. When the text
//! is dense in candidates (a hex dump against a secret full of zero bytes),
//! it gives up within a bounded amount of work and the caller runs the
//! automaton, whose time is linear whatever the input.

/// Bytes per gram: one unaligned `u32` load.
const GRAM: usize = 4;

/// An occurrence: the pattern id and its start.
pub(crate) type Occurrence = (u32, usize);

/// The text held more candidates than the filter is cheaper for.
#[derive(Debug)]
pub(crate) struct Dense;

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    gram: u32,
    pattern: u32,
    offset: u32,
}

/// The prefilter over a redactor's forms.
#[derive(Clone, Debug)]
pub(crate) struct Filter {
    stride: usize,
    /// Bloom filter of the indexed grams: two bits per gram, so a frequent
    /// gram of ordinary text (four spaces) is unlikely to collide with an
    /// indexed one and send every sample to the table.
    bits: Box<[u64]>,
    /// log2 of the number of bits.
    bits_log2: u32,
    /// The indexed grams, sorted by gram.
    entries: Vec<Entry>,
    /// Open addressing from a gram to its first entry (index + 1; 0 is an
    /// empty slot), at most half full: a hit costs a probe or two instead of
    /// a binary search over all entries.
    table: Box<[u32]>,
    /// Right shift that turns a gram's 64-bit product into a table slot.
    table_shift: u32,
}

impl Filter {
    /// The filter for `patterns`, or `None` when there are none or one is
    /// shorter than a gram (the redactor registers none that short).
    pub(crate) fn new(patterns: &[Box<[u8]>]) -> Option<Filter> {
        let min_len = patterns.iter().map(|pattern| pattern.len()).min()?;
        if min_len < GRAM {
            return None;
        }
        let stride = min_len - GRAM + 1;
        let mut entries = Vec::with_capacity(patterns.len() * stride);
        for (id, pattern) in patterns.iter().enumerate() {
            let id = u32::try_from(id).ok()?;
            for offset in 0..stride {
                entries.push(Entry {
                    gram: gram_at(pattern, offset)?,
                    pattern: id,
                    offset: u32::try_from(offset).ok()?,
                });
            }
        }
        entries.sort_unstable_by_key(|entry| entry.gram);
        // About 32 bits per entry, two set per gram, keeps false hits near
        // 0.4%; bounded so the bitmap stays in cache (128 KiB at most).
        let bit_count = (entries.len() * 32)
            .next_power_of_two()
            .clamp(1 << 12, 1 << 20);
        let bits_log2 = bit_count.trailing_zeros();
        let mut bits = vec![0u64; bit_count / 64].into_boxed_slice();
        for entry in &entries {
            let (first, second) = bit_indexes(entry.gram, bits_log2);
            bits[first / 64] |= 1 << (first % 64);
            bits[second / 64] |= 1 << (second % 64);
        }
        let distinct = entries
            .windows(2)
            .filter(|pair| pair[0].gram != pair[1].gram)
            .count()
            + 1;
        let slot_count = (distinct * 2).next_power_of_two().max(2);
        let table_shift = 64 - slot_count.trailing_zeros();
        let mut table = vec![0u32; slot_count].into_boxed_slice();
        for (index, entry) in entries.iter().enumerate() {
            if index > 0 && entries[index - 1].gram == entry.gram {
                continue;
            }
            let mut slot = hash(entry.gram, table_shift);
            while table[slot] != 0 {
                slot = (slot + 1) % slot_count;
            }
            table[slot] = u32::try_from(index + 1).ok()?;
        }
        Some(Filter {
            stride,
            bits,
            bits_log2,
            entries,
            table,
            table_shift,
        })
    }

    /// Heap bytes used.
    pub(crate) fn memory_usage(&self) -> usize {
        self.bits.len() * 8
            + self.entries.len() * std::mem::size_of::<Entry>()
            + self.table.len() * 4
    }

    /// Every occurrence of every pattern in `haystack`, in no particular
    /// order, or `Dense` when checking candidates would cost more than the
    /// automaton.
    pub(crate) fn find(
        &self,
        haystack: &[u8],
        patterns: &[Box<[u8]>],
        out: &mut Vec<Occurrence>,
    ) -> Result<(), Dense> {
        // Each candidate compared costs tens of automaton steps; past this
        // budget (a gram of the text that many forms share) the automaton is
        // cheaper. A sample whose gram is not indexed costs a lookup or two,
        // fewer than the automaton's steps over the same bytes, so it does
        // not count.
        let budget = haystack.len() / 64 + 64;
        let mut work = 0;
        let mut position = 0;
        while let Some(gram) = gram_at(haystack, position) {
            if self.may_hold(gram) {
                for entry in self.entries_for(gram) {
                    work += 1;
                    let offset = entry.offset as usize;
                    let pattern = &patterns[entry.pattern as usize];
                    if let Some(start) = position.checked_sub(offset)
                        && haystack[start..].starts_with(pattern)
                    {
                        out.push((entry.pattern, start));
                    }
                }
                if work > budget {
                    return Err(Dense);
                }
            }
            position += self.stride;
        }
        Ok(())
    }
}

impl Filter {
    /// The least start `t` in `from..=last` at which `haystack[t..]` is a
    /// proper prefix of some pattern, for suffixes at least `min_len` long
    /// (`last <= haystack.len() - min_len`): such a suffix holds the
    /// pattern's first `min_len` bytes, all of whose sampled grams are
    /// indexed, so the same sampling finds it.
    pub(crate) fn longest_prefix_start(
        &self,
        haystack: &[u8],
        from: usize,
        last: usize,
        patterns: &[Box<[u8]>],
    ) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut position = from;
        while position < last + self.stride
            && let Some(gram) = gram_at(haystack, position)
        {
            if self.may_hold(gram) {
                for entry in self.entries_for(gram) {
                    let Some(start) = position.checked_sub(entry.offset as usize) else {
                        continue;
                    };
                    let suffix = &haystack[start..];
                    let pattern = &patterns[entry.pattern as usize];
                    if (from..=last).contains(&start)
                        && best.is_none_or(|best| start < best)
                        && pattern.len() > suffix.len()
                        && pattern.starts_with(suffix)
                    {
                        best = Some(start);
                    }
                }
            }
            position += self.stride;
        }
        best
    }
}

impl Filter {
    /// Whether `gram` may be indexed (false: it certainly is not).
    pub(crate) fn may_hold(&self, gram: u32) -> bool {
        let (first, second) = bit_indexes(gram, self.bits_log2);
        self.bits[first / 64] & (1 << (first % 64)) != 0
            && self.bits[second / 64] & (1 << (second % 64)) != 0
    }

    /// The entries indexing `gram` (none when it is not indexed).
    pub(crate) fn entries_for(&self, gram: u32) -> impl Iterator<Item = &Entry> {
        let mut slot = hash(gram, self.table_shift);
        let first = loop {
            match self.table[slot] {
                0 => break self.entries.len(),
                index => {
                    let index = index as usize - 1;
                    if self.entries[index].gram == gram {
                        break index;
                    }
                }
            }
            slot = (slot + 1) % self.table.len();
        };
        self.entries[first..]
            .iter()
            .take_while(move |entry| entry.gram == gram)
    }
}

fn gram_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let gram: [u8; GRAM] = bytes.get(offset..offset + GRAM)?.try_into().ok()?;
    Some(u32::from_le_bytes(gram))
}

/// Fibonacci hashing: the high bits of the product mix all the gram's bits;
/// `shift` keeps the top `64 - shift`.
fn hash(gram: u32, shift: u32) -> usize {
    (product(gram) >> shift) as usize
}

fn product(gram: u32) -> u64 {
    u64::from(gram).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Two bit indexes below `1 << bits_log2` from disjoint ranges of the
/// product's high bits (`bits_log2` is at most 20, so both fit in 64).
fn bit_indexes(gram: u32, bits_log2: u32) -> (usize, usize) {
    let product = product(gram);
    let mask = (1u64 << bits_log2) - 1;
    (
        (product >> (64 - bits_log2)) as usize,
        ((product >> (64 - 2 * bits_log2)) & mask) as usize,
    )
}
