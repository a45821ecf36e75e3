//! Chunk indexes: one object naming every record of [`CHUNK_SLOTS`] consecutive segments of a lane, so a successor reads a lane's index in a few GETs instead of two per segment.
//!
//! A lane's slots are grouped in aligned chunks of [`CHUNK_SLOTS`] (the
//! first slot a multiple of it). Once every slot of a chunk holds one of its own
//! segments and all are acknowledged, the lane's writer puts the chunk's
//! index at `{lane}/{first:016x}.idx` (create-only). It is derived data:
//! the segments stay the truth, a missing or damaged chunk index only means
//! the reader falls back to each segment's own index, and garbage
//! collection deletes it with the last segment it covers.
//!
//! Why it is safe to trust: a chunk index is written only over slots the
//! session itself wrote and saw acknowledged (contiguous from the lane's
//! floor), so no seal can lie inside its range above the floor, and every
//! slot in it counts until a seal past it.
//!
//! ```text
//! offset   size         field
//! 0        8            magic "CFLOGIX1" (format 1)
//! 8        ...          the lane: node id (u8 length + bytes), session u128, lane u16
//! ...      8            first slot (u64, a multiple of CHUNK_SLOTS)
//! ...      4            slot count (u32, at most CHUNK_SLOTS)
//! ...      per slot     u32 length, then the segment's first bytes: fixed
//!                       part, index and index CRC, exactly as in the segment
//! end-4    4            CRC-32C of every byte before it
//! ```
//!
//! The decoder ([`decode_chunk`]) checks every bound before it allocates,
//! the CRC, the lane and slot of every segment index inside (each checked
//! again by [`crate::segment::decode_index`], its own CRC included).

use cellfleet_authority::{LaneId, SessionId};

use crate::segment::{self, crc, put_node, Entry, Error, Index, Reader};

/// Slots per chunk.
pub const CHUNK_SLOTS: u64 = 256;
/// The first bytes of a chunk index (format 1).
pub const CHUNK_MAGIC: &[u8; 8] = b"CFLOGIX1";
/// Largest chunk index accepted.
pub const CHUNK_BYTES_MAX: u64 = 256 << 20;

type Result<T> = std::result::Result<T, Error>;

/// The first slot of the chunk holding `seq`.
pub fn chunk_of(seq: u64) -> u64 {
    seq - seq % CHUNK_SLOTS
}

/// One segment's index as a chunk index holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSlot {
    /// The slot.
    pub seq: u64,
    /// Its entries, in body order.
    pub entries: Vec<Entry>,
    /// Its index length (for [`Entry::object_range`]).
    pub index_len: u32,
}

