//! The container's memory limit, read from its cgroup (v2 `memory.max`, else v1
//! `memory.limit_in_bytes`). Reads two files; no other I/O.
//!
//! Owns: finding and parsing the cgroup files. A leaf (read by `metrics`, `live` and
//! `server`): must not import any other module of the node.

/// cgroup v2: the limit of this process's cgroup ("max" without one).
const V2_MEMORY_MAX: &str = "/sys/fs/cgroup/memory.max";
/// cgroup v1: the limit of the memory controller (a huge number without one).
const V1_LIMIT_IN_BYTES: &str = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
/// A v1 limit at or above this means "no limit" (the kernel reports about 2^63 rounded
/// down to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory limit of the container this process runs in, if it has one.
pub fn memory_limit_bytes() -> Option<u64> {
    match std::fs::read_to_string(V2_MEMORY_MAX) {
        Ok(text) => parse_v2(&text),
        Err(_) => std::fs::read_to_string(V1_LIMIT_IN_BYTES)
            .ok()
            .and_then(|text| parse_v1(&text)),
    }
}

fn parse_v2(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

fn parse_v1(text: &str) -> Option<u64> {
    text.trim()
        .parse()
        .ok()
        .filter(|&limit| limit < V1_UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_and_no_limit_is_none() {
        assert_eq!(parse_v2("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_v2("max\n"), None);
        assert_eq!(parse_v2(""), None);
        assert_eq!(parse_v1("536870912\n"), Some(512 << 20));
        assert_eq!(parse_v1("9223372036854771712\n"), None);
    }
}
