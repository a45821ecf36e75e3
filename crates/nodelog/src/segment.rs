//! Segments and seals: the objects of a lane, their binary encoding, and the bounded, checked decoder.
//!
//! A lane slot (`{prefix}/logs/{node}/{session}/{lane}/{seq}.seg`, written
//! create-only and never replaced) holds either a **segment** — one group
//! commit of the lane: an index and, per Cell, the LTX bytes of its groups —
//! or a **seal**, written by a successor to end the lane (DESIGN.md §9).
//!
//! ```text
//! offset         size        field
//! 0              8           magic "CFLOGSG1" (format 1)
//! 8              1           kind: 1 segment, 2 seal
//! 9              3           reserved, zero
//! 12             4           index_len (u32, big-endian)
//! 16             index_len   index
//! 16+index_len   4           CRC-32C of bytes [0, 16+index_len)
//! 20+index_len   body_len    body: the entries' bytes, back to back
//! end-4          4           CRC-32C of the body
//! ```
//!
//! The index (big-endian): the lane (node id as u8 length + bytes, session
//! u128, lane u16), seq u64, written_ms u64; for a segment, body_len u64,
//! entry count u32 and the entries; for a seal, the sealer (node id,
//! session). An entry: Cell id (u8 length + bytes), epoch, first and last
//! TXID, body offset and length (u64 each), the bytes' CRC-32C (u32), the
//! LTX file checksum and post-apply checksum (u64 each), command count
//! (u32) and the 16-byte command ids. Entries tile the body in order.
//!
//! So one Cell's records are one ranged GET: the fixed part and the index
//! ([`index_range`], [`decode_index`]), then [`Entry::object_range`]
//! (checked by [`check_entry_bytes`]). Every length is bounded before it is
//! used; any byte changed or missing is an error, never a panic.

use std::ops::Range;

use cellfleet_authority::{CellId, Epoch, Holder, LaneId, NodeId, SessionId, Txid};

/// The first bytes of every slot object (format 1).
pub const MAGIC: &[u8; 8] = b"CFLOGSG1";
/// Bytes before the index.
pub const FIXED_BYTES: u64 = 16;
/// Largest index accepted (the decoder refuses more before reading it).
pub const INDEX_BYTES_MAX: u32 = 8 << 20;
/// Largest whole object accepted.
pub const SEGMENT_BYTES_MAX: u64 = 64 << 20;
/// Most entries in one segment.
pub const ENTRIES_MAX: u32 = 1 << 16;
/// Most command ids in one entry.
pub const COMMANDS_PER_ENTRY_MAX: u32 = 1 << 16;

const KIND_SEGMENT: u8 = 1;
const KIND_SEAL: u8 = 2;

/// Why bytes are not a valid slot object, or a segment cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The bytes do not follow the format.
    #[error("malformed log object: {0}")]
    Malformed(String),
    /// A checksum does not match: the object is damaged.
    #[error("log object checksum mismatch in the {0}")]
    Checksum(&'static str),
    /// Over a bound.
    #[error("log object {what} of {got} exceeds the bound of {max}")]
    TooLarge {
        /// Which quantity.
        what: &'static str,
        /// How much.
        got: u64,
        /// The bound.
        max: u64,
    },
}

type Result<T> = std::result::Result<T, Error>;

/// Where a slot is and when it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The lane.
    pub lane: LaneId,
    /// The slot's sequence number.
    pub seq: u64,
    /// Wall-clock time of writing (Unix ms).
    pub written_ms: u64,
}

/// One Cell's records in a segment: the LTX bytes of its groups there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The Cell.
    pub cell_id: CellId,
    /// The owner's epoch that wrote it.
    pub epoch: Epoch,
    /// First TXID the bytes carry.
    pub min_txid: Txid,
    /// Last TXID the bytes carry.
    pub max_txid: Txid,
    /// Where the bytes lie in the body.
    pub body_range: Range<u64>,
    /// CRC-32C of the bytes.
    pub bytes_crc: u32,
    /// The LTX file's own checksum (its trailer).
    pub file_checksum: u64,
    /// The database's rolling checksum after applying the bytes.
    pub post_apply_checksum: u64,
    /// The commands whose outcomes the bytes hold.
    pub command_ids: Vec<[u8; 16]>,
}

