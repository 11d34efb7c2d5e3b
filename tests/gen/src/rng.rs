//! A small seeded random number generator (SplitMix64). Defined here rather than taken
//! from a crate so that a seed gives the same session bytes on every machine and after
//! every dependency update: the generated sessions are test data.

/// SplitMix64: a 64-bit state advanced by a fixed odd constant, each output mixed.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi - lo + 1;
        // Rejection keeps the draw unbiased for spans that do not divide 2^64.
        let zone = u64::MAX - u64::MAX % span;
        loop {
            let x = self.next_u64();
            if x < zone {
                return lo + x % span;
            }
        }
    }

    /// Uniform in `lo..=hi` as a `usize`.
    pub fn count(&mut self, lo: usize, hi: usize) -> usize {
        self.between(lo as u64, hi as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.count(0, items.len() - 1)]
    }

    /// A standard normal draw (Box–Muller, one of the pair).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]: the logarithm is finite
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// A log-normal draw: `exp(mu + sigma * N(0, 1))`.
    pub fn log_normal(&mut self, mu: f64, sigma: f64) -> f64 {
        (mu + sigma * self.normal()).exp()
    }

    /// A version 4 UUID in its usual text form.
    pub fn uuid(&mut self) -> String {
        let hi = (self.next_u64() & !0xF000) | 0x4000; // version 4
        let lo = (self.next_u64() & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            hi >> 32,
            (hi >> 16) & 0xFFFF,
            hi & 0xFFFF,
            lo >> 48,
            lo & 0xFFFF_FFFF_FFFF
        )
    }

    /// `n` lowercase hex digits (ids such as `msg_…`, `req_…`, `toolu_…`).
    pub fn hex(&mut self, n: usize) -> String {
        let mut out = String::with_capacity(n + 16);
        while out.len() < n {
            out.push_str(&format!("{:016x}", self.next_u64()));
        }
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(9);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(9);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(9).next_u64(), Rng::new(10).next_u64());
    }

    #[test]
    fn draws_stay_in_their_ranges() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let x = r.between(3, 7);
            assert!((3..=7).contains(&x));
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        // Every value of a small range comes up.
        let mut seen = [false; 5];
        for _ in 0..1_000 {
            seen[r.count(0, 4)] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn uuids_have_the_version_4_layout() {
        let mut r = Rng::new(2);
        for _ in 0..100 {
            let id = r.uuid();
            let parts: Vec<&str> = id.split('-').collect();
            assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12], "{id}");
            assert!(parts[2].starts_with('4'), "{id}");
            assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{id}");
        }
    }

    #[test]
    fn log_normal_median_is_exp_mu() {
        let mut r = Rng::new(3);
        let mut xs: Vec<f64> = (0..20_001).map(|_| r.log_normal(7.6, 1.3)).collect();
        xs.sort_by(f64::total_cmp);
        let median = xs[xs.len() / 2];
        let want = 7.6f64.exp();
        assert!((median / want - 1.0).abs() < 0.1, "{median} vs {want}");
    }
}
