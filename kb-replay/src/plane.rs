//! The data plane: byte-addressable memory keyed by the 51-bit PA of
//! [`kb_format::pa`], stored as a sparse map of 64 KiB pages.
//!
//! Device memory that nothing wrote reads as zero. Host space
//! (`pa::host(tensor, offset)`) holds the trace's tensor data: it is kept in
//! its own sparse page map ([`DataPlane::load_host`]) that replay never
//! changes, so the reference evaluation can read the inputs as the trace
//! gave them even if an op writes to host space (a device-to-host copy);
//! such writes go to the ordinary page map, which shadows the input pages.
//!
//! Host data is paged rather than held as one `Vec` of `TensorMeta::nbytes`
//! per tensor so that memory grows with the bytes the trace actually holds,
//! never with sizes it merely claims.
//!
//! The plane knows nothing of ops: it reads and writes byte ranges
//! ([`DataPlane::gather`] / [`DataPlane::scatter`] over [`Extent`]s).

use std::collections::HashMap;

use kb_format::pa::{self, MAX_HOST_TENSORS, PA_BITS, Pa};
use kb_format::{Extent, Space, TensorMeta};

/// log2 of the page size.
pub const PAGE_BITS: u32 = 16;
/// Bytes per page.
pub const PAGE: usize = 1 << PAGE_BITS;
const PAGE_MASK: u64 = PAGE as u64 - 1;

/// Bytes one op (or one gathered tensor) may hold unless configured
/// otherwise: a corrupt extent must not drive a huge allocation.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;

/// Why a data-plane access failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaneError {
    #[error("address {addr:#x} is not a valid 51-bit address")]
    BadAddress { addr: u64 },
    #[error("{len} bytes at {addr:#x} run past the end of their memory space")]
    CrossesSpace { addr: u64, len: u64 },
    #[error("host address {addr:#x} names tensor {tensor}, but the trace has {count} tensors")]
    UnknownTensor {
        addr: u64,
        tensor: u32,
        count: usize,
    },
    #[error("host bytes {offset}..{end} of tensor {name:?} are outside its {nbytes} bytes")]
    HostOutOfRange {
        name: String,
        offset: u64,
        end: u64,
        nbytes: u64,
    },
    #[error("tensor {name:?} has a shape whose byte size overflows 64 bits")]
    BadTensorSize { name: String },
    #[error(
        "extent at {pa:#x} ({rows} rows of {len} bytes, stride {stride}) overflows the address space"
    )]
    ExtentOverflow {
        pa: u64,
        len: u64,
        rows: u32,
        stride: u64,
    },
    #[error("{data} bytes of data for ranges of {ranges} bytes")]
    LengthMismatch { data: u64, ranges: u64 },
    #[error("{what} of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        bytes: u64,
        limit: u64,
    },
}

#[derive(Debug, Clone)]
struct HostTensor {
    name: String,
    /// `None` when the shape's byte size overflows.
    nbytes: Option<u64>,
    /// Bytes loaded from tensor chunks (overlaps counted twice).
    loaded: u64,
}

/// Sparse byte-addressable memory over every space of the 51-bit PA.
#[derive(Debug, Clone)]
pub struct DataPlane {
    pages: HashMap<u64, Box<[u8]>>,
    host_input: HashMap<u64, Box<[u8]>>,
    host: Vec<HostTensor>,
    max_bytes: u64,
}

/// Byte size of a tensor, `None` on overflow.
pub fn tensor_nbytes(t: &TensorMeta) -> Option<u64> {
    t.shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))?
        .checked_mul(t.dtype.size() as u64)
}

impl DataPlane {
    /// An empty plane for a trace with these tensors.
    pub fn new(tensors: &[TensorMeta], max_bytes: u64) -> DataPlane {
        DataPlane {
            pages: HashMap::new(),
            host_input: HashMap::new(),
            host: tensors
                .iter()
                .map(|t| HostTensor {
                    name: t.name.clone(),
                    nbytes: tensor_nbytes(t),
                    loaded: 0,
                })
                .collect(),
            max_bytes,
        }
    }

