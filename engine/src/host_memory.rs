//! What the host has: memory figures from `/proc/meminfo`, the default memory
//! limit of a query, the size syntax of `--memory-limit`, and handing freed
//! memory back to the host between queries.

/// A `/proc/meminfo` figure (`MemTotal`, `MemAvailable`, ...) in bytes; `None`
/// where the file or the key is missing (not Linux).
pub fn meminfo_bytes(key: &str) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<usize>().ok())
        .map(|kb| kb * 1024)
}

/// The process's peak resident memory since it started or since the last
/// [`reset_peak_rss`] (`VmHWM` of `/proc/self/status`); `None` off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Starts a new peak for [`peak_rss_bytes`] at the current resident memory
/// (Linux's `clear_refs` code 5); false where the kernel does not allow it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Hands the memory the allocator keeps after frees back to the host
/// (glibc's `malloc_trim`). glibc keeps freed chunks in its arenas: after
/// the FEV queries at sf 1.0 a benchmark process held 10.2 GB resident while
/// its allocations were 2.9 GB (`malloc_info`: 7.5 GB of free chunks), and
/// every later query's peak started from there; a trim took it to 3.3 GB in
/// 3 s. Elsewhere a no-op.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and shrinks the allocator's own arenas; it
    // takes their locks, so it is safe beside other threads' allocations.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The memory DataFusion's operators may hold in one query when the user sets no
/// `--memory-limit`: half of the host's memory (the other half is left to the
/// model, its KV cache and the input tables), 4 GiB where that is unknown.
pub fn default_memory_limit() -> usize {
    meminfo_bytes("MemTotal").map_or(4 << 30, |total| total / 2)
}

/// Parses a size: bytes, or a number with a unit `K`, `M`, `G`, `T` (powers of
/// 1024; `KB`/`KiB` and lower case are the same), e.g. `512M`, `1.5G`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 512M, 8G or 1073741824)"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown size unit {other:?} (use K, M, G or T)"
            ));
        }
    };
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= usize::MAX as f64 {
        return Err(format!("{text:?}: a size must be at least one byte"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_bad_ones_are_named() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("2 GiB").unwrap(), 2 << 30);
        for bad in ["", "G", "-1G", "0", "12Q", "1e400"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn meminfo_reads_the_total_on_linux() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(meminfo_bytes("MemTotal").unwrap() > 1 << 20);
            assert!(default_memory_limit() > 1 << 19);
        }
        assert_eq!(meminfo_bytes("NoSuchKey"), None);
    }

    #[test]
    fn the_peak_grows_with_memory_touched_and_starts_again_when_reset() {
        if peak_rss_bytes().is_none() || !reset_peak_rss() {
            return; // not Linux, or a kernel that refuses clear_refs
        }
        let before = peak_rss_bytes().unwrap();
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let touched = peak_rss_bytes().unwrap();
        assert!(touched >= before + (48 << 20), "{before} -> {touched}");
        drop(block);
        assert!(reset_peak_rss());
        assert!(
            peak_rss_bytes().unwrap() < touched,
            "the reset starts a new peak"
        );
    }
}
