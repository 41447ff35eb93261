//! The ordered map behind the tree set's indices: a B+tree of height two.
//!
//! Keys live in sorted leaves of at most [`LEAF_MAX`] entries, with keys and values in
//! separate arrays so a search reads only keys; a root array holds each leaf's first key.
//! Slot ids are 16-bit, so a set never holds more than 65536 entries and two levels
//! always suffice: a lookup is two binary searches over a few KiB of keys, and an insert
//! or remove moves at most one leaf's and the root's entries, bounded by `LEAF_MAX` and
//! `65536 / (LEAF_MAX / 4)`. Compared with `BTreeMap` (fanout 11, about six levels at 32k
//! entries) this halves the cache lines a random lookup touches, and at a handful of
//! entries an update is one small in-place array insert with no node allocation.

use alloc::vec::Vec;

/// Most entries in one leaf; a full leaf splits in two halves.
pub(crate) const LEAF_MAX: usize = 256;
/// A leaf this small merges with its right neighbour when the two fit in one.
const LEAF_MERGE: usize = LEAF_MAX / 4;

#[derive(Clone, Debug)]
struct Leaf<K, V> {
    keys: Vec<K>,
    values: Vec<V>,
}

/// A position: leaf index and entry index within it.
type Pos = (usize, usize);

/// An ordered map from `K` to `V` (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct SortedMap<K, V> {
    /// First key of each leaf; no leaf is empty.
    firsts: Vec<K>,
    leaves: Vec<Leaf<K, V>>,
    len: usize,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self {
            firsts: Vec::new(),
            leaves: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy, V> SortedMap<K, V> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Position of the greatest key `<= key`.
    fn pos_le(&self, key: &K) -> Option<Pos> {
        let leaf = self
            .firsts
            .partition_point(|first| first <= key)
            .checked_sub(1)?;
        // The leaf's first key is <= key, so the index is at least 1 before subtracting.
        let index = self.leaves[leaf].keys.partition_point(|k| k <= key) - 1;
        Some((leaf, index))
    }

    /// Position of the least key `>= key` (may be one past the end).
    fn pos_ge(&self, key: &K) -> Pos {
        match self.pos_le(key) {
            None => (0, 0),
            Some((leaf, index)) if self.leaves[leaf].keys[index] == *key => (leaf, index),
            Some((leaf, index)) => self.next_pos((leaf, index)),
        }
    }

    fn next_pos(&self, (leaf, index): Pos) -> Pos {
        if index + 1 < self.leaves[leaf].keys.len() {
            (leaf, index + 1)
        } else {
            (leaf + 1, 0)
        }
    }

    fn entry(&self, (leaf, index): Pos) -> Option<(&K, &V)> {
        let leaf = self.leaves.get(leaf)?;
        Some((leaf.keys.get(index)?, leaf.values.get(index)?))
    }

    /// The entry with the greatest key `<= key`.
    pub(crate) fn get_le(&self, key: &K) -> Option<(&K, &V)> {
        self.entry(self.pos_le(key)?)
    }

    /// The value stored under exactly this key.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let (leaf, index) = self.pos_le(key)?;
        let leaf = &mut self.leaves[leaf];
        if leaf.keys[index] == *key {
            leaf.values.get_mut(index)
        } else {
            None
        }
    }

    /// The entry with the least key.
    pub(crate) fn first(&self) -> Option<(&K, &V)> {
        self.entry((0, 0))
    }

    /// The entries with keys `>= key`, in order.
    pub(crate) fn iter_from(&self, key: &K) -> Iter<'_, K, V> {
        Iter {
            map: self,
            pos: self.pos_ge(key),
        }
    }

    /// Inserts or replaces; returns the value replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let Some((leaf, index)) = self.pos_le(&key) else {
            // Smaller than every key (or the map is empty): goes first in leaf 0.
            if let Some(first) = self.leaves.first_mut() {
                first.keys.insert(0, key);
                first.values.insert(0, value);
                self.firsts[0] = key;
                self.len += 1;
                self.split_if_full(0);
            } else {
                // Room for a typical VM's slots without regrowing.
                let mut keys = Vec::with_capacity(16);
                let mut values = Vec::with_capacity(16);
                keys.push(key);
                values.push(value);
                self.leaves.push(Leaf { keys, values });
                self.firsts.push(key);
                self.len = 1;
            }
            return None;
        };
        let target = &mut self.leaves[leaf];
        if target.keys[index] == key {
            return Some(core::mem::replace(&mut target.values[index], value));
        }
        target.keys.insert(index + 1, key);
        target.values.insert(index + 1, value);
        self.len += 1;
        self.split_if_full(leaf);
        None
    }

    fn split_if_full(&mut self, leaf: usize) {
        if self.leaves[leaf].keys.len() <= LEAF_MAX {
            return;
        }
        let half = self.leaves[leaf].keys.len() / 2;
        let keys = self.leaves[leaf].keys.split_off(half);
        let values = self.leaves[leaf].values.split_off(half);
        self.firsts.insert(leaf + 1, keys[0]);
        self.leaves.insert(leaf + 1, Leaf { keys, values });
    }

    /// Removes the entry with this key; returns its value.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let (leaf, index) = self.pos_le(key)?;
        if self.leaves[leaf].keys[index] != *key {
            return None;
        }
        let target = &mut self.leaves[leaf];
        target.keys.remove(index);
        let value = target.values.remove(index);
        self.len -= 1;
        if target.keys.is_empty() {
            self.leaves.remove(leaf);
            self.firsts.remove(leaf);
            return Some(value);
        }
        self.firsts[leaf] = target.keys[0];
        let remaining = target.keys.len();
        // Keep leaves from thinning out after many deletes.
        if remaining < LEAF_MERGE
            && leaf + 1 < self.leaves.len()
            && remaining + self.leaves[leaf + 1].keys.len() <= LEAF_MAX
        {
            let next = self.leaves.remove(leaf + 1);
            self.firsts.remove(leaf + 1);
            self.leaves[leaf].keys.extend(next.keys);
            self.leaves[leaf].values.extend(next.values);
        }
        Some(value)
    }
}

