//! Clock and identifiers, the same on native and wasm.

/// Seconds since the Unix epoch.
pub fn unix_time() -> u64 {
    (now_ms() / 1000.0) as u64
}

#[cfg(not(target_arch = "wasm32"))]
fn now_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

#[cfg(target_arch = "wasm32")]
fn now_ms() -> f64 {
    js_sys::Date::now()
}

/// A seed from the clock and a counter (different for every call).
pub fn clock_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    mix64((now_ms() * 1000.0) as u64 ^ n.wrapping_mul(GOLDEN) ^ pid() << 32)
}

/// splitmix64's increment.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The next splitmix64 value of `state`, as a float in [0, 1) (53 bits).
pub fn splitmix64_f64(state: &mut u64) -> f64 {
    *state = state.wrapping_add(GOLDEN);
    (mix64(*state) >> 11) as f64 / (1u64 << 53) as f64
}

/// A new `chatcmpl-xxxxxxxx` identifier.
pub fn completion_id() -> String {
    format!("chatcmpl-{:08x}", clock_seed() as u32)
}

#[cfg(not(target_arch = "wasm32"))]
fn pid() -> u64 {
    std::process::id() as u64
}

#[cfg(target_arch = "wasm32")]
fn pid() -> u64 {
    0
}
