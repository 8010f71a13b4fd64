//! Ties a gated command's life to fleetcoord's own, so that "CMD is dead
//! before anyone else can be granted" holds also when fleetcoord dies
//! without cleaning up (SIGKILL, the OOM killer, a crash, the exit on a
//! second Ctrl-C): its lease outlives it by up to a TTL, and the command
//! must not — otherwise the next holder's command runs beside it.
//!
//! Two mechanisms, because neither suffices alone:
//! * `PR_SET_PDEATHSIG(SIGKILL)` on the command: the kernel kills it when
//!   its parent dies, with nothing of ours left to run. But only the
//!   command itself, not what it started (a `sh -c` wrapper's children),
//!   and the kernel clears it when CMD execs a set-uid program.
//! * A watchdog process per command, forked before it: it blocks reading a
//!   pipe whose write ends only fleetcoord holds (and the command, until
//!   it execs). When fleetcoord dies, however it dies, the kernel closes
//!   them, the read returns EOF and the watchdog SIGKILLs the command's
//!   process group. A pipe rather than polling `getppid()`: no delay, no
//!   cost while waiting.
//!
//! The command writes its own process group id into the pipe before it
//! execs, so there is no moment at which it runs (and could start
//! children) with the watchdog not knowing whom to kill; and since it
//! holds a write end until then, the watchdog cannot see EOF before that.
//!
//! Linux only (`PR_SET_PDEATHSIG`, `pipe2`, `close_range`); elsewhere
//! [`Tether`] does nothing, as the README says next to the contract.
//!
//! The only unsafe code of the binary: `fork`, `pre_exec` and the raw
//! calls that are all a child of a multi-threaded process may make.

#![allow(unsafe_code)]