impl Entry {
    /// The entry's bytes as a range of the whole object (for a ranged GET),
    /// given the index length of its segment.
    pub fn object_range(&self, index_len: u32) -> Range<u64> {
        let body_start = FIXED_BYTES + u64::from(index_len) + 4;
        body_start + self.body_range.start..body_start + self.body_range.end
    }
}

/// A segment: one group commit of a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The slot.
    pub header: SegmentHeader,
    /// The index, in body order.
    pub entries: Vec<Entry>,
    /// The entries' bytes.
    pub body: Vec<u8>,
}

impl Segment {
    /// The bytes of `entry` (one of this segment's).
    pub fn bytes_of(&self, entry: &Entry) -> &[u8] {
        let range = usize::try_from(entry.body_range.start).unwrap_or(usize::MAX)
            ..usize::try_from(entry.body_range.end).unwrap_or(usize::MAX);
        self.body.get(range).unwrap_or_default()
    }
}

/// A seal: the end of a lane, written by a successor of its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seal {
    /// The slot it occupies.
    pub header: SegmentHeader,
    /// Who sealed it.
    pub sealed_by: Holder,
}

/// What a lane slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Records.
    Segment(Segment),
    /// The lane's end.
    Seal(Seal),
}

/// What one Cell contributes to a segment being built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part<'a> {
    /// The Cell.
    pub cell_id: CellId,
    /// The owner's epoch.
    pub epoch: Epoch,
    /// First TXID in `bytes`.
    pub min_txid: Txid,
    /// Last TXID in `bytes`.
    pub max_txid: Txid,
    /// The LTX file's own checksum.
    pub file_checksum: u64,
    /// The rolling checksum after applying `bytes`.
    pub post_apply_checksum: u64,
    /// The commands whose outcomes `bytes` hold.
    pub command_ids: Vec<[u8; 16]>,
    /// The LTX bytes.
    pub bytes: &'a [u8],
}

pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

pub(crate) fn put_node(out: &mut Vec<u8>, node: &NodeId) {
    let bytes = node.as_str().as_bytes();
    // Node ids are at most 64 bytes (NodeId's own rule).
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn put_header(out: &mut Vec<u8>, header: &SegmentHeader) {
    put_node(out, &header.lane.node);
    out.extend_from_slice(&header.lane.session.as_u128().to_be_bytes());
    out.extend_from_slice(&header.lane.lane.to_be_bytes());
    out.extend_from_slice(&header.seq.to_be_bytes());
    out.extend_from_slice(&header.written_ms.to_be_bytes());
}

fn frame(kind: u8, index: Vec<u8>, body: &[u8]) -> Result<Vec<u8>> {
    let index_len = u32::try_from(index.len())
        .ok()
        .filter(|len| *len <= INDEX_BYTES_MAX)
        .ok_or(Error::TooLarge {
            what: "index",
            got: index.len() as u64,
            max: u64::from(INDEX_BYTES_MAX),
        })?;
    let total = FIXED_BYTES + u64::from(index_len) + 4 + body.len() as u64 + 4;
    if total > SEGMENT_BYTES_MAX {
        return Err(Error::TooLarge {
            what: "object",
            got: total,
            max: SEGMENT_BYTES_MAX,
        });
    }
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&index_len.to_be_bytes());
    out.extend_from_slice(&index);
    let index_crc = crc(&out);
    out.extend_from_slice(&index_crc.to_be_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&crc(body).to_be_bytes());
    Ok(out)
}

