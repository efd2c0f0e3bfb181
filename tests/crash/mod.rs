//! A report of where a crash happened, for the GPU machine (which has no debugger): on SIGSEGV,
//! SIGBUS or SIGABRT the faulting thread writes to stderr the signal, the fault address, its
//! registers, 2,048 words of its stack (code addresses among them are its callers) and the
//! process's memory map, then dies of the same signal. Only async-signal-safe calls are made
//! (write, open, read, process_vm_readv). `scripts/crash_report.py` turns the report into
//! library + offset lines, symbolized where the unstripped test binary is at hand.

use std::sync::Once;

/// Installs the handler once per process (every GPU test calls this first).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for signal in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
            // SAFETY: a plain sigaction with a handler that only makes async-signal-safe calls.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fault as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

fn put(bytes: &[u8]) {
    // SAFETY: write(2) of a valid buffer.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

fn put_hex(value: u64) {
    let mut buf = [0u8; 17];
    for (i, slot) in buf[..16].iter_mut().enumerate() {
        let nibble = (value >> (60 - 4 * i)) & 0xf;
        *slot = b"0123456789abcdef"[nibble as usize];
    }
    buf[16] = b' ';
    put(&buf);
}

extern "C" fn on_fault(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; the
    // stack is read through process_vm_readv, which fails instead of faulting.
    unsafe {
        let gregs = &(*(context as *mut libc::ucontext_t)).uc_mcontext.gregs;
        let reg = |r: libc::c_int| gregs[r as usize] as u64;
        put(b"\n=== FUSEC CRASH REPORT\nsignal ");
        put_hex(signal as u64);
        put(b"fault-address ");
        put_hex((*info).si_addr() as u64);
        put(b"tid ");
        put_hex(libc::syscall(libc::SYS_gettid) as u64);
        put(b"\nrip ");
        put_hex(reg(libc::REG_RIP));
        put(b"rsp ");
        let rsp = reg(libc::REG_RSP);
        put_hex(rsp);
        put(b"rbp ");
        put_hex(reg(libc::REG_RBP));
        put(b"\nstack\n");
        // 64 words at a time (the signal stack is small), up to 2,048, until a read fails
        // where the stack ends.
        let mut chunk = [0u64; 64];
        for k in 0..32u64 {
            let local = libc::iovec { iov_base: chunk.as_mut_ptr().cast(), iov_len: 512 };
            let remote = libc::iovec { iov_base: (rsp + 512 * k) as *mut libc::c_void, iov_len: 512 };
            if libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) != 512 {
                break;
            }
            for (i, word) in chunk.iter().enumerate() {
                put_hex(*word);
                if i % 8 == 7 {
                    put(b"\n");
                }
            }
        }
        put(b"\nmaps\n");
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
        if fd >= 0 {
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                put(&buf[..n as usize]);
            }
            libc::close(fd);
        }
        put(b"=== END FUSEC CRASH REPORT\n");
        // SA_RESETHAND restored the default action: the same signal now ends the process.
        libc::raise(signal);
    }
}