    /// The per-op byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Device pages written so far (for statistics).
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Store host-provided bytes of `tensor` at byte `offset` (a tensor chunk).
    pub fn load_host(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, data.len() as u64)?;
        self.host[tensor as usize].loaded += data.len() as u64;
        write_pages(&mut self.host_input, None, addr, data);
        Ok(())
    }

    /// Bytes of host data the trace provided for `tensor`, and its size.
    pub fn host_coverage(&self, tensor: u32) -> Option<(u64, Option<u64>)> {
        self.host.get(tensor as usize).map(|h| (h.loaded, h.nbytes))
    }

    /// Read `out.len()` bytes of `tensor`'s host data as the trace gave it
    /// (ignoring writes replay made to host space).
    pub fn read_host_input(
        &self,
        tensor: u32,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, out.len() as u64)?;
        read_pages(&self.host_input, None, addr, out);
        Ok(())
    }

    /// Validate a host range and return its start address.
    fn host_range(&self, tensor: u32, offset: u64, len: u64) -> Result<u64, PlaneError> {
        let h = self
            .host
            .get(tensor as usize)
            .filter(|_| tensor < MAX_HOST_TENSORS)
            .ok_or(PlaneError::UnknownTensor {
                addr: offset,
                tensor,
                count: self.host.len(),
            })?;
        let nbytes = h.nbytes.ok_or_else(|| PlaneError::BadTensorSize {
            name: h.name.clone(),
        })?;
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= nbytes && end < 1 << 36 => Ok(pa::host(tensor, offset)),
            _ => Err(PlaneError::HostOutOfRange {
                name: h.name.clone(),
                offset,
                end: end.unwrap_or(u64::MAX),
                nbytes,
            }),
        }
    }

    /// Check that `len` bytes at `addr` lie in one space (and, for host
    /// space, in one tensor's bytes).
    fn check(&self, addr: u64, len: u64) -> Result<Space, PlaneError> {
        let space = pa::space_of(addr).ok_or(PlaneError::BadAddress { addr })?;
        if len == 0 {
            return Ok(space);
        }
        addr.checked_add(len - 1)
            .filter(|&last| last >> PA_BITS == 0 && last >> 48 == addr >> 48)
            .ok_or(PlaneError::CrossesSpace { addr, len })?;
        if space == Space::Host {
            let (tensor, offset) = pa::split_host(addr).ok_or(PlaneError::BadAddress { addr })?;
            self.host_range(tensor, offset, len).map_err(|e| match e {
                PlaneError::UnknownTensor { tensor, count, .. } => PlaneError::UnknownTensor {
                    addr,
                    tensor,
                    count,
                },
                e => e,
            })?;
        }
        Ok(space)
    }

    /// Read `out.len()` bytes at `addr`. Unwritten device bytes read as zero;
    /// host bytes read as the trace's tensor data unless an op overwrote them.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), PlaneError> {
        let space = self.check(addr, out.len() as u64)?;
        let fallback = (space == Space::Host).then_some(&self.host_input);
        read_pages(&self.pages, fallback, addr, out);
        Ok(())
    }

    /// Write `data` at `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PlaneError> {
        let space = self.check(addr, data.len() as u64)?;
        let fallback = (space == Space::Host).then_some(&self.host_input);
        write_pages(&mut self.pages, fallback, addr, data);
        Ok(())
    }

    /// Total bytes of `extents`, checked against the limit.
    pub fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        let mut total = 0u64;
        for e in extents {
            total = total.saturating_add(e.bytes());
        }
        if total > self.max_bytes {
            return Err(PlaneError::TooLarge {
                what: "the ranges of one op",
                bytes: total,
                limit: self.max_bytes,
            });
        }
        Ok(total)
    }

    /// Append the bytes of `extents`, in order, to `out`.
    pub fn gather(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        let total = self.extent_bytes(extents)?;
        out.reserve(total as usize);
        for e in extents {
            for (addr, len) in runs(e)? {
                let at = out.len();
                out.resize(at + len as usize, 0);
                self.read(addr, &mut out[at..])?;
            }
        }
        Ok(())
    }

    /// Write `data` to `extents` in order; `data` must hold exactly their bytes.
    pub fn scatter(&mut self, extents: &[Extent], data: &[u8]) -> Result<(), PlaneError> {
        let total = self.extent_bytes(extents)?;
        if total != data.len() as u64 {
            return Err(PlaneError::LengthMismatch {
                data: data.len() as u64,
                ranges: total,
            });
        }
        let mut pos = 0usize;
        for e in extents {
            for (addr, len) in runs(e)? {
                let len = len as usize;
                self.write(addr, &data[pos..pos + len])?;
                pos += len;
            }
        }
        Ok(())
    }
}

/// The runs of an extent as (address, length), validated not to overflow.
pub fn runs(e: &Extent) -> Result<impl Iterator<Item = (u64, u64)> + use<>, PlaneError> {
    let overflow = PlaneError::ExtentOverflow {
        pa: e.pa,
        len: e.len,
        rows: e.rows,
        stride: e.stride,
    };
    let (rows, stride) = if e.rows <= 1 {
        (e.rows as u64, 0)
    } else {
        (e.rows as u64, e.stride)
    };
    if rows > 0 {
        let last = (rows - 1)
            .checked_mul(stride)
            .and_then(|o| o.checked_add(e.pa))
            .and_then(|a| a.checked_add(e.len))
            .ok_or(overflow.clone())?;
        if last > 1 << PA_BITS {
            return Err(overflow);
        }
    }
    let (pa, len) = (e.pa, e.len);
    Ok((0..rows).map(move |r| (pa + r * stride, len)))
}

