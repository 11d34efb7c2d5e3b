//! What counting each record as the next request carries it costs the tally: folding a
//! generated session record by record with the stored size (`Tally::observe`) and with
//! the carried size (`view::budget::carried_bytes`, then `Tally::observe_sized`), which
//! parses only attachments and records too large to stay whole.
//!
//! ```text
//! cargo bench -p ctxd-core --bench tally
//! ```

#![allow(clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken workload

use std::time::{Duration, Instant};

use ctxd_core::record::Record;
use ctxd_core::tally::Tally;
use ctxd_core::view::BudgetConfig;
use ctxd_core::view::budget::carried_bytes;
use ctxd_gen::Options;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    const ROUNDS: usize = 31;
    let config = BudgetConfig::default();
    for seed in [2u64, 4] {
        let text = ctxd_gen::jsonl(&Options { seed, ..Options::turns(80) });
        let records: Vec<Record> =
            text.lines().filter(|l| !l.is_empty()).map(|l| Record::parse(l).expect("record")).collect();
        let (mut stored, mut carried) = (Vec::new(), Vec::new());
        let (mut stored_total, mut carried_total) = (0, 0);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let mut tally = Tally::default();
            for record in &records {
                tally.observe(record);
            }
            stored.push(started.elapsed());
            stored_total = std::hint::black_box(tally.total());
            let started = Instant::now();
            let mut tally = Tally::default();
            for record in &records {
                tally.observe_sized(record, carried_bytes(record, &config));
            }
            carried.push(started.elapsed());
            carried_total = std::hint::black_box(tally.total());
        }
        let (stored, carried) = (median(stored), median(carried));
        let per = |d: Duration| d.as_nanos() as f64 / records.len() as f64;
        println!(
            "seed {seed}: {} records, {:.1} MB; stored size {:?} ({:.0} ns/record), carried size {:?} ({:.0} ns/record), \
             ratio {:.2}; tally {stored_total} vs {carried_total} tokens",
            records.len(),
            text.len() as f64 / 1e6,
            stored,
            per(stored),
            carried,
            per(carried),
            carried.as_secs_f64() / stored.as_secs_f64(),
        );
    }
}
