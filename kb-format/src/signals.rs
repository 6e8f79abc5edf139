//! Removing a partial output when a tool is interrupted (kb-sim's trace,
//! kb-inspect's exports and timelines, kb-replay's reports and dumps), and
//! stopping a sweep's children.
//!
//! Outputs are written to a hidden temporary file renamed into place only
//! when complete ([`crate::AtomicFile`]); its destructor removes it on an
//! error, but SIGINT, SIGTERM and SIGHUP end the process without running
//! destructors. [`remove_on_signal`] installs handlers for them that
//! unlink the registered files and exit with 128 + the signal number (130,
//! 143, 129), as a shell reports a process the signal killed. SIGKILL
//! cannot be caught: that leaves the hidden `.NAME.partial*` file, beside
//! the target (or beside the file a symlinked target leads to). Up to
//! [`SLOTS`] files are registered at a time (a tool writing a set of
//! outputs, as a sweep's CSV and Parquet tables, holds one each);
//! [`AtomicFile::remove_on_signal`](crate::AtomicFile::remove_on_signal)
//! registers its temporary file and forgets it when committed or dropped.
//!
//! A process with children to stop first (`kb-sim sweep`) calls [`defer`]:
//! until [`undefer`], the handlers only note the signal ([`pending`]), and
//! the process stops its children ([`terminate`]), removes their files and
//! exits 128 + the signal itself.
//!
//! The handler does only async-signal-safe work: atomic loads and swaps,
//! `unlink` and `_exit`.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};

/// How many files may be registered at once.
pub const SLOTS: usize = 8;

/// The registered files' paths, each a `CString` leaked by
/// [`remove_on_signal`] and taken back by [`forget`] (or never, once a
/// signal arrived).
static PARTIAL: [AtomicPtr<libc::c_char>; SLOTS] = [const { AtomicPtr::new(null_mut()) }; SLOTS];
static INSTALL: Once = Once::new();
/// Set by [`defer`]: the handler notes the signal instead of exiting.
static DEFER: AtomicBool = AtomicBool::new(false);
/// The signal noted while deferred (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// What an abort says (after Rust's own "memory allocation of N bytes
/// failed", when that is the cause).
const ABORTED: &[u8] = b"error: aborted (most likely an allocation failed: this run needs more host memory than the process may use; see --max-memory); no partial output is left\n";

extern "C" fn on_signal(sig: libc::c_int) {
    if sig != libc::SIGABRT && DEFER.load(Ordering::SeqCst) {
        // The process stops its children and cleans up, then exits.
        let _ = PENDING.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
        return;
    }
    for slot in &PARTIAL {
        let path = slot.swap(null_mut(), Ordering::SeqCst);
        if !path.is_null() {
            // SAFETY: `path` came from `CString::into_raw` in
            // `remove_on_signal` and the swap took it out, so nothing else
            // frees it while unlink reads it; unlink is async-signal-safe.
            unsafe {
                libc::unlink(path);
            }
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
/// removing the files registered by [`remove_on_signal`], instead of a
/// signal death with a core dump. Tools call it first thing in `main`.
pub fn exit_2_on_abort() {
    ABORT.call_once(|| {
        // SAFETY: as in `install`: `on_signal` does only
        // async-signal-safe work, and only SIGABRT's disposition changes.
        unsafe {
            libc::signal(libc::SIGABRT, on_signal as *const () as libc::sighandler_t);
        }
    });
}

/// Install the handlers for SIGINT, SIGTERM and SIGHUP (once).
fn install() {
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

/// Remove `path` if SIGINT, SIGTERM or SIGHUP arrives before [`forget`]
/// of the returned slot, then exit 128 + the signal. `None` when every
/// slot is taken (the file is then left to its destructor) or the path
/// has a NUL byte (it cannot have been created).
pub fn remove_on_signal(path: &Path) -> Option<usize> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    install();
    let raw = c.into_raw();
    for (i, slot) in PARTIAL.iter().enumerate() {
        if slot
            .compare_exchange(null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Some(i);
        }
    }
    release(raw);
    None
}

/// Stop removing the file registered in `slot` (it was committed or
/// dropped).
pub fn forget(slot: usize) {
    if let Some(s) = PARTIAL.get(slot) {
        release(s.swap(null_mut(), Ordering::SeqCst));
    }
}

/// Until [`undefer`], SIGINT, SIGTERM and SIGHUP are only noted
/// ([`pending`]): the caller stops its work and exits 128 + the signal.
pub fn defer() {
    install();
    DEFER.store(true, Ordering::SeqCst);
}

/// Signals end the process again (removing registered files). A signal
/// noted meanwhile stays [`pending`].
pub fn undefer() {
    DEFER.store(false, Ordering::SeqCst);
}

/// The first signal noted while deferred.
pub fn pending() -> Option<i32> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Ask process `pid` to stop: SIGTERM, which kb's tools take as "remove
/// your partial output and exit" (a child's own files are its to remove).
pub fn terminate(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid > 0 {
        // SAFETY: kill(2) with a positive pid sends a signal to that one
        // process; it touches no memory of ours.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// The name of signal `sig` (`SIGTERM`), for messages.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

fn release(p: *mut libc::c_char) {
    if !p.is_null() {
        // SAFETY: `p` came from `CString::into_raw` and the swap that
        // returned it removed it from `PARTIAL` (or it was never stored),
        // so it is freed once.
        drop(unsafe { CString::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registering_and_forgetting_frees_each_path_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = remove_on_signal(&dir.path().join("a")).unwrap();
        let b = remove_on_signal(&dir.path().join("b")).unwrap();
        assert_ne!(a, b, "two files registered at once hold two slots");
        let p = PARTIAL[b].load(Ordering::SeqCst);
        assert!(!p.is_null());
        // SAFETY: `p` is the registered, NUL-terminated path.
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        assert!(s.to_string_lossy().ends_with("/b"));
        forget(b);
        assert!(PARTIAL[b].load(Ordering::SeqCst).is_null());
        assert!(!PARTIAL[a].load(Ordering::SeqCst).is_null());
        forget(a);
        forget(a); // nothing registered: a no-op
        forget(SLOTS); // no such slot: a no-op
        assert!(PARTIAL.iter().all(|s| s.load(Ordering::SeqCst).is_null()));
    }
}
