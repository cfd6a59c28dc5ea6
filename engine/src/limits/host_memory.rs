//! What the host has: memory figures from `/proc/meminfo`, capped by the
//! process's cgroup and address-space limit, the default memory limit of a
//! query and of its spill files, the size syntax of `--memory-limit`, and
//! handing freed memory back to the host between queries.

/// A `/proc/meminfo` figure (`MemTotal`, `MemAvailable`, ...) in bytes; `None`
/// where the file or the key is missing (not Linux).
pub fn meminfo_bytes(key: &str) -> Option<usize> {
    kb_figure("/proc/meminfo", key)
}

/// A `KEY: N kB` line of a `/proc` file (`/proc/meminfo`,
/// `/proc/self/status`) in bytes; `None` where the file or the key is missing.
fn kb_figure(file: &str, key: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<usize>().ok())
        .map(|kb| kb * 1024)
}

/// The process's peak resident memory since it started or since the last
/// [`reset_peak_rss`] (`VmHWM` of `/proc/self/status`); `None` off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    kb_figure("/proc/self/status", "VmHWM").map(|b| b as u64)
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

/// The memory this process may use in all: the host's `MemTotal`, or less
/// where its cgroup caps it (v2 `memory.max`, v1 `memory.limit_in_bytes`, on
/// the process's group and those above it) or `RLIMIT_AS` leaves less address
/// space than that. `None` where none is known (not Linux).
pub fn memory_total() -> Option<usize> {
    let cgroup = cgroup_limits().map(|(limit, _)| limit);
    [meminfo_bytes("MemTotal"), cgroup, address_space_left()]
        .into_iter()
        .flatten()
        .min()
}

/// The memory this process may still take: `MemAvailable`, or less where its
/// cgroup's limit less its usage, or the address space left, is less.
pub fn memory_available() -> Option<usize> {
    let cgroup = cgroup_limits().map(|(limit, used)| limit.saturating_sub(used));
    [meminfo_bytes("MemAvailable"), cgroup, address_space_left()]
        .into_iter()
        .flatten()
        .min()
}

/// The tightest memory limit of the process's cgroup and its ancestors, with
/// that group's usage: `(limit, used)` in bytes, `None` without a limit.
fn cgroup_limits() -> Option<(usize, usize)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut tightest: Option<(usize, usize)> = None;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (root, limit_file, usage_file) = match controllers {
            "" => ("/sys/fs/cgroup", "memory.max", "memory.current"),
            c if c.split(',').any(|c| c == "memory") => (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ),
            _ => continue,
        };
        let mut dir = std::path::PathBuf::from(root).join(path.trim_start_matches('/'));
        while dir.starts_with(root) {
            let read = |file: &str| -> Option<usize> {
                std::fs::read_to_string(dir.join(file))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            // "max" (v2) does not parse; v1 writes "no limit" as a huge number.
            if let Some(limit) = read(limit_file).filter(|l| *l < 1 << 60) {
                let used = read(usage_file).unwrap_or(0);
                if tightest.is_none_or(|(t, _)| limit < t) {
                    tightest = Some((limit, used));
                }
            }
            if !dir.pop() {
                break;
            }
        }
    }
    tightest
}

/// Address space left under `RLIMIT_AS` (`ulimit -v`, `prlimit --as`): the
/// limit less the process's virtual size now; `None` without a limit.
fn address_space_left() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct it is given.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
        if !ok || limit.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        let virtual_bytes = kb_figure("/proc/self/status", "VmSize")?;
        Some((limit.rlim_cur as usize).saturating_sub(virtual_bytes))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The memory DataFusion's operators may hold in one query when the user sets no
/// `--memory-limit`: half of what the process may use ([`memory_total`]: the
/// host's memory, or its cgroup's or address-space limit; the other half is
/// left to the model, its KV cache and the input tables), 4 GiB where that is
/// unknown.
pub fn default_memory_limit() -> usize {
    memory_total().map_or(4 << 30, |total| total / 2)
}

/// The most a query's operators may spill to disk (sorts, aggregates and
/// joins past the memory limit write temporary files): half of the space
/// free now in the temporary folder, so a query past it fails with
/// DataFusion's error instead of filling the disk (a nested-loop join chain
/// once wrote 60 GB of spill until the disk was full). 16 GiB where the free
/// space is unknown.
pub fn default_spill_limit() -> u64 {
    free_disk_bytes(&std::env::temp_dir()).map_or(16 << 30, |free| free / 2)
}

/// Bytes free to an unprivileged writer on the file system holding `path`.
fn free_disk_bytes(path: &std::path::Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs reads a NUL-terminated path and writes one struct.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } == 0;
        ok.then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
    }
    #[cfg(not(unix))]
    None
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

    /// The process's figures never exceed the host's, and a default spill
    /// limit leaves half of the free disk.
    #[test]
    fn cgroup_and_address_space_caps_only_lower_the_figures() {
        if let (Some(host), Some(total)) = (meminfo_bytes("MemTotal"), memory_total()) {
            assert!(total <= host);
            assert!(default_memory_limit() <= host / 2);
        }
        if let (Some(host), Some(available)) = (meminfo_bytes("MemAvailable"), memory_available()) {
            assert!(available <= host);
        }
        let free = free_disk_bytes(&std::env::temp_dir()).unwrap();
        assert!(free > 0);
        assert!(default_spill_limit() <= free / 2 + (64 << 20));
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