#[cfg(target_os = "linux")]
pub use linux::Tether;
#[cfg(not(target_os = "linux"))]
pub use other::Tether;

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// One command's watchdog; see the module docs. Dropped without
    /// [`Tether::disarm`] (an error path that abandons the command), it
    /// closes the pipe, so the watchdog kills the command's group.
    pub struct Tether {
        watchdog: libc::pid_t,
        /// The write end of the watchdog's pipe.
        write: Option<OwnedFd>,
        /// Kill the watchdog before closing `write`: the command is reaped.
        disarmed: bool,
    }

    fn errno() -> i32 {
        // Reads errno, allocates nothing: fine after fork.
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    fn ignoring() -> libc::sigaction {
        // SAFETY: all-zero is a valid sigaction (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = libc::SIG_IGN;
        action
    }

    impl Tether {
        /// Forks the watchdog of the next command.
        pub fn new() -> io::Result<Tether> {
            let mut fds: [RawFd; 2] = [-1; 2];
            // CLOEXEC on both ends: any program this process starts (the
            // command, or anything another thread may spawn) must not keep
            // a write end open, or EOF would never come.
            // SAFETY: `fds` has room for the two descriptors.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: both were just opened and are owned by nobody else.
            let (read, write) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // Prepared before the fork: the watchdog may not allocate.
            // SAFETY: sysconf has no preconditions.
            let open_max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
            let last_fd = RawFd::try_from(open_max.clamp(1024, 65536) - 1).unwrap_or(1023);
            let ignore = ignoring();
            // SAFETY: the child runs only `watchdog`, which makes nothing
            // but async-signal-safe calls and never returns.
            match unsafe { libc::fork() } {
                -1 => Err(io::Error::last_os_error()),
                0 => unsafe { watchdog(read.as_raw_fd(), write.as_raw_fd(), last_fd, &ignore) },
                pid => Ok(Tether {
                    watchdog: pid,
                    write: Some(write),
                    disarmed: false,
                }),
            }
        }

        /// Makes `command` report its process group to the watchdog and
        /// die with this process.
        ///
        /// PDEATHSIG fires when the *thread* that forked the child exits,
        /// not the process: spawn `command` only from a thread that lives
        /// as long as the process. fleetcoord spawns from the main thread.
        pub fn arm(&self, command: &mut Command) {
            debug_assert_eq!(
                std::thread::current().name(),
                Some("main"),
                "the command would die with the thread that spawns it"
            );
            let write = self.write.as_ref().map_or(-1, |w| w.as_raw_fd());
            // SAFETY: getpid has no preconditions.
            let parent = unsafe { libc::getpid() };
            let ignore = ignoring();
            // SAFETY: `in_child` makes only async-signal-safe calls and
            // allocates nothing; `write` stays open until the spawn is over
            // (`self` outlives it).
            unsafe {
                command.pre_exec(move || in_child(write, parent, &ignore));
            }
        }

        /// The command is reaped: stop the watchdog without it acting, as
        /// the group id it holds may be reused from now on.
        pub fn disarm(mut self) {
            self.disarmed = true;
        }
    }

    impl Drop for Tether {
        fn drop(&mut self) {
            if self.disarmed {
                // Dead and reaped before the pipe closes: it never sees EOF.
                // SAFETY: `watchdog` is our unreaped child, so the pid is
                // still ours.
                unsafe { libc::kill(self.watchdog, libc::SIGKILL) };
                reap(self.watchdog);
                drop(self.write.take());
            } else {
                // EOF: the watchdog kills the group and exits.
                drop(self.write.take());
                reap(self.watchdog);
            }
        }
    }

    fn reap(pid: libc::pid_t) {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        while unsafe { libc::waitpid(pid, &mut status, 0) } == -1 && errno() == libc::EINTR {}
    }

    /// In the command's child, between fork and exec.
    fn in_child(write: RawFd, parent: libc::pid_t, ignore: &libc::sigaction) -> io::Result<()> {
        // SAFETY (the whole block): plain system calls on values we own;
        // pointers are to locals that outlive the calls.
        unsafe {
            // Before the getppid check: a parent dying after it is then
            // covered by the signal, one dying before by the check.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // std already did this (`process_group(0)`); again, so that the
            // id reported is our group's whatever order std applies it in.
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let group = libc::getpid().to_ne_bytes();
            // A watchdog that is gone (someone killed it) would make the
            // write raise SIGPIPE and the command look as if it had died
            // running; ignored for the write, it is a spawn error instead.
            // Restored after: an ignored disposition survives exec.
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, ignore, &mut old);
            // At most PIPE_BUF bytes: written whole or not at all.
            let written = loop {
                let n = libc::write(write, group.as_ptr().cast(), group.len());
                if n == -1 && errno() == libc::EINTR {
                    continue;
                }
                break if n == -1 { Err(errno()) } else { Ok(n) };
            };
            libc::sigaction(libc::SIGPIPE, &old, std::ptr::null_mut());
            match written {
                Ok(n) if n == group.len() as isize => {}
                Ok(_) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Err(e) => return Err(io::Error::from_raw_os_error(e)),
            }
            if libc::getppid() != parent {
                // fleetcoord died before PDEATHSIG was set: do not start.
                libc::_exit(1);
            }
        }
        Ok(())
    }

    /// The watchdog's whole life, in a child forked from a multi-threaded
    /// process: async-signal-safe calls only (no allocation, no locks, no
    /// panics), ending in `_exit`.
    unsafe fn watchdog(read: RawFd, write: RawFd, last_fd: RawFd, ignore: &libc::sigaction) -> ! {
        // It must outlive fleetcoord to act: out of fleetcoord's process
        // group (`kill -9 -PGID`, a terminal's Ctrl-C), deaf to the signals
        // that stop fleetcoord cleanly (fleetcoord kills it when done).
        libc::setpgid(0, 0);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::sigaction(signal, ignore, std::ptr::null_mut());
        }
        // Everything inherited but the read end: our copy of the write end
        // would keep EOF away forever, and copies of fleetcoord's sockets
        // would keep connections open that fleetcoord closes. The write end
        // by name too, whatever the fallback's reach.
        libc::close(write);
        close_all_but(read, last_fd);
        let mut group = [0u8; 4];
        let mut got = 0;
        let mut buf = [0u8; 16];
        loop {
            let n = libc::read(read, buf.as_mut_ptr().cast(), buf.len());
            if n > 0 {
                for &byte in buf.iter().take(n.unsigned_abs()) {
                    if let Some(slot) = group.get_mut(got) {
                        *slot = byte;
                        got += 1;
                    }
                }
            } else if n == 0 {
                break;
            } else if errno() != libc::EINTR {
                // Whether fleetcoord lives is unknown: never kill on a guess.
                libc::_exit(1);
            }
        }
        let pgid = libc::pid_t::from_ne_bytes(group);
        // `got` short: the command never started. `pgid` 0 or 1 would mean
        // our own group or every process.
        if got == group.len() && pgid > 1 {
            libc::kill(-pgid, libc::SIGKILL);
        }
        libc::_exit(0)
    }

    unsafe fn close_all_but(keep: RawFd, last_fd: RawFd) {
        let Ok(k) = libc::c_uint::try_from(keep) else {
            return;
        };
        let range = |first: libc::c_uint, last: libc::c_uint| {
            first > last
                || libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) == 0
        };
        let below = k == 0 || range(0, k - 1);
        let above = range(k + 1, libc::c_uint::MAX);
        // close_range needs Linux 5.9; before it, one close per possible fd.
        if !(below && above) {
            for fd in (0..=last_fd).filter(|&fd| fd != keep) {
                libc::close(fd);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use std::io;
    use std::process::Command;

    /// No parent-death signal here: a command outlives a killed fleetcoord
    /// (README).
    pub struct Tether;

    impl Tether {
        pub fn new() -> io::Result<Tether> {
            Ok(Tether)
        }

        pub fn arm(&self, _command: &mut Command) {}

        pub fn disarm(self) {}
    }
}
