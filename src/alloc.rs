//! The binary's allocator: mimalloc, except in a process that only prints its version or
//! its help.
//!
//! Validation builds a located tree of every YAML value, and mimalloc, made for many small
//! short-lived objects, validates the 10,000-stage benchmark in about half the time glibc
//! malloc takes. But starting mimalloc (reserving and committing its arena, whose first
//! pages a THP-enabled kernel zeroes 2 MiB at a time) is about 1 ms, most of what is left
//! of `drivetrain --version` once the binary needs no relocation (bench/README.md, "The
//! binaries"). So the choice is made once, at the first allocation, from the arguments
//! the C runtime passed (captured in `.init_array`, before `main` and without allocating):
//! `--version`, `-V`, `--help`, `-h` and `help` alone use the system allocator, everything
//! else mimalloc. Every allocation of the process goes to the one allocator chosen, so
//! nothing allocated by one is ever freed by the other.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicIsize, AtomicPtr, AtomicU8, Ordering};

use mimalloc::MiMalloc;

static ARGC: AtomicIsize = AtomicIsize::new(-1);
static ARGV: AtomicPtr<*const c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Run by the C runtime before `main` with the process's arguments (as the standard
/// library captures them on Linux); it only stores the two pointers.
#[used]
#[link_section = ".init_array.00099"]
static CAPTURE_ARGS: extern "C" fn(c_int, *const *const c_char, *const *const c_char) =
    capture_args;

extern "C" fn capture_args(argc: c_int, argv: *const *const c_char, _env: *const *const c_char) {
    ARGC.store(argc as isize, Ordering::Relaxed);
    ARGV.store(argv as *mut *const c_char, Ordering::Relaxed);
}

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The allocator of this process, chosen at the first call and kept.
fn choice() -> u8 {
    match CHOICE.load(Ordering::Relaxed) {
        UNDECIDED => {
            let chosen = decide();
            match CHOICE.compare_exchange(UNDECIDED, chosen, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => chosen,
                Err(first) => first,
            }
        }
        chosen => chosen,
    }
}

/// The system allocator for a process that only prints its version or help; mimalloc for
/// every other (and wherever the arguments were not captured).
fn decide() -> u8 {
    let argc = ARGC.load(Ordering::Relaxed);
    let argv = ARGV.load(Ordering::Relaxed);
    if argc != 2 || argv.is_null() {
        return MIMALLOC;
    }
    // SAFETY: the C runtime passed `argc` valid, NUL-terminated strings in `argv`, which
    // live as long as the process; `argc` is 2, so `argv[1]` is one of them.
    let first = unsafe {
        let arg = *argv.add(1);
        if arg.is_null() {
            return MIMALLOC;
        }
        CStr::from_ptr(arg).to_bytes()
    };
    match first {
        b"--version" | b"-V" | b"--help" | b"-h" | b"help" => SYSTEM,
        _ => MIMALLOC,
    }
}

/// The global allocator: [`choice`]'s, for every call of the process.
pub struct Allocator;

// SAFETY: every call is forwarded unchanged to one allocator, the same one for the whole
// process (`choice` never changes once made), so each block is freed or resized by the
// allocator that made it.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match choice() {
            SYSTEM => unsafe { System.alloc(layout) },
            _ => unsafe { MiMalloc.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match choice() {
            SYSTEM => unsafe { System.alloc_zeroed(layout) },
            _ => unsafe { MiMalloc.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match choice() {
            SYSTEM => unsafe { System.dealloc(ptr, layout) },
            _ => unsafe { MiMalloc.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match choice() {
            SYSTEM => unsafe { System.realloc(ptr, layout, new_size) },
            _ => unsafe { MiMalloc.realloc(ptr, layout, new_size) },
        }
    }
}

unsafe extern "C" {
    fn mi_collect(force: bool);
}

/// Hands the memory this thread's mimalloc heap holds free back to the system, at most
/// once a second per thread: for a worker thread about to sleep (`serve`'s runtime calls
/// it on `on_thread_park`). A block freed by another thread only joins its heap's queue,
/// and the pages it empties go back when this thread next allocates or collects, which an
/// idle worker never does: after a flood of connections `serve` kept up to 1.3× the memory
/// it started with (bench/README.md, "`serve` under a flood").
pub fn release_idle() {
    use std::cell::Cell;
    use std::time::{Duration, Instant};
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    if choice() != MIMALLOC {
        return;
    }
    let now = Instant::now();
    let due = LAST.with(|l| match l.get() {
        Some(t) if now.duration_since(t) < Duration::from_secs(1) => false,
        _ => {
            l.set(Some(now));
            true
        }
    });
    if due {
        // SAFETY: mimalloc is this process's allocator; collecting is always allowed.
        unsafe { mi_collect(false) };
    }
}
