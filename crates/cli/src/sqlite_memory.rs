//! SQLite's own allocations through mimalloc, without its global memory
//! statistics. Out of the box SQLite calls glibc's `malloc` and takes one
//! process-wide mutex on every allocation and free to keep
//! `sqlite3_status` figures that nothing here reads. Its multi-row
//! statements grow buffers of hundreds of KiB by `realloc`, which in glibc
//! consolidate its fast bins each time (2.6 % of the continuous mode's CPU,
//! docs/BENCHMARKS.md, seventh steps). The rest of the process already
//! allocates with mimalloc (`main.rs`).
//!
//! [`install`] must run before SQLite is first used in the process, while
//! it has one thread: `sqlite3_config` is not thread-safe, and refuses
//! (`SQLITE_MISUSE`) once SQLite is initialised.

use std::ffi::{c_int, c_void};

use libmimalloc_sys as mi;
use rusqlite::ffi;

/// A size from SQLite (never negative in practice) as mimalloc's.
fn size_in(n: c_int) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// A size from mimalloc as SQLite's (saturating; SQLite never asks for
/// 2 GiB at once).
fn size_out(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn malloc(n: c_int) -> *mut c_void {
    // SAFETY: mimalloc's malloc has no precondition.
    unsafe { mi::mi_malloc(size_in(n)) }
}

unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: SQLite frees only what `malloc` or `realloc` returned.
    unsafe { mi::mi_free(p) }
}

unsafe extern "C" fn realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    // SAFETY: as `free`: `p` came from this allocator.
    unsafe { mi::mi_realloc(p, size_in(n)) }
}

unsafe extern "C" fn size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: as `free`: `p` came from this allocator.
    size_out(unsafe { mi::mi_usable_size(p) })
}

unsafe extern "C" fn roundup(n: c_int) -> c_int {
    // SAFETY: no precondition; it only computes a size.
    size_out(unsafe { mi::mi_good_size(size_in(n)) })
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn shutdown(_: *mut c_void) {}

/// Routes SQLite's allocations to mimalloc and turns its memory statistics
/// off. `Err` holds SQLite's result code when it refused (it was already
/// initialised); SQLite then keeps its defaults, which work, only slower.
pub fn install() -> Result<(), c_int> {
    let methods = ffi::sqlite3_mem_methods {
        xMalloc: Some(malloc),
        xFree: Some(free),
        xRealloc: Some(realloc),
        xSize: Some(size),
        xRoundup: Some(roundup),
        xInit: Some(init),
        xShutdown: Some(shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: called first thing in `main`, before any other thread or
    // SQLite connection exists (the contract of `sqlite3_config`); SQLite
    // copies the methods before returning.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const methods) };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    // SAFETY: as above.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int) };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The methods keep SQLite's contract on their own: sizes round up to
    /// what is allocated, a block holds what was asked and keeps its bytes
    /// through `realloc`.
    #[test]
    fn the_methods_keep_sqlites_contract() {
        // SAFETY: the methods are called as SQLite calls them.
        unsafe {
            let n = roundup(100);
            assert!(n >= 100, "{n}");
            let p = malloc(n).cast::<u8>();
            assert!(!p.is_null());
            assert!(size(p.cast()) >= n);
            assert_eq!(p as usize % 8, 0, "SQLite needs 8-byte alignment");
            p.write_bytes(0xA5, 100);
            let q = realloc(p.cast(), roundup(300_000)).cast::<u8>();
            assert!(!q.is_null());
            assert!(size(q.cast()) >= 300_000);
            assert!((0..100).all(|i| *q.add(i) == 0xA5));
            free(q.cast());
            assert_eq!(size(std::ptr::null_mut()), 0);
        }
    }
}