/// Encodes the chunk index of `lane` starting at slot `first` from the
/// first bytes of each of its segments (`prefixes[i]` is slot `first + i`:
/// at least [`segment::index_range`]'s worth; the rest is dropped).
pub fn encode_chunk(lane: &LaneId, first: u64, prefixes: &[&[u8]]) -> Result<Vec<u8>> {
    if !first.is_multiple_of(CHUNK_SLOTS) || prefixes.len() as u64 > CHUNK_SLOTS {
        return Err(Error::Malformed(format!(
            "a chunk starts at a multiple of {CHUNK_SLOTS} and holds at most that many slots \
             (first {first}, {} slots)",
            prefixes.len()
        )));
    }
    let mut out = Vec::new();
    out.extend_from_slice(CHUNK_MAGIC);
    put_node(&mut out, &lane.node);
    out.extend_from_slice(&lane.session.as_u128().to_be_bytes());
    out.extend_from_slice(&lane.lane.to_be_bytes());
    out.extend_from_slice(&first.to_be_bytes());
    out.extend_from_slice(&(prefixes.len() as u32).to_be_bytes());
    for prefix in prefixes {
        let range = segment::index_range(prefix)?;
        let end = usize::try_from(range.end).unwrap_or(usize::MAX);
        let index = prefix.get(..end).ok_or_else(|| {
            Error::Malformed(format!(
                "a segment prefix of {} bytes, its index needs {end}",
                prefix.len()
            ))
        })?;
        out.extend_from_slice(&(index.len() as u32).to_be_bytes());
        out.extend_from_slice(index);
    }
    if out.len() as u64 + 4 > CHUNK_BYTES_MAX {
        return Err(Error::TooLarge {
            what: "chunk index",
            got: out.len() as u64 + 4,
            max: CHUNK_BYTES_MAX,
        });
    }
    let sum = crc(&out);
    out.extend_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// Decodes and checks the chunk index of `lane` starting at `first`
/// (untrusted bytes): every slot's entries, in slot order.
pub fn decode_chunk(bytes: &[u8], lane: &LaneId, first: u64) -> Result<Vec<ChunkSlot>> {
    let body = checked_chunk_body(bytes)?;
    let mut reader = Reader { bytes: body, at: 0 };
    let count = chunk_slot_count(&mut reader, lane, first)?;
    let mut slots = Vec::new();
    for seq in first..first + count {
        slots.push(decode_chunk_slot(&mut reader, lane, seq)?);
    }
    if reader.at != body.len() {
        return Err(Error::Malformed(format!(
            "{} bytes after a chunk index's last slot",
            body.len() - reader.at
        )));
    }
    Ok(slots)
}

/// The chunk index's bytes before its CRC, once the whole is within
/// [`CHUNK_BYTES_MAX`], long enough for a magic and a CRC, and the CRC
/// matches: nothing inside is read before it is known to be undamaged.
fn checked_chunk_body(bytes: &[u8]) -> Result<&[u8]> {
    if bytes.len() as u64 > CHUNK_BYTES_MAX {
        return Err(Error::TooLarge {
            what: "chunk index",
            got: bytes.len() as u64,
            max: CHUNK_BYTES_MAX,
        });
    }
    if bytes.len() < CHUNK_MAGIC.len() + 4 {
        return Err(Error::Malformed(format!(
            "{} bytes, too few for a chunk index",
            bytes.len()
        )));
    }
    let (body, stored) = bytes.split_at(bytes.len() - 4);
    if crc(body) != u32::from_be_bytes(stored.try_into().expect("four bytes")) {
        return Err(Error::Checksum("chunk index"));
    }
    Ok(body)
}

/// Reads the chunk index's head (magic, lane, first slot) and its slot
/// count: the head must name the `lane` and `first` slot it was read as
/// (a chunk index copied or misnamed is refused), and the count is at most
/// [`CHUNK_SLOTS`].
fn chunk_slot_count(reader: &mut Reader<'_>, lane: &LaneId, first: u64) -> Result<u64> {
    if reader.take(CHUNK_MAGIC.len())? != CHUNK_MAGIC {
        return Err(Error::Malformed("not a chunk index (magic)".into()));
    }
    let found = LaneId {
        node: reader.node()?,
        session: SessionId::from_u128(reader.u128()?),
        lane: reader.u16()?,
    };
    let found_first = reader.u64()?;
    if found != *lane || found_first != first {
        return Err(Error::Malformed(format!(
            "a chunk index of lane {found:?} from slot {found_first}, read as lane {lane:?} from slot {first}"
        )));
    }
    let count = u64::from(reader.u32()?);
    if count > CHUNK_SLOTS {
        return Err(Error::TooLarge {
            what: "chunk slot count",
            got: count,
            max: CHUNK_SLOTS,
        });
    }
    Ok(count)
}

/// Reads slot `seq`'s segment index from the chunk index: its length is
/// bounded before it is taken, and the bytes must be exactly one segment's
/// index (checked by [`segment::decode_index`], its own CRC included) of
/// this `lane` at this `seq`, not a seal.
fn decode_chunk_slot(reader: &mut Reader<'_>, lane: &LaneId, seq: u64) -> Result<ChunkSlot> {
    let len = reader.u32()?;
    if u64::from(len) > u64::from(segment::INDEX_BYTES_MAX) + segment::FIXED_BYTES + 4 {
        return Err(Error::TooLarge {
            what: "segment index in a chunk",
            got: u64::from(len),
            max: u64::from(segment::INDEX_BYTES_MAX),
        });
    }
    let prefix = reader.take(len as usize)?;
    let exact = segment::index_range(prefix)?.end == u64::from(len);
    match segment::decode_index(prefix)? {
        Index::Segment {
            header,
            entries,
            index_len,
            ..
        } if exact && header.lane == *lane && header.seq == seq => Ok(ChunkSlot {
            seq,
            entries,
            index_len,
        }),
        Index::Segment { header, .. } if exact => Err(Error::Malformed(format!(
            "slot {seq} of a chunk index holds the index of lane {:?} slot {}",
            header.lane, header.seq
        ))),
        Index::Segment { .. } => Err(Error::Malformed(format!(
            "slot {seq} of a chunk index carries bytes past its segment index"
        ))),
        Index::Seal(_) => Err(Error::Malformed(format!(
            "slot {seq} of a chunk index is a seal"
        ))),
    }
}
