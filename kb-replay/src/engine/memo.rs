//! The planner's memory of what is true of some bytes until a physical
//! write changes any of them: their fingerprint is checked (so a later
//! memory op reading the same bytes with the same fingerprint needs no
//! hash of its own), or they are decoded into a [`Dense`] slot (so a later
//! GEMM reading them the same way shares it).
//!
//! An entry is found by its exact key (the extents and what is known of
//! them) in one hash map: a lookup hashes the key and compares it with
//! what the map's bucket holds, one extent inline (the common case: a
//! tile, strided or not), more behind one pointer. (A map from a hash of
//! the key to a list of entry ids, each compared through the entry's own
//! extent list, cost three dependent cache misses more per lookup:
//! measured, about a third of planning on gemm_tiled.)

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use kb_format::Extent;
use rustc_hash::FxHashMap;

use super::plan::{Dense, DenseHow, DenseSlot};
use crate::plane::lazy::{SpanIndex, overlaps};
use crate::plane::span;

/// Most fingerprint checks and decoded operands remembered.
const MEMO_MAX: usize = 1 << 16;
/// Most bytes of decoded operands remembered.
const DENSE_MAX: usize = 256 << 20;

/// What is known of an entry's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tag {
    /// Their fingerprint is checked: it is this.
    Fp(u64),
    /// They are decoded, read this way (the slot is the entry's value).
    Dense(DenseHow),
}

/// An entry's extents: one inline, or more.
#[derive(Debug, Clone)]
enum Src {
    One(Extent),
    Many(Box<[Extent]>),
}

impl Src {
    fn new(src: &[Extent]) -> Src {
        match src {
            [e] => Src::One(*e),
            _ => Src::Many(src.into()),
        }
    }

    fn as_slice(&self) -> &[Extent] {
        match self {
            Src::One(e) => std::slice::from_ref(e),
            Src::Many(v) => v,
        }
    }
}

/// An entry's key, as the map stores it.
#[derive(Debug, Clone)]
struct Key {
    src: Src,
    tag: Tag,
}

/// A key as looked up (borrowed extents) or stored: both hash and compare
/// as (extents, tag), so a lookup needs no owned key.
trait KeyView {
    fn src(&self) -> &[Extent];
    fn tag(&self) -> Tag;
}

impl KeyView for Key {
    fn src(&self) -> &[Extent] {
        self.src.as_slice()
    }
    fn tag(&self) -> Tag {
        self.tag
    }
}

/// A key to look up.
struct Probe<'s>(&'s [Extent], Tag);

impl KeyView for Probe<'_> {
    fn src(&self) -> &[Extent] {
        self.0
    }
    fn tag(&self) -> Tag {
        self.1
    }
}

impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.src().hash(h);
        self.tag().hash(h);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, o: &Self) -> bool {
        self.tag() == o.tag() && self.src() == o.src()
    }
}

impl Eq for dyn KeyView + '_ {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self as &dyn KeyView).hash(h);
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        (self as &dyn KeyView) == (o as &dyn KeyView)
    }
}

impl Eq for Key {}

impl<'a> Borrow<dyn KeyView + 'a> for Key {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

/// Checked fingerprints and decoded operands, forgotten when a physical
/// write touches their bytes (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// Each entry, with its slot when its bytes are decoded.
    map: FxHashMap<Key, Option<Dense>>,
    /// Each entry's key by id (`None`: a free id), for forgetting it.
    keys: Vec<Option<Key>>,
    free: Vec<u32>,
    /// Where the entries' extents lie, by id.
    index: SpanIndex,
    /// Bytes of the decoded operands remembered.
    dense_bytes: usize,
    /// Ids a write meets, reused from one write to the next.
    hit: Vec<(u32, u32)>,
}

impl Memo {
    /// Whether these bytes' fingerprint `fp` is checked already.
    pub fn has_fp(&self, src: &[Extent], fp: u64) -> bool {
        self.map
            .contains_key(&Probe(src, Tag::Fp(fp)) as &dyn KeyView)
    }

    /// Remember that these bytes' fingerprint `fp` is checked.
    pub fn add_fp(&mut self, src: &[Extent], fp: u64) {
        self.insert(src, Tag::Fp(fp), None);
    }