/// Encodes a segment of `parts` (in this order) at slot `header`.
pub fn encode_segment(header: &SegmentHeader, parts: &[Part<'_>]) -> Result<Vec<u8>> {
    let count = u32::try_from(parts.len())
        .ok()
        .filter(|n| *n <= ENTRIES_MAX)
        .ok_or(Error::TooLarge {
            what: "entry count",
            got: parts.len() as u64,
            max: u64::from(ENTRIES_MAX),
        })?;
    let body_len: u64 = parts.iter().map(|p| p.bytes.len() as u64).sum();
    let mut index = Vec::new();
    put_header(&mut index, header);
    index.extend_from_slice(&body_len.to_be_bytes());
    index.extend_from_slice(&count.to_be_bytes());
    let mut body = Vec::with_capacity(usize::try_from(body_len).unwrap_or(0));
    for part in parts {
        if part.min_txid == Txid::ZERO || part.min_txid > part.max_txid {
            return Err(Error::Malformed(format!(
                "cell {} has TXIDs {}..={}",
                part.cell_id, part.min_txid.0, part.max_txid.0
            )));
        }
        let commands = u32::try_from(part.command_ids.len())
            .ok()
            .filter(|n| *n <= COMMANDS_PER_ENTRY_MAX)
            .ok_or(Error::TooLarge {
                what: "command count",
                got: part.command_ids.len() as u64,
                max: u64::from(COMMANDS_PER_ENTRY_MAX),
            })?;
        let cell = part.cell_id.as_str().as_bytes();
        let cell_len = u8::try_from(cell.len()).map_err(|_| Error::TooLarge {
            what: "cell id",
            got: cell.len() as u64,
            max: 255,
        })?;
        let start = body.len() as u64;
        body.extend_from_slice(part.bytes);
        index.push(cell_len);
        index.extend_from_slice(cell);
        for value in [
            part.epoch.get(),
            part.min_txid.0,
            part.max_txid.0,
            start,
            part.bytes.len() as u64,
        ] {
            index.extend_from_slice(&value.to_be_bytes());
        }
        index.extend_from_slice(&crc(part.bytes).to_be_bytes());
        index.extend_from_slice(&part.file_checksum.to_be_bytes());
        index.extend_from_slice(&part.post_apply_checksum.to_be_bytes());
        index.extend_from_slice(&commands.to_be_bytes());
        for id in &part.command_ids {
            index.extend_from_slice(id);
        }
    }
    frame(KIND_SEGMENT, index, &body)
}

/// Encodes a seal.
pub fn encode_seal(seal: &Seal) -> Vec<u8> {
    let mut index = Vec::new();
    put_header(&mut index, &seal.header);
    put_node(&mut index, &seal.sealed_by.node);
    index.extend_from_slice(&seal.sealed_by.session.as_u128().to_be_bytes());
    frame(KIND_SEAL, index, &[]).expect("a seal is far below every bound")
}

/// A bounds-checked reader over untrusted bytes.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| Error::Malformed("the index ends early".into()))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_be_bytes(self.array()?))
    }

    fn text(&mut self, what: &str) -> Result<&'a str> {
        let len = self.u8()?;
        std::str::from_utf8(self.take(usize::from(len))?)
            .map_err(|_| Error::Malformed(format!("the {what} is not UTF-8")))
    }

    pub(crate) fn node(&mut self) -> Result<NodeId> {
        let text = self.text("node id")?;
        NodeId::new(text).map_err(|e| Error::Malformed(e.to_string()))
    }

    fn header(&mut self) -> Result<SegmentHeader> {
        let node = self.node()?;
        let session = SessionId::from_u128(self.u128()?);
        let lane = self.u16()?;
        Ok(SegmentHeader {
            lane: LaneId {
                node,
                session,
                lane,
            },
            seq: self.u64()?,
            written_ms: self.u64()?,
        })
    }

    pub(crate) fn done(&self) -> Result<()> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(Error::Malformed(format!(
                "{} bytes after the index's last field",
                self.bytes.len() - self.at
            )))
        }
    }
}

