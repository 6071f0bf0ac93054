//! Where a loaded model's weight bytes live: one arena per model ([`Weights::into_arena`]), each
//! matrix's [`WeightBytes`] a slice of it.
//!
//! Decode streams every weight once per token. On Linux the arena's whole 2 MiB pages are marked
//! `MADV_HUGEPAGE` before anything touches them, so a kernel whose transparent huge pages are
//! "madvise" (the common default) backs them with 2 MiB pages: with 4 KiB pages the hardware
//! prefetchers stop at every page boundary and each page costs a TLB walk. A model's matrices
//! are mostly smaller than 2 MiB (the default model's are 70 KiB to 1.1 MiB), so only packed
//! together do they fill whole huge pages (BENCHMARKS.md, "Weights on transparent huge pages").

use std::sync::Arc;

use tpslab_kernels::{Layout, packed};

use super::weight_bytes::WeightBytes;
use super::weights::{Linear, Weights};

/// Huge pages are this size on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Each matrix starts on a cache line (and on the kernels' widest vector).
const ALIGN: usize = 64;

/// A zeroed buffer for `size` bytes and where in it they start: on a 2 MiB boundary, with the
/// whole 2 MiB pages from there marked `MADV_HUGEPAGE` before anything touches them (a large
/// zeroed allocation is fresh, untouched memory; the slack around the bytes is never touched, so
/// it costs address space only). A hint: where it is refused, nothing changes.
fn huge_page_buffer(size: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; size + 2 * HUGE_PAGE];
    let base = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - v.as_ptr() as usize;
    #[cfg(target_os = "linux")]
    {
        let len = size.next_multiple_of(HUGE_PAGE);
        // SAFETY: `base + len <= size + 2 * HUGE_PAGE` lies inside `v`'s allocation, and
        // MADV_HUGEPAGE only changes how the kernel backs those pages, never their contents.
        let _ = unsafe {
            libc::madvise(
                v.as_ptr().add(base) as *mut libc::c_void,
                len,
                libc::MADV_HUGEPAGE,
            )
        };
    }
    (v, base)
}

/// Copies `src` into `dst` and frees it. Where `src` is the only holder of its buffer, each
/// copied stretch's whole pages are handed back to the system at once, so the arena's new pages
/// and the old buffers together never hold much more than one model (a 30 MB tensor would
/// otherwise be resident twice while it is copied).
fn move_bytes(src: WeightBytes, dst: &mut [u8]) {
    match Arc::try_unwrap(src.buf) {
        Ok(mut v) if src.start == 0 && src.len == v.len() => {
            for (d, s) in dst.chunks_mut(RELEASE_STEP).zip(v.chunks_mut(RELEASE_STEP)) {
                d.copy_from_slice(s);
                release_pages(s);
            }
        }
        Ok(v) => dst.copy_from_slice(&v[src.start..src.start + src.len]),
        Err(buf) => dst.copy_from_slice(&buf[src.start..src.start + src.len]),
    }
}

/// [`move_bytes`] for a matrix packed for this CPU's kernels as it is copied
/// ([`packed::pack_into`]): the old buffer's pages are handed back once it is packed (a
/// matrix's rows are read all over while its panels are written), so the freed buffers do not
/// stay resident in the allocator's heap beside the arena.
fn pack_bytes(src: WeightBytes, l: &Linear, dst: &mut [u8]) {
    packed::pack_into(l.ty, l.n, l.k, &src, dst);
    if let Ok(mut v) = Arc::try_unwrap(src.buf) {
        release_pages(&mut v);
    }
}

/// How much is copied between two hand-backs.
const RELEASE_STEP: usize = 1 << 20;