/// Entries in key order from a position.
pub(crate) struct Iter<'a, K, V> {
    map: &'a SortedMap<K, V>,
    pos: Pos,
}

impl<'a, K: Ord + Copy, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        let entry = self.map.entry(self.pos)?;
        self.pos = self.map.next_pos(self.pos);
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    /// Inserts and removes enough keys to split and merge leaves many times, comparing every
    /// query with `BTreeMap`.
    #[test]
    fn matches_btreemap_through_splits_and_merges() {
        let mut map = SortedMap::default();
        let mut reference = BTreeMap::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        for step in 0..40_000u64 {
            let key = next(5000);
            // Grow for a while, then shrink, so both splits and merges happen.
            let insert = if step < 20_000 {
                next(4) != 0
            } else {
                next(4) == 0
            };
            if insert {
                assert_eq!(map.insert(key, step), reference.insert(key, step));
            } else {
                assert_eq!(map.remove(&key), reference.remove(&key));
            }
            assert_eq!(map.len(), reference.len());
            if step % 997 == 0 {
                for probe in 0..5001 {
                    assert_eq!(map.get_le(&probe), reference.range(..=probe).next_back());
                    if probe % 97 == 0 {
                        let got: Vec<_> = map.iter_from(&probe).take(300).collect();
                        let want: Vec<_> = reference.range(probe..).take(300).collect();
                        assert_eq!(got, want);
                    }
                }
                assert_eq!(map.first(), reference.iter().next());
                assert!(map
                    .leaves
                    .iter()
                    .all(|leaf| !leaf.keys.is_empty() && leaf.keys.len() <= LEAF_MAX));
            }
        }
    }
}
