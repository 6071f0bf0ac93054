//! A fixed-capacity ring buffer: the live metrics' step history and sample series.

/// Errors from building metrics containers with unusable settings.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MetricsError {
    #[error("ring buffer capacity must be at least 1")]
    ZeroCapacity,
    #[error("sliding window must be positive and finite, got {0} s")]
    BadWindow(f64),
}

/// A fixed-capacity buffer that keeps the newest `capacity` items; pushing into a full ring
/// overwrites the oldest. Storage is allocated once, so the engine thread can record every step
/// forever without growing.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    items: Vec<T>,
    /// Index of the oldest item once the ring is full (0 before that).
    head: usize,
    capacity: usize,
}

impl<T> Ring<T> {
    /// An empty ring holding at most `capacity` (>= 1) items.
    pub fn new(capacity: usize) -> Result<Self, MetricsError> {
        if capacity == 0 {
            return Err(MetricsError::ZeroCapacity);
        }
        Ok(Self {
            items: Vec::with_capacity(capacity),
            head: 0,
            capacity,
        })
    }

    /// Append `item`, returning the oldest item when it had to make room.
    pub fn push(&mut self, item: T) -> Option<T> {
        if self.items.len() < self.capacity {
            self.items.push(item);
            return None;
        }
        let old = std::mem::replace(&mut self.items[self.head], item);
        self.head = (self.head + 1) % self.capacity;
        Some(old)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items oldest first, as two slices (plotting code can use them without copying).
    pub fn as_slices(&self) -> (&[T], &[T]) {
        let (newer, older) = self.items.split_at(self.head);
        (older, newer)
    }

    /// Items oldest to newest.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + Clone + '_ {
        let (a, b) = self.as_slices();
        a.iter().chain(b)
    }

    /// The most recently pushed item.
    pub fn latest(&self) -> Option<&T> {
        self.iter().next_back()
    }

    pub(crate) fn latest_mut(&mut self) -> Option<&mut T> {
        // The newest item sits just before the oldest (`head`), wrapping around.
        let len = self.items.len();
        self.items.get_mut((self.head + len.checked_sub(1)?) % len)
    }

    /// Drop every item, keeping the allocation.
    pub fn clear(&mut self) {
        self.items.clear();
        self.head = 0;
    }
}
