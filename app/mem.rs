//! Process memory readings from the OS: resident set size now and at its peak.

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
