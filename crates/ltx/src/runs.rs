//! A fast LZ4 block encoder for database pages: it finds runs of one byte
//! value (zeros above all) and nothing else.
//!
//! A SQLite page is mostly a header, a cell pointer array, free space
//! (zeros) and cell content. A full LZ4 search hashes every position of the
//! page, which made compression the largest single cost of capturing a
//! group (BENCHMARKS.md, twentieth measurement). This encoder writes a run
//! of at least [`MIN_RUN`] equal bytes (free space, but also padding and
//! fill in the content) as one literal byte followed by a match at offset 1
//! (the overlapping copy every LZ4 decoder performs), and everything else
//! as literals. The output is an ordinary LZ4 block: any
//! decoder reads it, Litestream's included. It obeys the block format's end
//! rules: the last sequence is literals only, the last
//! [`LAST_LITERALS`] bytes are literals, and no match starts within
//! [`MATCH_START_LIMIT`] bytes of the end.

/// Shortest run written as a match. Shorter runs stay literals: a match
/// costs a token, an offset and the literal byte it copies from, and a run
/// of 16 or more always holds one 8-aligned word of equal bytes, which is
/// what the scan looks for.
pub(crate) const MIN_RUN: usize = 16;
/// The block format's rule: the last 5 bytes of a block are literals.
const LAST_LITERALS: usize = 5;
/// The block format's rule: the last match starts at least 12 bytes before
/// the end of the block.
const MATCH_START_LIMIT: usize = 12;

/// The most bytes [`compress`] writes for `len` input bytes: all literals,
/// one token and the literal length's extra bytes.
pub(crate) fn max_output(len: usize) -> usize {
    len + len / 255 + 2
}

/// Compress `input` into `out` as one LZ4 block and return its length.
/// `out` must hold at least [`max_output`]`(input.len())` bytes.
pub(crate) fn compress(input: &[u8], out: &mut [u8]) -> usize {
    debug_assert!(out.len() >= max_output(input.len()));
    let n = input.len();
    let mut sink = Sink { out, at: 0 };
    // Start of the literals not written yet.
    let mut literals = 0usize;
    // Where the scan for the next word of equal bytes resumes (8-aligned).
    let mut word = 0usize;
    let last_start = n.saturating_sub(MATCH_START_LIMIT);
    let last_end = n.saturating_sub(LAST_LITERALS);
    while let Some(found) = uniform_word(&input[word..]) {
        word += found;
        let byte = input[word];
        // Eight equal bytes: widen them to the whole run around them.
        let mut start = word;
        while start > literals && input[start - 1] == byte {
            start -= 1;
        }
        let mut end = word + 8 + 8 * uniform_words(&input[word + 8..], byte);
        while end < n && input[end] == byte {
            end += 1;
        }
        // The run's first byte is a literal; the match copies it forward.
        let match_start = start + 1;
        let match_end = end.min(last_end);
        if end - start >= MIN_RUN && match_start <= last_start && match_end >= match_start + 4 {
            sink.sequence(&input[literals..match_start], match_end - match_start);
            literals = match_end;
        }
        word = end.next_multiple_of(8);
        if word >= n {
            break;
        }
    }
    sink.last_literals(&input[literals..]);
    sink.at
}

/// Where the first whole word (8 bytes, at a multiple of 8 into `bytes`)
/// of one byte value starts. A word is eight equal bytes exactly when
/// rotating it by a byte leaves it unchanged.
fn uniform_word(bytes: &[u8]) -> Option<usize> {
    let uniform = |c: &[u8]| {
        let w = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
        w == w.rotate_left(8)
    };
    // Two words a step: most of a page's words are not uniform.
    let pairs = bytes.chunks_exact(16);
    let tail = pairs.remainder();
    for (i, pair) in pairs.enumerate() {
        let (a, b) = pair.split_at(8);
        if uniform(a) | uniform(b) {
            return Some(i * 16 + if uniform(a) { 0 } else { 8 });
        }
    }
    (tail.len() >= 8 && uniform(&tail[..8])).then(|| bytes.len() - tail.len())
}

/// How many whole words at the start of `bytes` hold only `byte`.
fn uniform_words(bytes: &[u8], byte: u8) -> usize {
    let same = u64::from_ne_bytes([byte; 8]);
    bytes
        .chunks_exact(8)
        .take_while(|c| u64::from_ne_bytes((*c).try_into().expect("chunks of 8")) == same)
        .count()
}

