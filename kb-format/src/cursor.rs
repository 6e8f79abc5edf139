//! Reading LEB128 varints from untrusted bytes, fast: the one cursor
//! behind the records codec and the channels chunk.

/// Bytes of a varint at most.
pub(crate) const V: usize = 10;

const PAST_END: &str = "runs past the end of its chunk";

#[inline(always)]
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A cursor over a chunk payload (records, channels). Reads never fail: past the end
/// (or on a malformed varint) they return 0 and note the first failure,
/// which the decoder checks once per item (a record, an interval). That keeps error
/// branches out of the hot path; every loop count is bounded by the bytes
/// left, so reading zeros after a failure ends quickly.
#[derive(Debug)]
pub(crate) struct Cur<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) p: usize,
    /// First failure: (position, what went wrong).
    pub(crate) bad: Option<(usize, &'static str)>,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Cur<'a> {
        Cur { b, p: 0, bad: None }
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn fail(&mut self, what: &'static str) {
        if self.bad.is_none() {
            self.bad = Some((self.p, what));
        }
        self.p = self.b.len();
    }

    #[inline(always)]
    pub(crate) fn left(&self) -> usize {
        self.b.len() - self.p
    }

    #[inline(always)]
    pub(crate) fn byte(&mut self) -> u8 {
        match self.b.get(self.p) {
            Some(&x) => {
                self.p += 1;
                x
            }
            None => {
                self.fail(PAST_END);
                0
            }
        }
    }

    /// A LEB128 varint of at most 10 bytes. Values of one or two bytes
    /// (most deltas, ids, counts and lengths) take the inlined path.
    #[inline(always)]
    pub(crate) fn varint(&mut self) -> u64 {
        let p = self.p;
        if p + 1 < self.b.len() {
            let (b0, b1) = (self.b[p], self.b[p + 1]);
            if b0 < 0x80 {
                self.p += 1;
                return b0 as u64;
            }
            if b1 < 0x80 {
                self.p += 2;
                return (b0 & 0x7f) as u64 | (b1 as u64) << 7;
            }
        }
        self.varint_multi()
    }

    /// A varint of more than two bytes, or one near the end of the chunk.
    /// Up to 8 bytes with 8 bytes left: decoded from one little-endian
    /// word without a loop (addresses deltas are often 5 to 8 bytes).
    #[inline(never)]
    pub(crate) fn varint_multi(&mut self) -> u64 {
        if let Some(s) = self.b.get(self.p..self.p + 8) {
            let w = u64::from_le_bytes(s.try_into().expect("8 bytes"));
            // The last byte is the first whose high bit is clear.
            let stop = !w & 0x8080_8080_8080_8080;
            if stop != 0 {
                let bits = stop.trailing_zeros() + 1; // 8, 16, ... 64
                let x = w & (u64::MAX >> (64 - bits));
                // Gather the 7-bit groups: group i sits at bit 8i.
                let v = (x & 0x7f)
                    | ((x >> 1) & (0x7f << 7))
                    | ((x >> 2) & (0x7f << 14))
                    | ((x >> 3) & (0x7f << 21))
                    | ((x >> 4) & (0x7f << 28))
                    | ((x >> 5) & (0x7f << 35))
                    | ((x >> 6) & (0x7f << 42))
                    | ((x >> 7) & (0x7f << 49));
                self.p += bits as usize / 8;
                return v;
            }
        }
        self.varint_bytewise()
    }

    /// A varint decoded byte by byte: 9 or 10 bytes long, or near the end.
    #[inline(never)]
    pub(crate) fn varint_bytewise(&mut self) -> u64 {
        let mut v = 0u64;
        for i in 0..V {
            let Some(&b) = self.b.get(self.p + i) else {
                self.p += i;
                self.fail(PAST_END);
                return 0;
            };
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b < 0x80 {
                if i == V - 1 && b > 1 {
                    break;
                }
                self.p += i + 1;
                return v;
            }
        }
        self.p += V;
        self.fail("varint overflows 64 bits");
        0
    }

    #[inline(always)]
    pub(crate) fn varint_u32(&mut self) -> u32 {
        let v = self.varint();
        if v > u32::MAX as u64 {
            self.fail("value does not fit in 32 bits");
        }
        v as u32
    }

    #[inline(always)]
    pub(crate) fn signed(&mut self) -> u64 {
        unzigzag(self.varint()) as u64
    }

    #[inline(always)]
    pub(crate) fn fixed(&mut self) -> u64 {
        match self.b.get(self.p..self.p + 8) {
            Some(s) => {
                self.p += 8;
                u64::from_le_bytes(s.try_into().expect("8 bytes"))
            }
            None => {
                self.fail(PAST_END);
                0
            }
        }
    }

    /// A count of items that each take at least one byte: bounded by the
    /// bytes left (so a corrupt count never drives a large allocation) and
    /// by `limit`; 0 after a failure.
    #[inline(always)]
    pub(crate) fn count(&mut self, limit: usize) -> usize {
        let n = self.varint();
        if n > self.left() as u64 || n > limit as u64 {
            self.fail("count larger than the bytes left or the limit");
            return 0;
        }
        n as usize
    }
}
