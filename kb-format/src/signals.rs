//! Removing a partial output when a tool is interrupted (kb-sim's trace,
//! kb-inspect's exports and timelines, kb-replay's reports and dumps).
//!
//! Outputs are written to a hidden temporary file renamed into place only
//! when complete ([`crate::AtomicFile`]); its destructor removes it on an
//! error, but SIGINT, SIGTERM and SIGHUP end the process without running
//! destructors. [`remove_on_signal`] installs handlers for them that
//! unlink the registered file and exit with 128 + the signal number (130,
//! 143, 129), as a shell reports a process the signal killed. SIGKILL
//! cannot be caught: that leaves the hidden `.NAME.partial*` file, beside
//! the target (or beside the file a symlinked target leads to). One file
//! is registered at a time (a tool writes its outputs one after another); [`AtomicFile::remove_on_signal`](crate::AtomicFile::remove_on_signal)
//! registers its temporary file and forgets it when committed or dropped.
//!
//! The handler does only async-signal-safe work: an atomic swap, `unlink`
//! and `_exit`.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The registered file's path, a `CString` leaked by [`remove_on_signal`]
/// and taken back by [`forget`] (or never, once a signal arrived).
static PARTIAL: AtomicPtr<libc::c_char> = AtomicPtr::new(null_mut());
static INSTALL: Once = Once::new();

/// What an abort says (after Rust's own "memory allocation of N bytes
/// failed", when that is the cause).
const ABORTED: &[u8] = b"error: aborted (most likely an allocation failed: this run needs more host memory than the process may use; see --max-memory); no partial output is left\n";

extern "C" fn on_signal(sig: libc::c_int) {
    let path = PARTIAL.swap(null_mut(), Ordering::SeqCst);
    if !path.is_null() {
        // SAFETY: `path` came from `CString::into_raw` in
        // `remove_on_signal` and the swap took it out, so nothing else
        // frees it while unlink reads it; unlink is async-signal-safe.
        unsafe {
            libc::unlink(path);
        }
    }
    if sig == libc::SIGABRT {
        // SAFETY: write(2) on stderr and _exit are async-signal-safe; the
        // buffer is a static byte string.
        unsafe {
            libc::write(2, ABORTED.as_ptr().cast(), ABORTED.len());
            libc::_exit(2)
        }
    }
    // SAFETY: _exit is async-signal-safe and ends the process at once,
    // running no destructors that could touch half-updated state.
    unsafe { libc::_exit(128 + sig) }
}

static ABORT: Once = Once::new();

/// Make an abort (SIGABRT: an allocation that failed, or a panic while
/// panicking) end the process with exit status 2 and a message on stderr,
/// removing the file registered by [`remove_on_signal`], instead of a
/// signal death with a core dump. Tools call it first thing in `main`.
pub fn exit_2_on_abort() {
    ABORT.call_once(|| {
        // SAFETY: as in `remove_on_signal`: `on_signal` does only
        // async-signal-safe work, and only SIGABRT's disposition changes.
        unsafe {
            libc::signal(libc::SIGABRT, on_signal as *const () as libc::sighandler_t);
        }
    });
}

/// Remove `path` if SIGINT, SIGTERM or SIGHUP arrives before [`forget`]
/// (replacing any path registered before), then exit 128 + the signal.
pub fn remove_on_signal(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return; // a path with a NUL byte cannot have been created
    };
    release(PARTIAL.swap(c.into_raw(), Ordering::SeqCst));
    INSTALL.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: `on_signal` has the signature signal(2) expects and
            // does only async-signal-safe work; replacing the default
            // disposition of these three signals is all this does.
            unsafe {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
        }
    });
}

/// Stop removing the registered file (it was committed or dropped).
pub fn forget() {
    release(PARTIAL.swap(null_mut(), Ordering::SeqCst));
}

fn release(p: *mut libc::c_char) {
    if !p.is_null() {
        // SAFETY: `p` came from `CString::into_raw` and the swap that
        // returned it removed it from `PARTIAL`, so it is freed once.
        drop(unsafe { CString::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registering_and_forgetting_frees_each_path_once() {
        let dir = tempfile::tempdir().unwrap();
        remove_on_signal(&dir.path().join("a"));
        remove_on_signal(&dir.path().join("b"));
        let p = PARTIAL.load(Ordering::SeqCst);
        assert!(!p.is_null());
        // SAFETY: `p` is the registered, NUL-terminated path.
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        assert!(s.to_string_lossy().ends_with("/b"));
        forget();
        assert!(PARTIAL.load(Ordering::SeqCst).is_null());
        forget(); // nothing registered: a no-op
    }
}