    /// The slot of these bytes decoded `how`, shared with the GEMMs
    /// before that read them so (a new one if none did since they last
    /// changed).
    pub fn dense(&mut self, src: &[Extent], how: DenseHow) -> Dense {
        let tag = Tag::Dense(how);
        if let Some(Some(slot)) = self.map.get(&Probe(src, tag) as &dyn KeyView) {
            return slot.clone();
        }
        let slot = Dense::new(DenseSlot::new(how.1 * how.2));
        self.insert(src, tag, Some(slot.clone()));
        slot
    }

    fn insert(&mut self, src: &[Extent], tag: Tag, dense: Option<Dense>) {
        if self.map.len() >= MEMO_MAX || self.dense_bytes >= DENSE_MAX {
            for id in 0..self.keys.len() as u32 {
                self.forget(id);
            }
        }
        if let Tag::Dense((_, rows, cols, ..)) = tag {
            self.dense_bytes += rows * cols * 4;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.keys.push(None);
                (self.keys.len() - 1) as u32
            }
        };
        for (i, e) in src.iter().enumerate() {
            self.index.insert(e, id, i as u32);
        }
        let key = Key {
            src: Src::new(src),
            tag,
        };
        let dup = self.map.insert(key.clone(), dense);
        debug_assert!(dup.is_none(), "entries are added when absent");
        self.keys[id as usize] = Some(key);
    }

    fn forget(&mut self, id: u32) {
        let Some(key) = self.keys[id as usize].take() else {
            return;
        };
        self.index.remove_id(id, key.src.as_slice());
        self.free.push(id);
        if let Tag::Dense((_, rows, cols, ..)) = key.tag {
            self.dense_bytes -= rows * cols * 4;
        }
        self.map.remove(&key);
    }

    /// `e` is about to be written physically: forget every entry whose
    /// bytes it touches.
    pub fn written(&mut self, e: &Extent) {
        let Some((s, end)) = span(e) else { return };
        let mut hit = std::mem::take(&mut self.hit);
        hit.clear();
        self.index.query(s, end, |id, part| hit.push((id, part)));
        hit.sort_unstable();
        hit.dedup_by_key(|h| h.0);
        for &(id, _) in &hit {
            let meets = self.keys[id as usize]
                .as_ref()
                .is_some_and(|k| k.src.as_slice().iter().any(|x| overlaps(x, e)));
            if meets {
                self.forget(id);
            }
        }
        self.hit = hit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(pa: u64) -> Extent {
        Extent {
            pa,
            len: 16,
            rows: 4,
            stride: 64,
        }
    }

    #[test]
    fn entries_are_found_by_their_exact_key_until_a_write_meets_them() {
        let mut m = Memo::default();
        let (a, b) = (tile(0x1000), tile(0x1010));
        let two = [Extent::contiguous(0x2000, 8), Extent::contiguous(0x3000, 8)];
        m.add_fp(&[a], 7);
        m.add_fp(&two, 9);
        assert!(m.has_fp(&[a], 7));
        assert!(!m.has_fp(&[a], 8), "another fingerprint");
        assert!(!m.has_fp(&[b], 7), "other bytes");
        assert!(m.has_fp(&two, 9));
        assert!(!m.has_fp(&two[..1], 9), "a part of the extents");
        // Decoded slots are shared by the same bytes read the same way.
        let how = (0u8, 4, 4, false, false);
        let s = m.dense(&[a], how);
        assert!(Dense::ptr_eq(&s, &m.dense(&[a], how)));
        assert!(!Dense::ptr_eq(&s, &m.dense(&[a], (0, 4, 4, true, false))));
        // A write into the gap between `a`'s rows meets none of its bytes.
        m.written(&Extent::contiguous(0x1010, 16));
        assert!(m.has_fp(&[a], 7));
        assert!(Dense::ptr_eq(&s, &m.dense(&[a], how)));
        // One into its last row forgets both its entries, not the others.
        m.written(&Extent::contiguous(0x10c8, 1));
        assert!(!m.has_fp(&[a], 7));
        assert!(!Dense::ptr_eq(&s, &m.dense(&[a], how)));
        assert!(m.has_fp(&two, 9));
        m.written(&Extent::contiguous(0x3007, 4));
        assert!(!m.has_fp(&two, 9));
        assert_eq!(
            m.dense_bytes,
            4 * 4 * 4,
            "the one slot made after the write"
        );
    }
}