/// The checked fixed part: the kind and the index length.
fn fixed(bytes: &[u8]) -> Result<(u8, u32)> {
    if bytes.len() < FIXED_BYTES as usize {
        return Err(Error::Malformed(format!(
            "{} bytes, fewer than the {FIXED_BYTES}-byte fixed part",
            bytes.len()
        )));
    }
    if &bytes[..8] != MAGIC {
        return Err(Error::Malformed(
            "not a Cellfleet log object (magic)".into(),
        ));
    }
    let kind = bytes[8];
    if kind != KIND_SEGMENT && kind != KIND_SEAL {
        return Err(Error::Malformed(format!("unknown object kind {kind}")));
    }
    if bytes[9..12] != [0, 0, 0] {
        return Err(Error::Malformed("reserved bytes are not zero".into()));
    }
    let index_len = u32::from_be_bytes(bytes[12..16].try_into().expect("four bytes"));
    if index_len > INDEX_BYTES_MAX {
        return Err(Error::TooLarge {
            what: "index",
            got: u64::from(index_len),
            max: u64::from(INDEX_BYTES_MAX),
        });
    }
    Ok((kind, index_len))
}

/// Whether a slot object is a seal, from its fixed part alone (at least
/// [`FIXED_BYTES`] bytes), which is checked.
pub fn is_seal(first: &[u8]) -> Result<bool> {
    Ok(fixed(first)?.0 == KIND_SEAL)
}

/// The byte range holding the fixed part, the index and its CRC, from the
/// fixed part alone (`first` holds at least [`FIXED_BYTES`] bytes): what a
/// ranged reader fetches before [`decode_index`].
pub fn index_range(first: &[u8]) -> Result<Range<u64>> {
    let (_, index_len) = fixed(first)?;
    Ok(0..FIXED_BYTES + u64::from(index_len) + 4)
}

/// The index of a slot object, without its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Index {
    /// A segment's header and entries (`body_len` bytes follow).
    Segment {
        /// The slot.
        header: SegmentHeader,
        /// The entries.
        entries: Vec<Entry>,
        /// The body's length.
        body_len: u64,
        /// The index's length (for [`Entry::object_range`]).
        index_len: u32,
    },
    /// A seal.
    Seal(Seal),
}

/// Decodes and checks the index from the object's first bytes (at least
/// [`index_range`]'s worth; more is ignored).
pub fn decode_index(prefix: &[u8]) -> Result<Index> {
    let (kind, index_len) = fixed(prefix)?;
    let index_end = FIXED_BYTES as usize + index_len as usize;
    let mut reader = Reader {
        bytes: checked_index(prefix, index_end)?,
        at: 0,
    };
    let header = reader.header()?;
    if kind == KIND_SEAL {
        return decode_seal_index(reader, header);
    }
    let (body_len, count) = segment_extent(&mut reader, index_end)?;
    let mut entries = Vec::new();
    let mut next_offset = 0u64;
    for _ in 0..count {
        let entry = decode_entry(&mut reader, next_offset, body_len)?;
        next_offset = entry.body_range.end;
        entries.push(entry);
    }
    if next_offset != body_len {
        return Err(Error::Malformed(format!(
            "the entries cover {next_offset} of the {body_len}-byte body"
        )));
    }
    reader.done()?;
    Ok(Index::Segment {
        header,
        entries,
        body_len,
        index_len,
    })
}

/// The index's bytes (after the fixed part, up to `index_end`), once the
/// prefix is long enough to hold them and their CRC and the CRC matches:
/// nothing in the index is read before it is known to be undamaged.
fn checked_index(prefix: &[u8], index_end: usize) -> Result<&[u8]> {
    if prefix.len() < index_end + 4 {
        return Err(Error::Malformed(format!(
            "{} bytes, fewer than the fixed part, index and its checksum ({})",
            prefix.len(),
            index_end + 4
        )));
    }
    let stored = u32::from_be_bytes(
        prefix[index_end..index_end + 4]
            .try_into()
            .expect("four bytes"),
    );
    if crc(&prefix[..index_end]) != stored {
        return Err(Error::Checksum("index"));
    }
    Ok(&prefix[FIXED_BYTES as usize..index_end])
}