/// Hands the whole pages inside `s` back to the system (they read as zeros afterwards). A hint.
fn release_pages(s: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if page == 0 {
            return;
        }
        let start = s.as_mut_ptr() as usize;
        let lo = start.next_multiple_of(page);
        let hi = (start + s.len()) / page * page;
        if hi > lo {
            // SAFETY: [lo, hi) lies inside `s`, which is borrowed mutably, so nothing else reads
            // it; MADV_DONTNEED only makes those pages read as zeros from now on.
            let _ = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = s;
}

/// Hands memory freed inside the allocator's heap back to the system: the buffers that loading
/// read and then stacked (Q, K, V into one matrix, gate and up) stay mapped in glibc's heap
/// after they are freed, and the arena is about to be written beside them.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Weights {
    /// The same weights with every matrix's bytes moved into one arena on huge pages, each in
    /// the layout this CPU's kernels run fastest ([`packed::preferred`]: on x86, every type
    /// with a packed layout, 8 rows at a time). Each old buffer's pages are handed back as they
    /// are copied, so memory in use stays near one model's size (the arena's pages are only
    /// backed once written).
    pub fn into_arena(mut self) -> Self {
        let mut at = 0;
        let mut ranges = Vec::new();
        for l in self.all_matrices_mut() {
            let layout = match l.layout {
                Layout::Ggml if !l.data.is_empty() => packed::preferred(l.ty, l.n),
                same => same,
            };
            let len = if layout == l.layout {
                l.data.len()
            } else {
                packed::len(l.ty, layout, l.n, l.k)
            };
            ranges.push((at, len, layout));
            at = (at + len).next_multiple_of(ALIGN);
        }
        return_freed_memory();
        let (mut arena, base) = huge_page_buffer(at);
        ranges.iter_mut().for_each(|r| r.0 += base);
        for (l, &(start, len, layout)) in self.all_matrices_mut().zip(&ranges) {
            let dst = &mut arena[start..start + len];
            if layout == l.layout {
                move_bytes(std::mem::take(&mut l.data), dst);
            } else {
                pack_bytes(std::mem::take(&mut l.data), l, dst);
                l.layout = layout;
            }
        }
        let arena = Arc::new(arena);
        for (l, &(start, len, _)) in self.all_matrices_mut().zip(&ranges) {
            l.data = WeightBytes {
                buf: Arc::clone(&arena),
                start,
                len,
            };
        }
        self
    }

    /// Every matrix and every part of a matrix stacked from several types.
    fn all_matrices_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.matrices_mut().flat_map(|l| {
            if l.parts.is_empty() {
                vec![l]
            } else {
                l.parts.iter_mut().collect()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use tpslab_kernels::WType;

    use super::*;
    use crate::model::weights::{Ffn, LayerWeights};

    fn matrix(ty: WType, n: usize, k: usize, seed: u32) -> Linear {
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect();
        Linear::new(ty, n, k, tpslab_kernels::quantize::quantize(ty, &x))
    }

    fn bytes_of(w: &mut Weights) -> Vec<Vec<u8>> {
        w.all_matrices_mut()
            .map(|l| l.ggml_bytes().into_owned())
            .collect()
    }

    /// Every matrix, and each part of one stacked from several types, keeps its bytes (as ggml
    /// rows: a Q4_K matrix is packed for the kernels where they run faster so, padding rows
    /// and all); all sit in one buffer, each on a 64-byte boundary, none overlapping.
    #[test]
    fn the_arena_keeps_every_matrix_and_part_aligned_in_one_buffer() {
        let k = 256;
        let wqkv = Linear::concat(&[&matrix(WType::Q5_0, 8, k, 1), &matrix(WType::Q8_0, 3, k, 2)])
            .expect("same k");
        let layer = LayerWeights {
            attn_norm: vec![1.0; k],
            wqkv,
            q_norm: None,
            k_norm: None,
            attn_sinks: None,
            wo: matrix(WType::Q4K, 13, k, 3),
            post_attn_norm: None,
            ffn_norm: vec![1.0; k],
            ffn: Ffn::Dense {
                gate_up: matrix(WType::Q4_0, 7, k, 4),
                down: matrix(WType::F16, k, 3, 5),
            },
            post_ffn_norm: None,
        };
        let mut w = Weights {
            // 163 KB: whole pages of it are handed back while it is copied.
            embed: matrix(WType::Q8_0, 600, k, 6),
            layers: vec![layer],
            out_norm: vec![1.0; k],
            lm_head: Some(matrix(WType::Q6K, 2, k, 7)),
            rope_factors: None,
        };
        let before = bytes_of(&mut w);
        assert_eq!(
            before.len(),
            7,
            "embed, 2 parts of wqkv, wo, gate_up, down, head"
        );
        let mut w = w.into_arena();
        assert_eq!(bytes_of(&mut w), before);
        let wo = &w.layers[0].wo;
        assert_eq!(wo.layout, packed::preferred(WType::Q4K, 13));
        assert_eq!(wo.data.len(), packed::len(WType::Q4K, wo.layout, 13, k));
        let arena = Arc::clone(&w.embed.data.buf);
        let mut spans: Vec<(usize, usize)> = w
            .all_matrices_mut()
            .map(|l| {
                assert!(Arc::ptr_eq(&l.data.buf, &arena));
                assert_eq!(l.data.as_ptr() as usize % ALIGN, 0);
                (l.data.start, l.data.start + l.data.len)
            })
            .collect();
        spans.sort();
        assert_eq!((arena.as_ptr() as usize + spans[0].0) % HUGE_PAGE, 0);
        assert!(spans.windows(2).all(|p| p[0].1 <= p[1].0));
        assert!(
            w.layers[0].wqkv.data.is_empty(),
            "a stacked matrix holds only its parts"
        );
    }
}
