//! Memory readings from the OS: the process's resident set size now and at its peak, and the
//! machine's total RAM.

/// (current RSS, peak RSS) in bytes, where the OS reports them (Linux `/proc/self/status`).
pub fn rss_bytes() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status.lines().find(|l| l.starts_with(name)).and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|kb| kb * 1024)
        })
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Total RAM in bytes, where the OS reports it (Linux `/proc/meminfo`).
pub fn ram_total_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
