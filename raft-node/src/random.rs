//! Random bytes for token secrets and request-id nonces: the operating system's
//! generator, or the simulator's seeded one under madsim, so that a simulated run with
//! tokens repeats exactly from its seed.

/// `N` random bytes.
#[cfg(not(madsim))]
pub fn random_bytes<const N: usize>() -> [u8; N] {
    rand::random()
}

/// `N` random bytes from the simulation's seeded generator.
#[cfg(madsim)]
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use madsim::rand::RngCore;
    let mut bytes = [0u8; N];
    madsim::rand::thread_rng().fill_bytes(&mut bytes);
    bytes
}
