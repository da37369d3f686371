//! A stable 64-bit hash for the consistent-hash ring: FNV-1a over the bytes,
//! then murmur3's `fmix64` finaliser for avalanche. Stable means the same
//! key lands on the same worker across processes, restarts and Rust
//! versions — which std's `RandomState` (seeded per process) and
//! `DefaultHasher` (unspecified across releases) do not promise.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hash of a string.
pub fn str64(text: &str) -> u64 {
    let mut h = FNV_OFFSET;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    fmix64(h)
}

/// The ring position of virtual node `vnode` of a stream whose worker id
/// hashes to `ring_id`: the splitmix64 sequence seeded by `ring_id`, so the
/// points of one worker are independent and uniformly spread.
pub fn vnode(ring_id: u64, vnode: u32) -> u64 {
    fmix64(ring_id.wrapping_add(GOLDEN.wrapping_mul(u64::from(vnode) + 1)))
}

/// The ring key of a task: its routing key, or its id when it has none (so
/// keyless tasks still spread over the ring).
pub fn routing_key(routing_key: &str, task_id: &str) -> u64 {
    if routing_key.is_empty() {
        str64(task_id)
    } else {
        str64(routing_key)
    }
}

/// murmur3's 64-bit finaliser.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_pinned_so_a_change_of_hash_is_a_visible_decision() {
        // Changing these moves every routing key to another worker.
        assert_eq!(str64(""), fmix64(FNV_OFFSET));
        assert_eq!(str64("a"), fmix64(0xaf63_dc4c_8601_ec8c));
        assert_eq!(str64("order-42"), str64("order-42"));
        assert_ne!(str64("order-42"), str64("order-43"));
        assert_ne!(vnode(1, 0), vnode(1, 1));
        assert_eq!(routing_key("", "t1"), str64("t1"));
        assert_eq!(routing_key("k", "t1"), str64("k"));
    }
}