/// The rest of a seal's index after its header: the sealer, and nothing
/// after it.
fn decode_seal_index(mut reader: Reader<'_>, header: SegmentHeader) -> Result<Index> {
    let node = reader.node()?;
    let session = SessionId::from_u128(reader.u128()?);
    reader.done()?;
    Ok(Index::Seal(Seal {
        header,
        sealed_by: Holder { node, session },
    }))
}

/// A segment's body length and entry count, each bounded before any entry
/// is read: at most [`ENTRIES_MAX`] entries, and the whole object (index
/// ending at `index_end`, body and both CRCs) within [`SEGMENT_BYTES_MAX`].
fn segment_extent(reader: &mut Reader<'_>, index_end: usize) -> Result<(u64, u32)> {
    let body_len = reader.u64()?;
    let count = reader.u32()?;
    if count > ENTRIES_MAX {
        return Err(Error::TooLarge {
            what: "entry count",
            got: u64::from(count),
            max: u64::from(ENTRIES_MAX),
        });
    }
    let fits = (index_end as u64 + 4)
        .checked_add(body_len)
        .and_then(|n| n.checked_add(4))
        .is_some_and(|n| n <= SEGMENT_BYTES_MAX);
    if !fits {
        return Err(Error::TooLarge {
            what: "body",
            got: body_len,
            max: SEGMENT_BYTES_MAX,
        });
    }
    Ok((body_len, count))
}

/// One entry of a segment's index, checked: a valid Cell id, a nonzero
/// epoch, a TXID range, bytes starting at `next_offset` (where the previous
/// entry ended, so entries tile the body) inside the `body_len`-byte body,
/// and at most [`COMMANDS_PER_ENTRY_MAX`] command ids.
fn decode_entry(reader: &mut Reader<'_>, next_offset: u64, body_len: u64) -> Result<Entry> {
    let cell_text = reader.text("cell id")?;
    let cell_id: CellId = cell_text
        .parse()
        .map_err(|_| Error::Malformed(format!("bad cell id {cell_text:?}")))?;
    let epoch = Epoch::new(reader.u64()?)
        .ok_or_else(|| Error::Malformed(format!("cell {cell_id} at epoch 0")))?;
    let (min_txid, max_txid) = (Txid(reader.u64()?), Txid(reader.u64()?));
    if min_txid == Txid::ZERO || min_txid > max_txid {
        return Err(Error::Malformed(format!(
            "cell {cell_id} has TXIDs {}..={}",
            min_txid.0, max_txid.0
        )));
    }
    let (offset, len) = (reader.u64()?, reader.u64()?);
    let end = offset
        .checked_add(len)
        .filter(|end| offset == next_offset && *end <= body_len)
        .ok_or_else(|| {
            Error::Malformed(format!(
                "cell {cell_id}'s bytes {offset}+{len} do not follow the previous entry at {next_offset} inside the {body_len}-byte body"
            ))
        })?;
    let bytes_crc = reader.u32()?;
    let file_checksum = reader.u64()?;
    let post_apply_checksum = reader.u64()?;
    let commands = reader.u32()?;
    if commands > COMMANDS_PER_ENTRY_MAX {
        return Err(Error::TooLarge {
            what: "command count",
            got: u64::from(commands),
            max: u64::from(COMMANDS_PER_ENTRY_MAX),
        });
    }
    // Each id is 16 bytes of the index: a count past what is left is
    // caught by `take` before anything is allocated for it.
    let ids = reader.take(commands as usize * 16)?;
    let command_ids = ids
        .chunks_exact(16)
        .map(|id| id.try_into().expect("16 bytes"))
        .collect();
    Ok(Entry {
        cell_id,
        epoch,
        min_txid,
        max_txid,
        body_range: offset..end,
        bytes_crc,
        file_checksum,
        post_apply_checksum,
        command_ids,
    })
}

