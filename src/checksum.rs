//! FNV-1a hashes: the NVRTC cache key and the checksum a bundle ends with.

/// FNV-1a's offset basis, 64 bit.
pub const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's prime, 64 bit.
pub const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a, 64 bit, a byte at a time: the NVRTC cache key.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_BASIS, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// FNV-1a's step over 8-byte little-endian words in four interleaved lanes, the lanes and the
/// length folded at the end: a byte at a time, a bundle's hundreds of MB of weights took
/// most of a second. Each step is a bijection of the lane's state, so changing any one word
/// changes the result.
pub fn words_checksum(bytes: &[u8]) -> u64 {
    let mut lanes = [FNV_BASIS, FNV_BASIS ^ 1, FNV_BASIS ^ 2, FNV_BASIS ^ 3];
    let mut chunks = bytes.chunks_exact(32);
    for chunk in &mut chunks {
        for (lane, word) in lanes.iter_mut().zip(chunk.chunks_exact(8)) {
            *lane = (*lane ^ u64::from_le_bytes(word.try_into().unwrap_or_default())).wrapping_mul(FNV_PRIME);
        }
    }
    let tail = chunks.remainder().iter().fold(lanes[0], |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
    lanes[0] = tail;
    let h = lanes.iter().fold(FNV_BASIS, |h, &l| (h ^ l).wrapping_mul(FNV_PRIME));
    (h ^ bytes.len() as u64).wrapping_mul(FNV_PRIME)
}
