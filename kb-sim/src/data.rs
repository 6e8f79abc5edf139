//! The Phase 1 data plane: real bytes keyed by 51-bit PA (sparse pages,
//! unwritten bytes read as zero), partial and overlapping access, and
//! pending ranges: bytes a compute op will write but whose value only
//! Phase 2 knows. Reading a pending byte is refused, naming its writer.

use std::collections::{BTreeMap, HashMap};

use kb_format::Extent;

const PAGE_BITS: u32 = 16;
const PAGE: usize = 1 << PAGE_BITS;

/// A read that touched bytes whose last writer is still pending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bytes {pa:#x}..{end:#x} were last written by op {writer}, a compute op whose result exists only in Phase 2"
)]
pub struct PendingRead {
    pub pa: u64,
    pub end: u64,
    pub writer: u64,
}

#[derive(Debug, Default)]
pub struct DataPlane {
    pages: HashMap<u64, Box<[u8]>>,
    /// start -> (end, writer op id); disjoint intervals.
    pending: BTreeMap<u64, (u64, u64)>,
}

impl DataPlane {
    pub fn new() -> Self {
        Self::default()
    }

    /// Copy `out.len()` bytes starting at `pa` into `out`.
    pub fn read(&self, pa: u64, out: &mut [u8]) -> Result<(), PendingRead> {
        self.check_pending(pa, out.len() as u64)?;
        let mut done = 0usize;
        while done < out.len() {
            let at = pa + done as u64;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min(out.len() - done);
            match self.pages.get(&(at >> PAGE_BITS)) {
                Some(p) => out[done..done + n].copy_from_slice(&p[off..off + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Write `data` at `pa`; clears any pending mark on those bytes.
    pub fn write(&mut self, pa: u64, data: &[u8]) {
        self.clear_pending(pa, data.len() as u64);
        let mut done = 0usize;
        while done < data.len() {
            let at = pa + done as u64;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min(data.len() - done);
            let page = self
                .pages
                .entry(at >> PAGE_BITS)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            page[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Append the bytes of `x` (all its rows) to `out`.
    pub fn read_extent(&self, x: &Extent, out: &mut Vec<u8>) -> Result<(), PendingRead> {
        for r in 0..x.rows as u64 {
            let start = out.len();
            out.resize(start + x.len as usize, 0);
            self.read(x.pa + r * x.stride, &mut out[start..])?;
        }
        Ok(())
    }

    /// Write `data` into the rows of `x`; returns the bytes consumed.
    pub fn write_extent(&mut self, x: &Extent, data: &[u8]) -> usize {
        let mut used = 0;
        for r in 0..x.rows as u64 {
            let n = x.len as usize;
            self.write(x.pa + r * x.stride, &data[used..used + n]);
            used += n;
        }
        used
    }

    /// Mark `[pa, pa+len)` as written by compute op `writer` (value unknown
    /// until Phase 2).
    pub fn mark_pending(&mut self, pa: u64, len: u64, writer: u64) {
        self.clear_pending(pa, len);
        if len > 0 {
            self.pending.insert(pa, (pa + len, writer));
        }
    }

    fn check_pending(&self, pa: u64, len: u64) -> Result<(), PendingRead> {
        if self.pending.is_empty() || len == 0 {
            return Ok(());
        }
        let end = pa + len;
        // The interval starting at or before pa, then any starting inside.
        if let Some((&s, &(e, w))) = self.pending.range(..=pa).next_back()
            && e > pa
        {
            return Err(PendingRead {
                pa: s.max(pa),
                end: e.min(end),
                writer: w,
            });
        }
        if let Some((&s, &(e, w))) = self.pending.range(pa..end).next() {
            return Err(PendingRead {
                pa: s,
                end: e.min(end),
                writer: w,
            });
        }
        Ok(())
    }

    fn clear_pending(&mut self, pa: u64, len: u64) {
        if self.pending.is_empty() || len == 0 {
            return;
        }
        let end = pa + len;
        let mut keep = Vec::new();
        let overlapping: Vec<u64> = self
            .pending
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > pa)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapping {
            let (e, w) = self.pending.remove(&s).expect("listed");
            if s < pa {
                keep.push((s, (pa, w)));
            }
            if e > end {
                keep.push((end, (e, w)));
            }
        }
        self.pending.extend(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_overlapping_and_cross_page_access() {
        let mut d = DataPlane::new();
        let base = (PAGE as u64) - 3;
        d.write(base, &[1, 2, 3, 4, 5, 6]);
        d.write(base + 2, &[9, 9]);
        let mut out = [0u8; 8];
        d.read(base - 1, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 9, 9, 5, 6, 0]);
    }

    #[test]
    fn strided_extents_round_trip() {
        let mut d = DataPlane::new();
        let x = Extent {
            pa: 1000,
            len: 3,
            rows: 2,
            stride: 10,
        };
        assert_eq!(d.write_extent(&x, &[1, 2, 3, 4, 5, 6]), 6);
        let mut out = Vec::new();
        d.read_extent(&x, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
        let mut gap = [7u8; 1];
        d.read(1003, &mut gap).unwrap();
        assert_eq!(gap, [0]);
    }

    #[test]
    fn pending_bytes_refuse_reads_until_overwritten() {
        let mut d = DataPlane::new();
        d.mark_pending(100, 50, 42);
        let mut b = [0u8; 10];
        assert!(d.read(0, &mut b[..]).is_ok());
        let e = d.read(95, &mut b).unwrap_err();
        assert_eq!((e.pa, e.writer), (100, 42));
        assert_eq!(d.read(145, &mut b).unwrap_err().writer, 42);
        d.write(100, &[0; 20]);
        assert!(d.read(100, &mut b).is_ok());
        assert!(
            d.read(118, &mut b).is_err(),
            "bytes 120.. are still pending"
        );
        assert!(d.read(150, &mut b).is_ok());
    }
}