/// Checks one entry's bytes, read by a ranged GET of [`Entry::object_range`].
pub fn check_entry_bytes(entry: &Entry, bytes: &[u8]) -> Result<()> {
    if bytes.len() as u64 != entry.body_range.end - entry.body_range.start {
        return Err(Error::Malformed(format!(
            "cell {}'s bytes: read {}, the index says {}",
            entry.cell_id,
            bytes.len(),
            entry.body_range.end - entry.body_range.start
        )));
    }
    if crc(bytes) != entry.bytes_crc {
        return Err(Error::Checksum("entry bytes"));
    }
    Ok(())
}

/// Decodes and checks a whole slot object.
pub fn decode(bytes: &[u8]) -> Result<Slot> {
    if bytes.len() as u64 > SEGMENT_BYTES_MAX {
        return Err(Error::TooLarge {
            what: "object",
            got: bytes.len() as u64,
            max: SEGMENT_BYTES_MAX,
        });
    }
    match decode_index(bytes)? {
        Index::Seal(seal) => {
            let (_, index_len) = fixed(bytes)?;
            let body_start = FIXED_BYTES as usize + index_len as usize + 4;
            if bytes.len() != body_start + 4 || bytes[body_start..] != crc(&[]).to_be_bytes() {
                return Err(Error::Malformed("a seal carries no body".into()));
            }
            Ok(Slot::Seal(seal))
        }
        Index::Segment {
            header,
            entries,
            body_len,
            index_len,
        } => {
            let body_start = FIXED_BYTES as usize + index_len as usize + 4;
            let expected = body_start as u64 + body_len + 4;
            if bytes.len() as u64 != expected {
                return Err(Error::Malformed(format!(
                    "{} bytes, the index says {expected}",
                    bytes.len()
                )));
            }
            let body_end = body_start + body_len as usize;
            let body = &bytes[body_start..body_end];
            let stored = u32::from_be_bytes(bytes[body_end..].try_into().expect("four bytes"));
            if crc(body) != stored {
                return Err(Error::Checksum("body"));
            }
            let segment = Segment {
                header,
                entries,
                body: body.to_vec(),
            };
            for entry in &segment.entries {
                check_entry_bytes(entry, segment.bytes_of(entry))?;
            }
            Ok(Slot::Segment(segment))
        }
    }
}

/// The first bytes of a lane's floor marker (format 1).
pub const FLOOR_MAGIC: &[u8; 8] = b"CFLOGFL1";
/// A floor marker's size: magic, the floor (u64), CRC-32C of both.
pub const FLOOR_BYTES: usize = 8 + 8 + 4;

/// A lane's floor marker (`{lane}/floor`): every slot below `floor` was
/// written and has been deleted by garbage collection, so a lane's run
/// starts here. Written before the first deletion below it, and only ever
/// raised.
pub fn encode_floor(floor: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(FLOOR_BYTES);
    out.extend_from_slice(FLOOR_MAGIC);
    out.extend_from_slice(&floor.to_be_bytes());
    let sum = crc(&out);
    out.extend_from_slice(&sum.to_be_bytes());
    out
}

/// Decodes a floor marker made by [`encode_floor`] (untrusted bytes).
pub fn decode_floor(bytes: &[u8]) -> Result<u64> {
    if bytes.len() != FLOOR_BYTES {
        return Err(Error::Malformed(format!(
            "a floor marker is {FLOOR_BYTES} bytes, this one {}",
            bytes.len()
        )));
    }
    if &bytes[..8] != FLOOR_MAGIC {
        return Err(Error::Malformed("not a floor marker (magic)".into()));
    }
    let stored = u32::from_be_bytes(bytes[16..].try_into().expect("four bytes"));
    if crc(&bytes[..16]) != stored {
        return Err(Error::Checksum("floor marker"));
    }
    Ok(u64::from_be_bytes(
        bytes[8..16].try_into().expect("eight bytes"),
    ))
}
