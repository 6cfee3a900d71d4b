//! Process and host figures read from the OS: CPU seconds, RSS, open fds and their
//! limit, the memory limit (cgroup v2/v1, else physical memory) and the core count.

/// One reading of the process's resource use: the admin API's type (`overview.process`).
pub use im_admin_api::ProcessStats;

/// Reads the current figures (zeros where the OS does not tell).
pub fn read() -> ProcessStats {
    let page = page_size();
    let (cpu_seconds, rss_bytes) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the ")" of the command name: state is field 3.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = clock_ticks();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            let rss_pages: u64 = f.get(21)?.parse().ok()?;
            Some(((utime + stime) / ticks, rss_pages * page))
        })
        .unwrap_or((0.0, 0));
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let (memory_limit_bytes, memory_limit_source) = match cgroup_memory_limit() {
        Some(l) => (l, "cgroup"),
        None => (physical_memory(), "physical"),
    };
    ProcessStats {
        cpu_seconds,
        rss_bytes,
        open_fds,
        max_fds: max_fds(),
        memory_limit_bytes,
        memory_limit_source: memory_limit_source.to_owned(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
    }
}

/// The resident set split by what backs it, bytes, from `/proc/self/status`: anonymous
/// pages (the heaps, the stacks) and file-backed ones (the binary's own pages, mapped
/// files, shared memory); `None` where the OS does not tell.
pub fn rss_parts() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse().ok()
    };
    let anon = kib("RssAnon:")?;
    let file = kib("RssFile:")? + kib("RssShmem:").unwrap_or(0);
    Some((anon * 1024, file * 1024))
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 {
        n as f64
    } else {
        100.0
    }
}

/// Raises the RLIMIT_NOFILE soft limit to the hard limit (every connection is a file
/// descriptor; the usual soft default of 1024 is far too low for a server). Returns
/// `(before, after)`, or `None` when the limits cannot be read or set.
pub fn raise_fd_limit() -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    let before = r.rlim_cur;
    if r.rlim_cur < r.rlim_max {
        r.rlim_cur = r.rlim_max;
        // SAFETY: setrlimit reads the struct we pass; raising soft to hard needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
            return None;
        }
    }
    Some((before, r.rlim_cur))
}

/// The RLIMIT_NOFILE soft limit.
pub fn max_fds() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        0
    }
}

fn cgroup_memory_limit() -> Option<u64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    let v1 = || std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes").ok();
    let text = v2.or_else(v1)?;
    let n: u64 = text.trim().parse().ok()?;
    // v1 reports "unlimited" as a huge number.
    (n < (1 << 60) && n < physical_memory().max(1)).then_some(n)
}

fn physical_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// Free (for an unprivileged writer) and total bytes of the file system holding `dir`
/// (`statvfs`); `None` when it cannot be read.
pub fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a zeroed out-struct of the right type.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let p = super::read();
        assert!(p.rss_bytes > 0);
        assert!(p.open_fds > 0);
        assert!(p.max_fds >= p.open_fds);
        assert!(p.memory_limit_bytes > p.rss_bytes);
        assert!(p.cores >= 1);
        let (anon, file) = super::rss_parts().expect("RssAnon and RssFile");
        assert!(anon > 0 && file > 0, "anon {anon}, file {file}");
    }
}