struct Sink<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Sink<'_> {
    fn byte(&mut self, b: u8) {
        self.out[self.at] = b;
        self.at += 1;
    }

    /// The bytes of a length past the token's 15: 255s, then the rest.
    fn length_tail(&mut self, mut rest: usize) {
        while rest >= 255 {
            self.byte(255);
            rest -= 255;
        }
        self.byte(rest as u8);
    }

    fn literals(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// A sequence: `literals`, then a match of `len` (at least 4) bytes at
    /// offset 1.
    fn sequence(&mut self, literals: &[u8], len: usize) {
        let lit = literals.len();
        let extra = len - 4;
        self.byte(((lit.min(15) as u8) << 4) | extra.min(15) as u8);
        if lit >= 15 {
            self.length_tail(lit - 15);
        }
        self.literals(literals);
        self.byte(1);
        self.byte(0);
        if extra >= 15 {
            self.length_tail(extra - 15);
        }
    }

    fn last_literals(&mut self, literals: &[u8]) {
        let lit = literals.len();
        self.byte((lit.min(15) as u8) << 4);
        if lit >= 15 {
            self.length_tail(lit - 15);
        }
        self.literals(literals);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(input: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; max_output(input.len())];
        let size = compress(input, &mut out);
        let mut back = vec![0u8; input.len()];
        let n = lz4_flex::block::decompress_into(&out[..size], &mut back)
            .unwrap_or_else(|e| panic!("{e} for {} bytes", input.len()));
        assert_eq!(n, input.len());
        assert_eq!(back, input);
        out.truncate(size);
        out
    }

    /// A block's sequences read back: each one's literal length and, for
    /// all but the last, its match length (the offset must be 1).
    fn sequences(block: &[u8]) -> Vec<(usize, Option<usize>)> {
        let mut at = 0usize;
        let mut found = Vec::new();
        let length = |at: &mut usize, mut value: usize| {
            if value == 15 {
                loop {
                    let b = block[*at];
                    *at += 1;
                    value += usize::from(b);
                    if b != 255 {
                        break;
                    }
                }
            }
            value
        };
        loop {
            let token = block[at];
            at += 1;
            let lit = length(&mut at, usize::from(token >> 4));
            at += lit;
            if at == block.len() {
                found.push((lit, None));
                return found;
            }
            let offset = u16::from_le_bytes([block[at], block[at + 1]]);
            at += 2;
            assert_eq!(offset, 1);
            found.push((lit, Some(length(&mut at, usize::from(token & 15)) + 4)));
        }
    }

    /// The block format's end rules, read back from the encoded sequences:
    /// every match starts at least 12 bytes before the end and ends at
    /// least 5 bytes before it, and the block ends with a literals-only
    /// sequence.
    fn check_end_rules(block: &[u8], n: usize) {
        let mut produced = 0usize;
        for (lit, len) in sequences(block) {
            produced += lit;
            let Some(len) = len else {
                assert_eq!(produced, n);
                if n > 0 {
                    assert!(lit >= LAST_LITERALS.min(n), "{lit} last literals of {n}");
                }
                return;
            };
            assert!(
                produced + MATCH_START_LIMIT <= n,
                "match at {produced} of {n}"
            );
            produced += len;
            assert!(produced + LAST_LITERALS <= n, "match to {produced} of {n}");
        }
    }

    /// Bytes with no two neighbours equal, so no run of their own.
    fn distinct(len: usize, salt: u32) -> impl Iterator<Item = u8> {
        (0..len as u32).map(move |i| ((i + salt) * 7 % 251) as u8 | 1)
    }

    /// Pages shaped like SQLite's: bytes and runs (of zeros or of the byte)
    /// of any length.
    fn pages() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec((any::<u8>(), 0usize..40, any::<bool>()), 0..120).prop_map(|pieces| {
            let mut page = Vec::new();
            for (byte, len, zeros) in pieces {
                page.extend(std::iter::repeat_n(if zeros { 0 } else { byte }, len));
                page.push(byte);
            }
            page
        })
    }

    proptest! {
        #[test]
        fn any_page_decodes_to_itself_within_the_bound(page in pages()) {
            let block = roundtrip(&page);
            prop_assert!(block.len() <= max_output(page.len()));
            check_end_rules(&block, page.len());
        }

        #[test]
        fn any_bytes_decode_to_themselves(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let block = roundtrip(&bytes);
            check_end_rules(&block, bytes.len());
        }
    }

    #[test]
    fn the_readers_bound_admits_every_block() {
        for shift in 9..=16 {
            let page = 1usize << shift;
            assert!(max_output(page) <= crate::frame::max_block_size(page as u32) as usize);
        }
    }

    #[test]
    fn runs_shrink_and_edges_hold() {
        for n in 0..80 {
            check_end_rules(&roundtrip(&vec![0u8; n]), n);
        }
        let zeros = roundtrip(&[0u8; 4096]);
        assert!(zeros.len() < 32, "{} bytes for a zero page", zeros.len());
        let mut page = vec![0u8; 4096];
        page[..100].fill(7);
        page[3000..].fill(9);
        let block = roundtrip(&page);
        // Three runs (of 7s, zeros and 9s): a token, a literal, an offset
        // and a length's 255s each, and the last five bytes as literals.
        assert!(block.len() <= 40, "{} bytes", block.len());
        let mut page: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        page[1000..3000].fill(0);
        let block = roundtrip(&page);
        // 2,096 bytes of content stay literals; the 2,000 zeros take a few.
        assert!(block.len() <= 2096 + 24, "{} bytes", block.len());
        check_end_rules(&block, page.len());
    }

    /// The lengths where LZ4's length fields change form, exactly: a
    /// token's 4 bits hold up to 14, 15 starts a tail of 255s that a byte
    /// below 255 ends (so 15 + 255 = 270 is written 15, 255, 0), for
    /// literals and for matches alike. Random pages rarely land on them.
    #[test]
    fn length_fields_at_their_edges() {
        let edges = [
            1usize, 13, 14, 15, 16, 268, 269, 270, 271, 524, 525, 526, 780,
        ];
        for &lit in &edges {
            for &extra in &edges {
                let run = extra + 4 + 1; // the run's first byte is a literal
                let mut input: Vec<u8> = distinct(lit, 0).collect();
                input.extend(std::iter::repeat_n(0u8, run));
                input.extend(distinct(20, 3));
                let block = roundtrip(&input);
                check_end_rules(&block, input.len());
                let found = sequences(&block);
                if run >= MIN_RUN {
                    assert_eq!(
                        found,
                        vec![(lit + 1, Some(extra + 4)), (20, None)],
                        "{lit} literals, a run of {run}"
                    );
                } else {
                    assert_eq!(
                        found,
                        vec![(input.len(), None)],
                        "a run of {run} stays literal"
                    );
                }
            }
            // The last sequence's literal length at the same edges.
            let input: Vec<u8> = distinct(lit, 5).collect();
            assert_eq!(sequences(&roundtrip(&input)), vec![(lit, None)]);
        }
        // 15 + 255 exactly: the tail is one 255 and a closing 0.
        let input: Vec<u8> = distinct(270, 0).collect();
        let block = roundtrip(&input);
        assert_eq!(&block[..3], &[0xf0, 255, 0]);
        assert_eq!(block.len(), 3 + 270);
    }

    /// Runs near the end of a block: the match stops 5 bytes before the
    /// end, or is not written when fewer than 4 bytes would be left. (A
    /// run of at least 16 bytes always starts more than 12 bytes before
    /// the end, so there the start rule follows from the end rule.)
    #[test]
    fn runs_at_the_end_of_the_block() {
        for tail in 0..40 {
            for run in [MIN_RUN - 1, MIN_RUN, MIN_RUN + 1, 64, 300] {
                let mut input: Vec<u8> = distinct(9, 0).collect();
                input.extend(std::iter::repeat_n(0xaau8, run));
                input.extend(distinct(tail, 1));
                let block = roundtrip(&input);
                check_end_rules(&block, input.len());
                let matched: usize = sequences(&block).iter().filter_map(|s| s.1).sum();
                let n = input.len();
                // The longest match the rules allow for this run.
                let start = 9 + 1;
                let end = (9 + run).min(n - LAST_LITERALS);
                let allowed = run >= MIN_RUN && start + MATCH_START_LIMIT <= n && end >= start + 4;
                assert_eq!(
                    matched,
                    if allowed { end - start } else { 0 },
                    "run {run}, tail {tail}"
                );
            }
        }
    }

    proptest! {
        /// The two-words-a-step scan finds the first 8-aligned word of
        /// equal bytes that a word-by-word scan finds.
        #[test]
        fn the_scan_finds_the_first_uniform_word(
            words in proptest::collection::vec((any::<bool>(), any::<[u8; 8]>()), 0..30),
            tail in proptest::collection::vec(Just(0u8), 0..8),
        ) {
            // Words of eight equal bytes (sometimes) among arbitrary ones,
            // and a tail too short to be a word.
            let mut bytes: Vec<u8> = words
                .iter()
                .flat_map(|(uniform, w)| if *uniform { [w[0]; 8] } else { *w })
                .collect();
            bytes.extend(&tail);
            let naive = (0..bytes.len() / 8)
                .map(|i| i * 8)
                .find(|&at| bytes[at..at + 8].iter().all(|&b| b == bytes[at]));
            prop_assert_eq!(uniform_word(&bytes), naive);
        }
    }
}