fn read_pages(
    pages: &HashMap<u64, Box<[u8]>>,
    fallback: Option<&HashMap<u64, Box<[u8]>>>,
    mut addr: u64,
    out: &mut [u8],
) {
    let mut pos = 0;
    while pos < out.len() {
        let off = (addr & PAGE_MASK) as usize;
        let n = (PAGE - off).min(out.len() - pos);
        let page = addr >> PAGE_BITS;
        let src = pages
            .get(&page)
            .or_else(|| fallback.and_then(|f| f.get(&page)));
        match src {
            Some(p) => out[pos..pos + n].copy_from_slice(&p[off..off + n]),
            None => out[pos..pos + n].fill(0),
        }
        pos += n;
        addr += n as u64;
    }
}

fn write_pages(
    pages: &mut HashMap<u64, Box<[u8]>>,
    fallback: Option<&HashMap<u64, Box<[u8]>>>,
    mut addr: u64,
    data: &[u8],
) {
    let mut pos = 0;
    while pos < data.len() {
        let off = (addr & PAGE_MASK) as usize;
        let n = (PAGE - off).min(data.len() - pos);
        let page = addr >> PAGE_BITS;
        let p = pages
            .entry(page)
            .or_insert_with(|| match fallback.and_then(|f| f.get(&page)) {
                Some(orig) => orig.clone(),
                None => vec![0u8; PAGE].into_boxed_slice(),
            });
        p[off..off + n].copy_from_slice(&data[pos..pos + n]);
        pos += n;
        addr += n as u64;
    }
}

/// A human-readable address: `sip0.cube1.pe2.tcm+0x40` for device PAs,
/// `host:NAME+0x10` for host data.
pub fn fmt_addr(addr: u64, tensors: &[TensorMeta]) -> String {
    if let Some(p) = Pa::decode(addr) {
        return p.to_string();
    }
    if let Some((t, off)) = pa::split_host(addr) {
        return match tensors.get(t as usize) {
            Some(m) => format!("host:{}+{off:#x}", m.name),
            None => format!("host:tensor{t}+{off:#x}"),
        };
    }
    format!("{addr:#x} (invalid)")
}

/// A human-readable extent: its address and size (and rows and stride when
/// strided).
pub fn fmt_extent(e: &Extent, tensors: &[TensorMeta]) -> String {
    let a = fmt_addr(e.pa, tensors);
    if e.rows == 1 {
        format!("{a} [{} B]", e.len)
    } else {
        format!("{a} [{} x {} B, stride {}]", e.rows, e.len, e.stride)
    }
}

