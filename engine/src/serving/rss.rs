//! This process's resident memory, read from `/proc` (the memory figure of CPU runs).

/// This process's (current, peak) resident memory in bytes, from `/proc/self/status` on Linux;
/// `None` elsewhere or when it cannot be read.
pub fn process_rss_bytes() -> Option<(u64, u64)> {
    if cfg!(target_os = "linux") {
        parse_proc_status(&std::fs::read_to_string("/proc/self/status").ok()?)
    } else {
        None
    }
}

/// (VmRSS, VmHWM) in bytes from the text of a `/proc/<pid>/status` file.
pub fn parse_proc_status(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        let mut parts = status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        // The kernel always writes these in kB (KiB).
        match parts.next() {
            Some("kB") | None => value.checked_mul(1024),
            Some(_) => None,
        }
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}