/// Extents joined with `, `.
pub fn fmt_extents(es: &[Extent], tensors: &[TensorMeta]) -> String {
    if es.is_empty() {
        return "(none)".into();
    }
    es.iter()
        .map(|e| fmt_extent(e, tensors))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::Dtype;

    fn dev(space: Space, offset: u64) -> u64 {
        Pa {
            space,
            sip: 1,
            cube: 2,
            pe: 3,
            offset,
        }
        .encode()
        .expect("valid PA")
    }

    fn tensor(name: &str, n: u64) -> TensorMeta {
        TensorMeta {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![n],
            address: 0,
            host_data: true,
            shards: vec![],
        }
    }

    fn plane() -> DataPlane {
        DataPlane::new(&[tensor("x", 100_000), tensor("y", 8)], DEFAULT_MAX_BYTES)
    }

    fn read(p: &DataPlane, addr: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0xaa; n];
        p.read(addr, &mut v).unwrap();
        v
    }

    #[test]
    fn unwritten_device_memory_reads_zero() {
        let p = plane();
        assert_eq!(read(&p, dev(Space::Hbm, 12345), 5), vec![0; 5]);
    }

    #[test]
    fn partial_and_overlapping_writes_keep_the_latest_bytes() {
        let mut p = plane();
        let base = dev(Space::Tcm, 100);
        p.write(base, &[1, 2, 3, 4, 5, 6]).unwrap();
        p.write(base + 2, &[9, 9]).unwrap();
        p.write(base + 5, &[7, 8]).unwrap();
        assert_eq!(read(&p, base - 1, 9), vec![0, 1, 2, 9, 9, 5, 7, 8, 0]);
        // A read inside a written range.
        assert_eq!(read(&p, base + 3, 2), vec![9, 5]);
    }

    #[test]
    fn writes_and_reads_cross_page_boundaries() {
        let mut p = plane();
        let base = dev(Space::Hbm, PAGE as u64 * 3 - 3);
        let data: Vec<u8> = (0..PAGE as u32 + 10).map(|i| (i % 251) as u8).collect();
        p.write(base, &data).unwrap();
        assert_eq!(read(&p, base, data.len()), data);
        assert_eq!(p.page_count(), 3);
        // Different spaces with the same offset do not alias.
        assert_eq!(
            read(&p, dev(Space::Tcm, PAGE as u64 * 3 - 3), 4),
            vec![0; 4]
        );
    }

    #[test]
    fn strided_gather_and_scatter() {
        let mut p = plane();
        let src = dev(Space::Hbm, 0);
        p.write(src, &(0u8..32).collect::<Vec<_>>()).unwrap();
        // 3 rows of 2 bytes, 8 apart, then one contiguous run of 3.
        let ex = [
            Extent {
                pa: src + 1,
                len: 2,
                rows: 3,
                stride: 8,
            },
            Extent::contiguous(src + 30, 2),
        ];
        let mut got = Vec::new();
        p.gather(&ex, &mut got).unwrap();
        assert_eq!(got, vec![1, 2, 9, 10, 17, 18, 30, 31]);

        let dst = dev(Space::Tcm, 0);
        let out = [Extent {
            pa: dst,
            len: 4,
            rows: 2,
            stride: 6,
        }];
        p.scatter(&out, &got).unwrap();
        assert_eq!(read(&p, dst, 10), vec![1, 2, 9, 10, 0, 0, 17, 18, 30, 31]);
        // Wrong byte count is an error, not a partial write.
        assert!(p.scatter(&out, &got[..7]).is_err());
    }

    #[test]
    fn host_space_reads_tensor_data_and_keeps_the_input_pristine() {
        let mut p = plane();
        p.load_host(1, 0, &[1, 2, 3, 4]).unwrap();
        p.load_host(1, 4, &[5, 6, 7, 8]).unwrap();
        let h = pa::host(1, 2);
        assert_eq!(read(&p, h, 4), vec![3, 4, 5, 6]);
        p.write(h, &[0xee]).unwrap();
        assert_eq!(read(&p, pa::host(1, 0), 8), vec![1, 2, 0xee, 4, 5, 6, 7, 8]);
        let mut orig = [0u8; 8];
        p.read_host_input(1, 0, &mut orig).unwrap();
        assert_eq!(orig, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.host_coverage(1), Some((8, Some(8))));
    }

    #[test]
    fn bad_addresses_are_errors() {
        let mut p = plane();
        // Past the tensor's bytes.
        assert!(matches!(
            p.read(pa::host(1, 6), &mut [0; 4]),
            Err(PlaneError::HostOutOfRange { .. })
        ));
        // A tensor the trace does not have.
        assert!(matches!(
            p.read(pa::host(7, 0), &mut [0; 1]),
            Err(PlaneError::UnknownTensor { tensor: 7, .. })
        ));
        // Beyond 51 bits.
        assert!(p.write(1 << 51, &[1]).is_err());
        // Running from one space into the next.
        let end_of_hbm = (2u64 << 48) - 2;
        assert!(matches!(
            p.write(end_of_hbm, &[1, 2, 3]),
            Err(PlaneError::CrossesSpace { .. })
        ));
        assert!(p.load_host(1, 7, &[1, 2]).is_err());
    }

    #[test]
    fn absurd_extents_are_refused_before_allocating() {
        let p = DataPlane::new(&[], 1 << 20);
        let huge = [Extent {
            pa: dev(Space::Hbm, 0),
            len: 1 << 30,
            rows: 1 << 20,
            stride: 1 << 30,
        }];
        let mut v = Vec::new();
        assert!(matches!(
            p.gather(&huge, &mut v),
            Err(PlaneError::TooLarge { .. })
        ));
        let overflow = Extent {
            pa: dev(Space::Hbm, 0),
            len: 1,
            rows: 3,
            stride: u64::MAX / 2,
        };
        assert!(matches!(
            runs(&overflow).map(|_| ()),
            Err(PlaneError::ExtentOverflow { .. })
        ));
    }

    #[test]
    fn addresses_format_readably() {
        let ts = [tensor("x", 4)];
        assert_eq!(
            fmt_addr(dev(Space::Tcm, 0x40), &ts),
            "sip1.cube2.pe3.tcm+0x40"
        );
        assert_eq!(fmt_addr(pa::host(0, 16), &ts), "host:x+0x10");
        let e = Extent {
            pa: pa::host(0, 0),
            len: 2,
            rows: 2,
            stride: 4,
        };
        assert_eq!(fmt_extent(&e, &ts), "host:x+0x0 [2 x 2 B, stride 4]");
    }
}
